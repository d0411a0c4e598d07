"""Implicit Q-Learning, plus a cost critic and constraint.

Kostrikov, Nair and Levine, "Offline Reinforcement Learning with Implicit Q-Learning" (ICLR 2022).
Every target is in-sample: ``V(s)`` is an upper expectile (``expectile``) of ``Q(s, a)`` over the data's
actions, ``Q`` regresses ``r + gamma V(s')``, and the actor is extracted by advantage-weighted regression,
the data's actions weighted by ``exp(beta (Q(s, a) - V(s)))`` (clipped at ``max_weight``), so no action
outside the data is ever evaluated while learning.

The cost side is in-sample too: ``V_c`` is the ``cost_expectile`` of ``Q_c(s, a)`` (0.5: the mean, the
behaviour's own cost-to-go), ``Q_c`` regresses ``c + gamma V_c(s')``, and with ``cost_q_limit`` set the
weights become ``exp(beta (A - nu A_c))``, ``nu`` the PID multiplier holding ``Q_c(s0, pi(s0))`` over the
episode starts to the limit (``constrained.py``). The actor's likelihood is BC's clipped Gaussian, so
actions logged at the bounds weigh as censored observations.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from arl_models.algos.bc import clipped_gaussian_log_prob
from arl_models.algos.constrained import (
    ActorCriticConfig,
    CostSide,
    OfflineActorCritic,
)
from arl_models.algos.sac import td_loss
from arl_models.nets import EnsembleCritic, TanhGaussianActor, copy_matching, network_adam, soft_update
from arl_models.replay import Batch


@dataclass(frozen=True)
class IQLConfig(ActorCriticConfig):
    value_lr: float = 3e-4
    expectile: float = 0.7
    """The expectile of ``Q`` over the data's actions that ``V`` learns (the paper's locomotion 0.7)."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights (the paper's locomotion 3)."""
    max_weight: float = 100.0
    cost_expectile: float = 0.5
    """The expectile of ``Q_c`` that ``V_c`` learns; 0.5, the behaviour's mean cost-to-go."""


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """``mean |tau - 1(diff < 0)| diff^2``: the asymmetric squared loss whose minimiser is the expectile."""
    weight = torch.where(diff < 0, 1.0 - tau, tau)
    return (weight * diff.pow(2)).mean()


def value_net(obs_dim: int, cfg: IQLConfig, device: torch.device) -> EnsembleCritic:
    """``V(s)``: a one-member critic ensemble over the observation alone (no action columns)."""
    return EnsembleCritic(obs_dim, 0, cfg.hidden, 1, cfg.context_dim).to(device)


def state_value(v: EnsembleCritic, obs: torch.Tensor) -> torch.Tensor:
    return v(obs, obs[:, :0])[0]  # (B,)


class IQL(OfflineActorCritic):
    name = "iql"
    config_cls = IQLConfig

    def __init__(self, obs_dim: int, act_dim: int, cfg: IQLConfig, device: str | torch.device = "cpu"):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        self.actor = TanhGaussianActor(obs_dim, act_dim, cfg.hidden, cfg.context_dim).to(self.device)
        self.critic = EnsembleCritic(obs_dim, act_dim, cfg.hidden, cfg.n_critics, cfg.context_dim).to(
            self.device
        )
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.value = value_net(obs_dim, cfg, self.device)
        self.actor_opt = network_adam(self.actor, cfg.actor_lr, cfg.context_lr_scale)
        self.critic_opt = network_adam(self.critic, cfg.critic_lr, cfg.context_lr_scale)
        self.value_opt = network_adam(self.value, cfg.value_lr, cfg.context_lr_scale)
        self.cost: CostSide | None = None
        if cfg.learn_cost:
            self.cost = CostSide(
                obs_dim,
                act_dim,
                cfg.hidden,
                cfg.n_critics,
                cfg.context_dim,
                cfg.critic_lr,
                cfg.context_lr_scale,
                cfg.pid,
                self.device,
            )
            self.cost_value = value_net(obs_dim, cfg, self.device)
            self.cost_value_opt = network_adam(self.cost_value, cfg.value_lr, cfg.context_lr_scale)
        self.constraint_obs: torch.Tensor | None = None
        self.step = 0

    def networks(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "value": self.value,
        }
        if self.cost is not None:
            nets |= self.cost.networks() | {"cost_value": self.cost_value}
        return nets

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        opts: dict[str, torch.optim.Optimizer] = {
            "actor": self.actor_opt,
            "critic": self.critic_opt,
            "value": self.value_opt,
        }
        if self.cost is not None:
            opts |= {"cost_critic": self.cost.opt, "cost_value": self.cost_value_opt}
        return opts

    def warm_start_actor(self, actor_state: dict[str, torch.Tensor]) -> list[str]:
        """Start the actor from a BC actor's matching weights; returns the keys copied."""
        return copy_matching(self.actor, actor_state)

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    def update(self, batch: Batch) -> dict[str, float]:
        cfg = self.cfg
        with torch.no_grad():
            q_data = self.critic_target(batch.obs, batch.act).min(0).values  # (B,)
        v = state_value(self.value, batch.obs)
        m = {"loss_value": self._step(self.value_opt, expectile_loss(q_data - v, cfg.expectile))}
        with torch.no_grad():
            target = batch.rew + cfg.gamma * (1.0 - batch.done) * state_value(self.value, batch.next_obs)
        m["loss_critic"] = self._step(self.critic_opt, td_loss(self.critic(batch.obs, batch.act), target))
        adv = q_data - v.detach()
        if self.cost is not None:
            with torch.no_grad():
                qc_data = self.cost.target(batch.obs, batch.act).max(0).values
            vc = state_value(self.cost_value, batch.obs)
            m["loss_cost_value"] = self._step(
                self.cost_value_opt, expectile_loss(qc_data - vc, cfg.cost_expectile)
            )
            with torch.no_grad():
                vc_next = state_value(self.cost_value, batch.next_obs)
            m["loss_cost_critic"] = self.cost.step(batch, vc_next, cfg.gamma, cfg.tau)
            if cfg.cost_q_limit is not None:
                adv = adv - self.cost.lagrangian.value * (qc_data - vc.detach())
        weights = torch.exp(cfg.beta * adv).clamp(max=cfg.max_weight)  # (B,)
        if self.step >= cfg.actor_warmup:
            logp = clipped_gaussian_log_prob(self.actor, batch.obs, batch.act)
            m["loss_actor"] = self._step(self.actor_opt, -(weights * logp).mean())
        soft_update(self.critic_target, self.critic, cfg.tau)
        if self.cost is not None:
            measured = self.cost.measure(self.constraint_obs, batch.obs, self.actor.act_mean)
            m |= self.cost.update_multiplier(measured, cfg.cost_q_limit)
        self.step += 1
        return m | {"q_data": q_data.mean().item(), "adv_weight": weights.mean().item()}
