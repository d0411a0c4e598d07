"""Soft Actor-Critic with a cost critic and an optional Lagrangian cost constraint.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications" (2018): twin (ensemble) critics with
clipped double-Q targets, a tanh-Gaussian actor, and an automatically tuned entropy temperature.
A second critic ensemble learns the discounted cost ``Q_c`` from the ``cost`` channel (pessimistic:
its target takes the ensemble maximum). With a :class:`~arl_models.lagrange.PIDLagrangian`
attached, the actor minimises ``-Q + lambda * Q_c``; whoever measures the cost (the offline
stage from ``Q_c``, the online stage from episodes) updates the multiplier.

CQL (``cql.py``) is this algorithm plus a conservative term in the critic loss.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from arl_models.lagrange import PIDConfig, PIDLagrangian
from arl_models.nets import (
    CONTEXT_LR_SCALE,
    EnsembleCritic,
    TanhGaussianActor,
    adam,
    copy_matching,
    network_adam,
    soft_update,
)
from arl_models.replay import Batch


@dataclass(frozen=True)
class SACConfig:
    seed: int = 0
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of actor and critics."""
    context_dim: int = 0
    """The last ``context_dim`` observation entries are a context (the ``2.x`` versions' observed plant:
    3) that FiLM-modulates the input of every layer of actor and critics (``nets.py``); 0: none."""
    context_lr_scale: float = CONTEXT_LR_SCALE
    """The FiLM weights' learning rate as a multiple of their network's (they start at zero, and Adam moves
    a weight about one learning rate a step); no effect without FiLM."""
    n_critics: int = 2
    """Critic ensemble size; targets take the ensemble minimum."""
    critic_layer_norm: bool = False
    """LayerNorm after every hidden layer of the reward critic (Ba et al. 2016), as ReBRAC's critics have:
    a warm start from ReBRAC carries it over."""
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temp_lr: float = 3e-4
    init_temperature: float = 1.0
    target_entropy: float | None = None
    """Entropy target; ``None`` means ``-action_dim``."""
    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target networks."""
    batch_size: int = 256
    learn_cost: bool = True
    """Learn a cost critic from the ``cost`` column."""
    cost_q_limit: float | None = None
    """Constraint on ``Q_c(s, pi(s))``; ``None`` leaves the actor unconstrained."""
    pid: PIDConfig = PIDConfig()


@dataclass(frozen=True)
class SACLosses:
    critic: torch.Tensor
    actor: torch.Tensor
    temperature: torch.Tensor
    cost_critic: torch.Tensor | None


class SAC:
    name = "sac"
    config_cls: type = SACConfig

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, device: str | torch.device = "cpu"):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        self.target_entropy = cfg.target_entropy if cfg.target_entropy is not None else -float(act_dim)
        self.actor = TanhGaussianActor(obs_dim, act_dim, cfg.hidden, cfg.context_dim).to(self.device)
        self.critic = EnsembleCritic(
            obs_dim, act_dim, cfg.hidden, cfg.n_critics, cfg.context_dim, layer_norm=cfg.critic_layer_norm
        ).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_temp = nn.Parameter(torch.tensor(math.log(cfg.init_temperature), device=self.device))
        self.actor_opt = network_adam(self.actor, cfg.actor_lr, cfg.context_lr_scale)
        self.critic_opt = network_adam(self.critic, cfg.critic_lr, cfg.context_lr_scale)
        self.temp_opt = adam([self.log_temp], lr=cfg.temp_lr)
        self.cost_critic: EnsembleCritic | None = None
        if cfg.learn_cost:
            self.cost_critic = EnsembleCritic(
                obs_dim, act_dim, cfg.hidden, cfg.n_critics, cfg.context_dim
            ).to(self.device)
            self.cost_critic_target = copy.deepcopy(self.cost_critic).requires_grad_(False)
            self.cost_opt = network_adam(self.cost_critic, cfg.critic_lr, cfg.context_lr_scale)
        self.lagrangian = PIDLagrangian(cfg.pid)
        self.constraint_obs: torch.Tensor | None = None
        self.td_error: torch.Tensor | None = None
        """Per-sample ``|TD error|`` of the last update's reward critics, mean over the ensemble ``(B,)``."""
        self.step = 0

    # ---- parts that subclasses extend -------------------------------------------------------------
    def networks(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }
        if self.cost_critic is not None:
            nets |= {"cost_critic": self.cost_critic, "cost_critic_target": self.cost_critic_target}
        return nets

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        opts: dict[str, torch.optim.Optimizer] = {
            "actor": self.actor_opt,
            "critic": self.critic_opt,
            "temp": self.temp_opt,
        }
        if self.cost_critic is not None:
            opts["cost_critic"] = self.cost_opt
        return opts

    def parameters(self) -> dict[str, nn.Parameter]:
        """Free-standing scalar parameters (not inside a module)."""
        return {"log_temp": self.log_temp}

    def warm_start_actor(self, actor_state: dict[str, torch.Tensor]) -> list[str]:
        """Start the actor from a BC actor's matching weights (trunk and mean head); returns the keys
        copied (``warm_start.actor_from``)."""
        return copy_matching(self.actor, actor_state)

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temp.exp().detach()

    def critic_loss(
        self,
        batch: Batch,
        next_act: torch.Tensor,
        next_logp: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():
            target = self.td_target(batch, next_act, next_logp)
        q = self.critic(batch.obs, batch.act)  # (E, B)
        loss = td_loss(q, target, weights)
        self.td_error = (q.detach() - target).abs().mean(0)
        return loss, {"loss_critic": loss.item(), "q_data": q.mean().item()}

    # ---- shared mathematics ----------------------------------------------------------------------
    def td_target(self, batch: Batch, next_act: torch.Tensor, next_logp: torch.Tensor) -> torch.Tensor:
        q_next = self.critic_target(batch.next_obs, next_act).min(0).values  # (B,)
        soft = q_next - self.temperature * next_logp
        return batch.rew + self.cfg.gamma * (1.0 - batch.done) * soft

    def cost_critic_loss(
        self, batch: Batch, next_act: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        assert self.cost_critic is not None
        with torch.no_grad():
            # A cost is a non-negative penalty, so is its value: floored, an actor that minimises Q_c
            # cannot drag the bootstrapped values below zero.
            qc_next = self.cost_critic_target(batch.next_obs, next_act).max(0).values.clamp(min=0.0)
            target = batch.cost + self.cfg.gamma * (1.0 - batch.done) * qc_next
        return td_loss(self.cost_critic(batch.obs, batch.act), target, weights)

    def actor_loss(
        self, obs: torch.Tensor, data_act: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(loss, log_prob, Q_c(s, pi(s)))``; critics are frozen so only the actor gets gradients.
        ``data_act``, the batch's own actions, is for subclasses that imitate them (CQL's warm-up)."""
        act, logp = self.actor.sample(obs)
        with _frozen(self.critic):
            q = self.critic(obs, act).min(0).values
        loss = self.temperature * logp - q
        qc = None
        if self.cost_critic is not None:
            with _frozen(self.cost_critic):
                qc = self.cost_critic(obs, act).mean(0)
            if self.cfg.cost_q_limit is not None:
                loss = loss + self.lagrangian.value * qc
        return loss.mean(), logp, qc

    def constrained_cost_value(self, qc_batch: torch.Tensor) -> float:
        """The quantity held to ``cost_q_limit``: ``Q_c(s0, pi(s0))`` over ``constraint_obs`` (the
        dataset's episode starts: the expected discounted episode cost) when set, else the batch mean."""
        if self.constraint_obs is None:
            return qc_batch.mean().item()
        assert self.cost_critic is not None
        idx = torch.randint(0, self.constraint_obs.shape[0], (min(256, self.constraint_obs.shape[0]),))
        s0 = self.constraint_obs.index_select(0, idx)
        with torch.no_grad():
            return self.cost_critic(s0, self.actor.sample(s0)[0]).mean().item()

    def update(self, batch: Batch, weights: torch.Tensor | None = None) -> dict[str, float]:
        """One gradient step of every part; returns its metrics.

        ``weights`` ``(B,)`` (importance-sampling weights of a prioritised replay) weight each sample's
        TD loss in the reward and cost critics; afterwards :attr:`td_error` holds the per-sample errors.
        """
        with torch.no_grad():
            next_act, next_logp = self.actor.sample(batch.next_obs)
        critic_loss, metrics = self.critic_loss(batch, next_act, next_logp, weights)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        actor_loss, logp, qc = self.actor_loss(batch.obs, batch.act)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()

        temp_loss = -(self.log_temp.exp() * (logp.detach() + self.target_entropy)).mean()
        self.temp_opt.zero_grad(set_to_none=True)
        temp_loss.backward()
        self.temp_opt.step()

        if self.cost_critic is not None:
            cost_loss = self.cost_critic_loss(batch, next_act, weights)
            self.cost_opt.zero_grad(set_to_none=True)
            cost_loss.backward()
            self.cost_opt.step()
            metrics |= {
                "loss_cost_critic": cost_loss.item(),
                "qc_policy": qc.mean().item() if qc is not None else 0.0,
            }
            if self.cfg.cost_q_limit is not None and qc is not None:
                measured = self.constrained_cost_value(qc)
                self.lagrangian.update(measured, self.cfg.cost_q_limit)
                metrics |= {"lagrange_multiplier": self.lagrangian.value, "qc_constrained": measured}
            soft_update(self.cost_critic_target, self.cost_critic, self.cfg.tau)

        soft_update(self.critic_target, self.critic, self.cfg.tau)
        self.step += 1
        metrics |= {
            "loss_actor": actor_loss.item(),
            "loss_temperature": temp_loss.item(),
            "temperature": self.temperature.item(),
            "entropy": -logp.mean().item(),
        }
        return metrics

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """Actions in [-1, 1] for a batch of observations ``(B, O)``."""
        o = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.actor.act(o, deterministic).cpu().numpy()

    def extra_state(self) -> dict[str, float]:
        return {"step": self.step, **{f"lagrangian.{k}": v for k, v in self.lagrangian.state().items()}}

    def load_extra_state(self, s: dict[str, float]) -> None:
        self.step = int(s["step"])
        self.lagrangian.load_state(
            {k.split(".", 1)[1]: v for k, v in s.items() if k.startswith("lagrangian.")}
        )


def td_loss(q: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Squared TD error of an ensemble ``q`` ``(E, B)`` against ``target`` ``(B,)``: the batch mean per
    critic (weighted per sample by ``weights`` when given), summed over critics."""
    sq = (q - target).pow(2)
    if weights is not None:
        sq = sq * weights
    return sq.mean(1).sum()


class _frozen:
    """Context manager: a module's parameters take no gradient inside the block."""

    def __init__(self, module: nn.Module):
        self.params = [p for p in module.parameters() if p.requires_grad]

    def __enter__(self) -> None:
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc: object) -> None:
        for p in self.params:
            p.requires_grad_(True)
