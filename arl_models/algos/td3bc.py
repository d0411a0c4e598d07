"""TD3+BC: TD3 with a behaviour-cloning term in the actor's loss, plus a cost critic and constraint.

Fujimoto and Gu, "A Minimalist Approach to Offline Reinforcement Learning" (NeurIPS 2021). The critics
are TD3's (clipped double-Q, target policy smoothing, delayed actor and target updates); the actor
maximises ``lambda Q(s, pi(s)) - mean (pi(s) - a)^2`` with ``lambda = alpha / mean |Q|``, so the BC term
keeps its weight whatever the scale of the returns.

The cost: ``Q_c`` learns the discounted cost by TD with the same smoothed target action, and with
``cost_q_limit`` set the actor maximises ``lambda (Q - nu Q_c)`` instead, ``nu`` the PID Lagrange
multiplier that holds ``Q_c(s0, pi(s0))`` over the episode starts to the limit (``constrained.py``), and
``lambda = alpha / (mean |Q| + nu mean |Q_c|)``: the BC term keeps its weight whatever the multiplier.

The policy is the tanh-Gaussian actor SAC and CQL use, acting by its mean ``tanh(mu(s))``, so fine-tuning
and serving take it as they take CQL's. Its ``log_std`` head learns the data's spread around that mean
(the clipped-Gaussian likelihood of BC with the mean held fixed): the exploration fine-tuning starts from.
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
    priced,
)
from arl_models.algos.sac import _frozen, td_loss
from arl_models.nets import EnsembleCritic, TanhGaussianActor, copy_matching, network_adam, soft_update
from arl_models.replay import Batch


@dataclass(frozen=True)
class TD3Config(ActorCriticConfig):
    """TD3's update (Fujimoto et al. 2018): target policy smoothing and a delayed actor."""

    policy_noise: float = 0.2
    """Std of the target policy smoothing noise, in the [-1, 1] action space."""
    noise_clip: float = 0.5
    policy_freq: int = 2
    """Critic steps per actor (and target) step."""


@dataclass(frozen=True)
class TD3BCConfig(TD3Config):
    alpha: float = 2.5
    """Weight of the critic term against the BC term (the paper's alpha)."""


def smoothed_target_action(
    actor: TanhGaussianActor, next_obs: torch.Tensor, noise: float, clip: float
) -> torch.Tensor:
    """TD3's target action: the target policy's mean plus clipped Gaussian noise, within [-1, 1]."""
    mean = actor.act(next_obs, True)
    eps = (torch.randn_like(mean) * noise).clamp(-clip, clip)
    return (mean + eps).clamp(-1.0, 1.0)


class DelayedActorCritic(OfflineActorCritic):
    """TD3's learner with a cost side: networks, optimisers, warm start, the critics' TD loss and the
    delayed update; subclasses give the actor's loss."""

    cfg: TD3Config

    def __init__(self, obs_dim: int, act_dim: int, cfg: TD3Config, device: str | torch.device = "cpu"):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        self.actor = TanhGaussianActor(obs_dim, act_dim, cfg.hidden, cfg.context_dim).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = self.make_critic(obs_dim, act_dim).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = network_adam(self.actor, cfg.actor_lr, cfg.context_lr_scale)
        self.critic_opt = network_adam(self.critic, cfg.critic_lr, cfg.context_lr_scale)
        self.cost = (
            CostSide(
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
            if cfg.learn_cost
            else None
        )
        self.constraint_obs: torch.Tensor | None = None
        self.step = 0

    def networks(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "actor": self.actor,
            "actor_target": self.actor_target,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }
        return nets | (self.cost.networks() if self.cost else {})

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        opts: dict[str, torch.optim.Optimizer] = {"actor": self.actor_opt, "critic": self.critic_opt}
        return opts | ({"cost_critic": self.cost.opt} if self.cost else {})

    def warm_start_actor(self, actor_state: dict[str, torch.Tensor]) -> list[str]:
        """Start actor and target actor from a BC actor's matching weights; returns the keys copied."""
        copied = copy_matching(self.actor, actor_state)
        self.actor_target.load_state_dict(self.actor.state_dict())
        return copied

    def make_critic(self, obs_dim: int, act_dim: int) -> EnsembleCritic:
        cfg = self.cfg
        return EnsembleCritic(obs_dim, act_dim, cfg.hidden, cfg.n_critics, cfg.context_dim)

    def critic_loss(self, batch: Batch, next_act: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The critics' TD loss against the smoothed target action ``next_act``, and metrics."""
        with torch.no_grad():
            q_next = self.critic_target(batch.next_obs, next_act).min(0).values  # (B,)
            target = batch.rew + self.cfg.gamma * (1.0 - batch.done) * q_next
        return td_loss(self.critic(batch.obs, batch.act), target), {}

    def actor_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """``(loss, metrics, Q_c(s, pi(s)))``; the critics take no gradient."""
        raise NotImplementedError

    def update(self, batch: Batch) -> dict[str, float]:
        with torch.no_grad():
            next_act = smoothed_target_action(
                self.actor_target, batch.next_obs, self.cfg.policy_noise, self.cfg.noise_clip
            )
        critic_loss, critic_metrics = self.critic_loss(batch, next_act)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        metrics: dict[str, float] = {"loss_critic": critic_loss.item()} | critic_metrics
        if self.cost is not None:
            with torch.no_grad():
                qc_next = self.cost.target(batch.next_obs, next_act).max(0).values
            metrics["loss_cost_critic"] = self.cost.step(batch, qc_next, self.cfg.gamma, self.cfg.tau)
        self.step += 1
        if self.step % self.cfg.policy_freq:
            return metrics
        soft_update(self.critic_target, self.critic, self.cfg.tau)
        if self.step <= self.cfg.actor_warmup:
            return metrics
        actor_loss, actor_metrics, qc = self.actor_loss(batch)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        soft_update(self.actor_target, self.actor, self.cfg.tau)
        metrics |= {"loss_actor": actor_loss.item()} | actor_metrics
        if self.cost is not None:
            measured = self.cost.measure(self.constraint_obs, batch.obs, self.actor.act_mean)
            metrics |= {"qc_policy": qc.mean().item()} | self.cost.update_multiplier(
                measured, self.cfg.cost_q_limit
            )
        return metrics


class TD3BC(DelayedActorCritic):
    name = "td3bc"
    config_cls = TD3BCConfig
    cfg: TD3BCConfig

    def actor_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        act = self.actor.act_mean(batch.obs)
        with _frozen(self.critic):
            q = self.critic(batch.obs, act)[0]  # (B,): the first critic, as the paper
        qc = torch.zeros_like(q)
        nu = None
        if self.cost is not None:
            with _frozen(self.cost.critic):
                qc = self.cost.critic(batch.obs, act).mean(0)
            if self.cfg.cost_q_limit is not None:
                nu = self.cost.lagrangian.value
        objective, magnitude = priced(q, qc, nu)
        lam = self.cfg.alpha / magnitude.clamp(min=1e-6)
        bc = (act - batch.act).pow(2).mean()  # over batch and action entries, as the paper's mse_loss
        spread = -clipped_gaussian_log_prob(self.actor, batch.obs, batch.act, detach_mean=True).mean()
        return -(lam * objective).mean() + bc + 0.01 * spread, {"loss_bc": bc.item()}, qc.detach()
