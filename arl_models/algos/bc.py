"""Behaviour cloning: the first stage, and the baseline every later stage must beat.

Pomerleau (1991); the deterministic variant regresses actions with a squared error, the Gaussian
variant maximises the log-likelihood of the data's actions under a tanh-Gaussian policy (the same
network as SAC/CQL's actor, so CQL can start from it directly).
"""

from __future__ import annotations

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
    policy: Literal["deterministic", "gaussian"] = "gaussian"
    """``deterministic``: mean-squared error; ``gaussian``: negative log-likelihood."""
    lr: float = 1e-3
    batch_size: int = 256
    weight_decay: float = 0.0


@dataclass(frozen=True)
class BCLosses:
    actor: torch.Tensor

    def metrics(self) -> dict[str, float]:
        return {"loss_actor": self.actor.item()}


def compute_bc_loss(actor: nn.Module, obs: torch.Tensor, act: torch.Tensor) -> BCLosses:
    if isinstance(actor, TanhGaussianActor):
        return BCLosses(actor=-actor.log_prob(obs, act).mean())
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
