"""The fine-tuning learner: SAC, CQL or Cal-QL critics, an episode-cost multiplier and a regulariser.

Nakamoto et al., "Cal-QL: Calibrated Offline RL Pre-Training for Efficient Online Fine-Tuning"
(NeurIPS 2023): plain CQL pushes the values of the policy's actions down without limit, so when
fine-tuning starts the learned values sit far below the true ones and the first online updates
unlearn the offline policy (the "initial dip"). Cal-QL stops the push-down at a reference value, the
Monte-Carlo return of the data, by replacing ``Q(s, a~pi)`` in the log-sum-exp with
``max(Q(s, a~pi), G(s))``. The batch carries ``G`` as :attr:`MCBatch.mc_return`.

Three critic regimes, chosen by ``conservative``: ``none`` (plain SAC critics: the learner is SAC),
``cql`` (the offline CQL term kept) and ``calql`` (the calibrated term). A learner is named by its regime
(:data:`REGIME_NAMES`: ``sac``, ``cql`` or ``calql``), and that name is the ``algo`` its checkpoints
record.

The cost constraint in fine-tuning is on the *episode* cost, which only the environment loop can
measure: with ``external_multiplier`` the actor minimises
``(L_SAC + lambda * Q_c(s, pi(s))) / (1 + lambda)`` and the loop updates ``self.lagrangian`` from
finished episodes (``online/rounds.py``). The scaling is Stooke et al.'s (2020): the gradient keeps SAC's
size however large the multiplier grows, so a jump of the multiplier turns the policy towards cost instead of
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
REGIME_NAMES = {"none": "sac", "cql": "cql", "calql": "calql"}
"""What a learner of each critic regime is, and the ``algo`` its checkpoints record."""


@dataclass(frozen=True)
class CalQLConfig(CQLConfig):
    conservative: str = "calql"
    """Critic regime: ``none`` (SAC), ``cql`` (conservative term) or ``calql`` (term bounded by MC
    returns)."""
    external_multiplier: bool = False
    """The actor pays ``lambda * Q_c`` with ``lambda`` set from outside (episode costs); leave
    ``cost_q_limit`` at ``None`` then, or the multiplier is also driven by ``Q_c``."""


@dataclass
class MCBatch(Batch):
    mc_return: torch.Tensor | None = None  # (B,) discounted Monte-Carlo return from s


class Regularizer(Protocol):
    def penalty(self, name: str, module: nn.Module) -> torch.Tensor: ...


def mc_returns(rew: np.ndarray, episode_end: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return-to-go of every row, restarting after each ``episode_end`` row: ``(N,)`` float32.

    Rows are in time order within an episode; a truncated episode's tail is cut (a lower bound), and so is
    the last episode's where the rows end without an ``episode_end``.
    """
    coef = np.where(np.asarray(episode_end, dtype=bool), 0.0, float(gamma))  # (N,): 0 where G restarts
    if coef.size:
        coef[-1] = 0.0
    return backward_scan(np.asarray(rew, dtype=np.float64), coef).astype(np.float32)


def backward_scan(x: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """``y`` with ``y_t = x_t + coef_t * y_{t+1}`` and ``y_N = 0``, float64 ``(N,)``, vectorised.

    The rows are cut into ``m`` blocks of ``k ~ sqrt(N)`` rows, laid out ``(k, m)``. One backward pass over
    the ``k`` positions solves every block at once with the next block's first ``y`` taken as 0, and keeps
    each row's factor ``c`` (a product of ``coef``) on that value; the blocks' first ``y`` are the same
    recursion over ``m`` rows, after which ``y = local + c * next block's first y``. About ``3 sqrt(N)``
    vector operations, and no power of ``coef`` is ever divided by: as stable as the loop.
    """
    n = x.size
    if n <= 32:
        y, acc = np.empty(n), 0.0
        for i in range(n - 1, -1, -1):
            acc = x[i] + coef[i] * acc
            y[i] = acc
        return y
    k = int(np.sqrt(n))
    m = -(-n // k)
    flat_y, flat_c = np.zeros(m * k), np.zeros(m * k)  # padded with rows that restart: y = 0 there
    flat_y[:n], flat_c[:n] = x, coef
    ys = flat_y.reshape(m, k).T.copy()  # (k, m): position in the block, block
    cs = flat_c.reshape(m, k).T.copy()
    tmp = np.empty(m)
    for j in range(k - 2, -1, -1):  # in place: ys becomes the local y, cs the factor
        np.multiply(cs[j], ys[j + 1], out=tmp)
        ys[j] += tmp
        cs[j] *= cs[j + 1]
    first = backward_scan(ys[0], cs[0])  # (m,): y at each block's first row
    ys[:, :-1] += cs[:, :-1] * first[1:]
    return ys.T.reshape(-1)[:n]


class CalQL(CQL):
    """The fine-tuning learner (module doc): a CQL learner whose critic regime, multiplier and regulariser
    are set by its config; named by the regime (``sac`` when ``conservative`` is ``none``)."""

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
        self.name = REGIME_NAMES[cfg.conservative]
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
