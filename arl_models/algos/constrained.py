"""The cost side shared by the offline actor-critics that are not SAC-based (TD3+BC, IQL).

A cost critic ensemble ``Q_c`` learns the discounted cost from the ``cost`` column; a PID Lagrange
multiplier (``lagrange.py``) holds ``Q_c(s0, pi(s0))`` over the dataset's episode starts to the limit
``cost_q_limit`` (set from the episode budget by ``arl_models.offline.held_to_budget``). The networks
keep SAC's names (``cost_critic``, ``cost_critic_target``), so fine-tuning starts from them as it does
from CQL's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from arl_models.algos.sac import td_loss
from arl_models.lagrange import PIDConfig, PIDLagrangian
from arl_models.nets import CONTEXT_LR_SCALE, EnsembleCritic, TanhGaussianActor, network_adam, soft_update
from arl_models.replay import Batch


@dataclass(frozen=True)
class ActorCriticConfig:
    """What TD3+BC and IQL share: networks, rates, discount, and the cost side."""

    seed: int = 0
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of every network."""
    context_dim: int = 0
    """Trailing observation entries that FiLM-condition the networks (``SACConfig.context_dim``)."""
    context_lr_scale: float = CONTEXT_LR_SCALE
    normalize_obs: bool = True
    """Standardise every network's input with the dataset's observation statistics (``CQLConfig``)."""
    n_critics: int = 2
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    """Polyak rate of the target networks."""
    batch_size: int = 256
    actor_warmup: int = 0
    """Gradient steps in which only the critics (and values) learn before the actor's first update: the
    actor keeps its warm start until they value it."""
    learn_cost: bool = True
    """Learn a cost critic from the ``cost`` column."""
    cost_q_limit: float | None = None
    """Limit on ``Q_c(s0, pi(s0))``; ``None`` leaves the actor unconstrained."""
    pid: PIDConfig = PIDConfig()


START_SAMPLE = 256
"""Episode starts drawn per step to measure the constrained value."""

COST_CALIBRATION_STEPS = 3000
"""Regression steps that start the cost networks at the data's cost-to-go (:func:`fit_cost_to_go`)."""


def fit_cost_to_go(
    nets: dict[str, torch.nn.Module],
    obs: torch.Tensor,
    act: torch.Tensor,
    cost_to_go: torch.Tensor,
    steps: int = COST_CALIBRATION_STEPS,
    batch_size: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> None:
    """Regress the cost critic ``nets["cost_critic"]`` (and ``nets["cost_value"]``, where an algorithm has
    one) on the data's discounted Monte-Carlo cost-to-go ``(N,)`` of each row, then copy the critic into
    ``nets["cost_critic_target"]``.

    Started at zero, ``Q_c`` reaches the cost-to-go only as fast as soft target updates carry the cost
    back through the horizon ``1 / (1 - gamma)``, so ``Q_c(s0, pi(s0))`` reads below the limit for tens
    of thousands of steps. Started at the behaviour's cost-to-go, TD learning has only the policy's
    difference from the behaviour left to carry.
    """
    gen = torch.Generator().manual_seed(seed)
    critic, value = nets["cost_critic"], nets.get("cost_value")
    params = [*critic.parameters(), *(value.parameters() if value is not None else ())]
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, cost_to_go.shape[0], (batch_size,), generator=gen).to(obs.device)
        o, g = obs.index_select(0, idx), cost_to_go.index_select(0, idx)
        loss = td_loss(critic(o, act.index_select(0, idx)), g)
        if value is not None:
            loss = loss + td_loss(value(o, o[:, :0]), g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    nets["cost_critic_target"].load_state_dict(critic.state_dict())


def priced(q: torch.Tensor, qc: torch.Tensor, multiplier: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's objective ``Q - multiplier * Q_c`` ``(B,)`` (``Q`` without a multiplier) and its scale,
    ``mean |Q| + multiplier mean |Q_c|`` (no gradient), for TD3+BC's ``lambda = alpha / scale``: the BC
    term keeps its weight whatever the multiplier."""
    if multiplier is None:
        return q, q.abs().mean().detach()
    return q - multiplier * qc, (q.abs().mean() + multiplier * qc.abs().mean()).detach()


class CostSide:
    """Cost critic, its target and optimiser, and the multiplier; owned by an algorithm."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: tuple[int, ...],
        n_critics: int,
        context_dim: int,
        lr: float,
        context_lr_scale: float,
        pid: PIDConfig,
        device: torch.device,
    ):
        self.critic = EnsembleCritic(obs_dim, act_dim, hidden, n_critics, context_dim).to(device)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.opt = network_adam(self.critic, lr, context_lr_scale)
        self.lagrangian = PIDLagrangian(pid)

    def networks(self) -> dict[str, torch.nn.Module]:
        return {"cost_critic": self.critic, "cost_critic_target": self.target}

    def step(self, batch: Batch, next_value: torch.Tensor, gamma: float, tau: float) -> float:
        """One TD step of ``Q_c`` towards ``c + gamma (1 - done) next_value`` (``next_value`` (B,), no
        gradient, floored at 0: a cost's value is never negative); returns the loss."""
        target = batch.cost + gamma * (1.0 - batch.done) * next_value.clamp(min=0.0)
        loss = td_loss(self.critic(batch.obs, batch.act), target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        soft_update(self.target, self.critic, tau)
        return loss.item()

    @torch.no_grad()
    def measure(
        self, starts: torch.Tensor | None, obs: torch.Tensor, policy: Callable[[torch.Tensor], torch.Tensor]
    ) -> float:
        """``Q_c(s, pi(s))`` averaged over a sample of episode starts (the batch's states without them)."""
        if starts is not None:
            obs = starts.index_select(
                0, torch.randint(0, starts.shape[0], (min(START_SAMPLE, starts.shape[0]),))
            )
        return self.critic(obs, policy(obs)).mean().item()

    def update_multiplier(self, measured: float, limit: float | None) -> dict[str, float]:
        if limit is None:
            return {"qc_constrained": measured}
        self.lagrangian.update(measured, limit)
        return {"qc_constrained": measured, "lagrange_multiplier": self.lagrangian.value}


class OfflineActorCritic:
    """What TD3+BC and IQL share around their updates: acting, and the counters ``train_state/`` keeps."""

    actor: TanhGaussianActor
    cost: CostSide | None
    device: torch.device
    step: int

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return {}

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        o = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.actor.act(o, deterministic).cpu().numpy()

    def extra_state(self) -> dict[str, float]:
        lag = self.cost.lagrangian.state() if self.cost else {}
        return {"step": self.step, **{f"lagrangian.{k}": v for k, v in lag.items()}}

    def load_extra_state(self, s: dict[str, float]) -> None:
        if self.cost:
            self.cost.lagrangian.load_state(
                {k.split(".", 1)[1]: v for k, v in s.items() if k.startswith("lagrangian.")}
            )
        self.step = int(s["step"])
