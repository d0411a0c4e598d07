"""The fine-tuning algorithm: CQL with a calibrated option, an episode-cost multiplier and a regulariser.

Nakamoto et al., "Cal-QL: Calibrated Offline RL Pre-Training for Efficient Online Fine-Tuning"
(NeurIPS 2023): plain CQL pushes the values of the policy's actions down without limit, so when
fine-tuning starts the learned values sit far below the true ones and the first online updates
unlearn the offline policy (the "initial dip"). Cal-QL stops the push-down at a reference value, the
Monte-Carlo return of the data, by replacing ``Q(s, a~pi)`` in the log-sum-exp with
``max(Q(s, a~pi), G(s))``. The batch carries ``G`` as :attr:`MCBatch.mc_return`.

Three critic regimes, chosen by ``conservative``: ``none`` (plain SAC critics, the online SAC of the
issue), ``cql`` (the offline CQL term kept) and ``calql`` (the calibrated term).

The cost constraint in fine-tuning is on the *episode* cost, which only the environment loop can
measure: with ``external_multiplier`` the actor minimises
``(L_SAC + lambda * Q_c(s, pi(s))) / (1 + lambda)`` and the loop updates ``self.lagrangian`` from
finished episodes (``online/rounds.py``). The scaling is Stooke et al.'s (2020): the gradient keeps SAC's size
however large the multiplier grows, so a jump of the multiplier turns the policy towards cost instead of
swamping it. The offline ``cost_q_limit`` mechanism of SAC (unscaled) stays available for offline
training (continual learning).

An optional ``regularizer`` (EWC, ``ewc.py``) adds a penalty on the actor, critic and cost critic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn

from arl_models.algos.cql import CQL, CQLConfig
from arl_models.algos.sac import SAC
from arl_models.replay import Batch

CONSERVATIVE_MODES = ("none", "cql", "calql")


@dataclass(frozen=True)
class CalQLConfig(CQLConfig):
    conservative: str = "calql"
    """Critic regime: ``none`` (SAC), ``cql`` (conservative term) or ``calql`` (term bounded by MC returns)."""
    external_multiplier: bool = False
    """The actor pays ``lambda * Q_c`` with ``lambda`` set from outside (episode costs); leave
    ``cost_q_limit`` at ``None`` then, or the multiplier is also driven by ``Q_c``."""


@dataclass
class MCBatch(Batch):
    mc_return: torch.Tensor | None = None  # (B,) discounted Monte-Carlo return from s


class Regularizer(Protocol):
    def penalty(self, name: str, module: nn.Module) -> torch.Tensor: ...


def mc_returns(rew: np.ndarray, episode_end: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return-to-go of every row, restarting after each ``episode_end`` row: ``(N,)``.

    Rows are in time order within an episode; a truncated episode's tail is cut (a lower bound).
    """
    out = np.zeros(len(rew), dtype=np.float64)
    g = 0.0
    for i in range(len(rew) - 1, -1, -1):
        if episode_end[i]:
            g = 0.0
        g = float(rew[i]) + gamma * g
        out[i] = g
    return out.astype(np.float32)


class CalQL(CQL):
    name = "calql"
    config_cls = CalQLConfig
    cfg: CalQLConfig

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        cfg: CalQLConfig,
        device: str | torch.device = "cpu",
        regularizer: Regularizer | None = None,
    ):
        if cfg.conservative not in CONSERVATIVE_MODES:
            raise ValueError(f"conservative must be one of {CONSERVATIVE_MODES}, got {cfg.conservative!r}")
        super().__init__(obs_dim, act_dim, cfg, device)
        self.regularizer = regularizer
        self._penalties: dict[str, float] = {}

    def _reg(self, name: str, module: nn.Module) -> torch.Tensor | None:
        if self.regularizer is None:
            return None
        p = self.regularizer.penalty(name, module)
        self._penalties[f"loss_ewc_{name}"] = float(p.detach())
        return p

    def bound_sampled_q(self, q_sampled: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.cfg.conservative != "calql":
            return q_sampled
        mc = getattr(batch, "mc_return", None)
        if mc is None:
            raise ValueError("Cal-QL needs batches with mc_return (MCBatch)")
        n = self.cfg.n_action_samples
        bound = mc.view(1, -1, 1)  # (1, B, 1)
        return torch.cat([q_sampled[..., :n], torch.maximum(q_sampled[..., n:], bound)], dim=-1)

    def critic_loss(
        self,
        batch: Batch,
        next_act: torch.Tensor,
        next_logp: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.cfg.conservative == "none":
            loss, metrics = SAC.critic_loss(self, batch, next_act, next_logp, weights)
        else:
            loss, metrics = super().critic_loss(batch, next_act, next_logp, weights)
        reg = self._reg("critic", self.critic)
        return (loss if reg is None else loss + reg), metrics

    def cost_critic_loss(
        self, batch: Batch, next_act: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        loss = super().cost_critic_loss(batch, next_act, weights)
        assert self.cost_critic is not None
        reg = self._reg("cost_critic", self.cost_critic)
        return loss if reg is None else loss + reg

    def actor_loss(
        self, obs: torch.Tensor, data_act: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        loss, logp, qc = super().actor_loss(obs, data_act)
        if self.cfg.external_multiplier and qc is not None:
            lam = self.lagrangian.value
            loss = (loss + lam * qc.mean()) / (1.0 + lam)
        reg = self._reg("actor", self.actor)
        return (loss if reg is None else loss + reg), logp, qc

    def update(self, batch: Batch, weights: torch.Tensor | None = None) -> dict[str, float]:
        self._penalties = {}
        metrics = super().update(batch, weights)
        if self.cfg.external_multiplier:
            metrics["lagrange_multiplier"] = self.lagrangian.value
        return metrics | self._penalties
