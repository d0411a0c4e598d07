"""Behaviour cloning: the first stage, and the baseline every later stage must beat.

Pomerleau (1991); the deterministic variant regresses actions with a squared error, the Gaussian
variant maximises the log-likelihood of the data's actions (:func:`clipped_gaussian_log_prob`) with the
same network as SAC/CQL's actor, so CQL can start from it directly.

Logged control data is a policy's output plus noise, clipped to the bounds, so a share of its action
entries sits exactly at -1 or 1. The Gaussian variant reads such an entry as what it is, a censored
observation: the probability that the unclipped action lies beyond the bound (the Tobit likelihood,
Tobin 1958), not a density at ``atanh(1 - eps)``, which would weigh one saturated entry like a point
seven standard units out and drag the mean towards it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from arl_models.nets import CONTEXT_LR_SCALE, Actor, DeterministicActor, TanhGaussianActor, network_adam
from arl_models.replay import Batch


@dataclass(frozen=True)
class BCConfig:
    seed: int = 0
    hidden: tuple[int, ...] = (256, 256)
    context_dim: int = 0
    """Entries at the end of the observation that FiLM-condition the actor (``SACConfig.context_dim``)."""
    context_lr_scale: float = CONTEXT_LR_SCALE
    """The FiLM weights' learning rate as a multiple of ``lr`` (``SACConfig.context_lr_scale``)."""
    normalize_obs: bool = True
    """Standardise the actor's input with the dataset's observation statistics (``CQLConfig``)."""
    policy: Literal["deterministic", "gaussian"] = "deterministic"
    """``deterministic``: mean-squared error (d3rlpy's default too); ``gaussian``: negative log-likelihood
    with the bounds censored. Stage 2 copies either's trunk and mean head."""
    lr: float = 1e-3
    batch_size: int = 256
    weight_decay: float = 0.0


@dataclass(frozen=True)
class BCLosses:
    actor: torch.Tensor

    def metrics(self) -> dict[str, float]:
        return {"loss_actor": self.actor.item()}


SATURATED = 1.0 - 1e-4
"""An action entry at or beyond this magnitude (in [-1, 1]) sits at its bound: a censored observation."""


def clipped_gaussian_log_prob(
    actor: TanhGaussianActor, obs: torch.Tensor, act: torch.Tensor, detach_mean: bool = False
) -> torch.Tensor:
    """Log-likelihood ``(B,)`` of actions in [-1, 1] under ``clip(tanh(mu) + std * eps, -1, 1)``.

    An entry inside the bounds contributes the Gaussian density at it; an entry at a bound the log of
    the Gaussian's mass beyond that bound (``log_ndtr``, stable far in the tail). ``detach_mean`` fits
    the spread alone around a mean that another loss trains (TD3+BC's)."""
    mu, log_std = actor.dist_params(obs)
    mean = torch.tanh(mu)
    if detach_mean:
        mean = mean.detach()
    std = log_std.exp()
    inside = -0.5 * ((act - mean) / std).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    upper = torch.special.log_ndtr((mean - SATURATED) / std)  # log P(x >= bound)
    lower = torch.special.log_ndtr((-SATURATED - mean) / std)  # log P(x <= -bound)
    per_entry = torch.where(act >= SATURATED, upper, torch.where(act <= -SATURATED, lower, inside))  # (B, A)
    return per_entry.sum(-1)


def compute_bc_loss(actor: nn.Module, obs: torch.Tensor, act: torch.Tensor) -> BCLosses:
    if isinstance(actor, TanhGaussianActor):
        return BCLosses(actor=-clipped_gaussian_log_prob(actor, obs, act).mean())
    return BCLosses(actor=(actor(obs) - act).pow(2).sum(-1).mean())


class BC:
    name = "bc"
    config_cls: type = BCConfig

    def __init__(self, obs_dim: int, act_dim: int, cfg: BCConfig, device: str | torch.device = "cpu"):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        actor_cls = TanhGaussianActor if cfg.policy == "gaussian" else DeterministicActor
        self.actor: Actor = actor_cls(obs_dim, act_dim, cfg.hidden, cfg.context_dim).to(self.device)
        self.actor_opt = network_adam(self.actor, cfg.lr, cfg.context_lr_scale, cfg.weight_decay)
        self.step = 0

    def networks(self) -> dict[str, nn.Module]:
        return {"actor": self.actor}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt}

    def parameters(self) -> dict[str, nn.Parameter]:
        return {}

    def update(self, batch: Batch) -> dict[str, float]:
        losses = compute_bc_loss(self.actor, batch.obs, batch.act)
        self.actor_opt.zero_grad(set_to_none=True)
        losses.actor.backward()
        self.actor_opt.step()
        self.step += 1
        return losses.metrics()

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        o = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        return self.actor.act(o, deterministic).cpu().numpy()

    def extra_state(self) -> dict[str, float]:
        return {"step": self.step}

    def load_extra_state(self, s: dict[str, float]) -> None:
        self.step = int(s["step"])
