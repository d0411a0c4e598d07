"""Elastic Weight Consolidation: a Fisher-weighted pull towards the parameters earlier versions taught.

Kirkpatrick et al., "Overcoming catastrophic forgetting in neural networks" (PNAS 2017): after
learning task A at parameters ``theta*``, learning task B minimises

    L_B(theta) + weight / 2 * sum_i F_i (theta_i - theta*_i)^2

with ``F`` the diagonal Fisher information at ``theta*`` on A's data. For a sequence of versions the
online EWC of Schwarz et al., "Progress & Compress" (ICML 2018) keeps one penalty: after each version
``F <- decay * F + F_new`` and the anchor moves to the newest parameters.

The Fisher of each network:

- the policy: ``E_s E_{a~pi(.|s)} [(d/dtheta log pi(a|s))^2]`` over the earlier version's states,
  with the tanh-Gaussian log-likelihood (``fisher_actions="data"`` uses the data's actions instead,
  the empirical Fisher);
- the critics (reward and cost): a Gaussian likelihood around ``Q(s, a)`` with unit variance, whose
  Fisher is ``E_{(s,a)} [(d/dtheta sum_e Q_e(s, a))^2]`` over the earlier data's pairs.

Per-sample gradients come from ``torch.func.vmap(grad(...))``, a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from arl_models.nets import TanhGaussianActor

NETWORKS = ("actor", "critic", "cost_critic")


@dataclass(frozen=True)
class EWCConfig:
    seed: int = 0
    weight: float = 30.0
    """Penalty weight (``weight / 2 * sum F (theta - theta*)^2``); 0 is naive sequential training."""
    decay: float = 0.9
    """Online EWC: the Fisher accumulated over earlier versions is multiplied by this per new version."""
    samples: int = 2048
    """Transitions of each earlier dataset the Fisher is estimated on."""
    chunk: int = 512
    """Per-sample gradients computed this many at a time."""
    normalize: bool = True
    """Scale each network's Fisher to mean 1, so one weight suits actor and critics alike."""
    fisher_actions: str = "policy"
    """``policy``: true Fisher (actions sampled from the policy); ``data``: empirical (dataset actions)."""
    networks: tuple[str, ...] = ("actor",)
    """Which networks are penalised, of ``NETWORKS``: by default the policy, what is served and what
    forgetting is measured on; the critics then fit the new version's values freely."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.networks) - set(NETWORKS))
        if unknown:
            raise ValueError(f"EWC: unknown networks {unknown}; choose from {', '.join(NETWORKS)}")


class _LogProb(nn.Module):
    def __init__(self, actor: TanhGaussianActor):
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.actor.log_prob(obs, act)


class _QSum(nn.Module):
    def __init__(self, critic: nn.Module):
        super().__init__()
        self.critic = critic

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.critic(obs, act).sum(0)  # (B,): members have disjoint parameters


def squared_grad_mean(
    module: nn.Module,
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    obs: torch.Tensor,
    act: torch.Tensor,
    chunk: int = 512,
) -> dict[str, torch.Tensor]:
    """``E_n [(d fn(obs_n, act_n) / d theta)^2]`` for every parameter of ``module``, keyed by its name.

    ``fn`` is a module wrapping ``module`` as its attribute ``actor`` or ``critic`` (see callers), mapping
    a batch ``(B, O), (B, A)`` to ``(B,)``.
    """
    assert isinstance(fn, nn.Module)
    prefix = next(n for n, m in fn.named_children() if m is module)
    params = {f"{prefix}.{k}": v.detach() for k, v in module.named_parameters()}

    def one(p: dict[str, torch.Tensor], o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return functional_call(fn, p, (o.unsqueeze(0), a.unsqueeze(0))).squeeze(0)

    per_sample = vmap(grad(one), in_dims=(None, 0, 0))
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for start in range(0, obs.shape[0], chunk):
        g = per_sample(params, obs[start : start + chunk], act[start : start + chunk])
        for k in total:
            total[k] += g[k].pow(2).sum(0)
    n = max(obs.shape[0], 1)
    return {k[len(prefix) + 1 :]: v / n for k, v in total.items()}


def policy_fisher(
    actor: TanhGaussianActor, obs: torch.Tensor, act: torch.Tensor | None = None, chunk: int = 512
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher of the tanh-Gaussian policy at ``obs``; ``act=None`` samples actions from it."""
    if act is None:
        with torch.no_grad():
            act = actor.sample(obs)[0]
    return squared_grad_mean(actor, _LogProb(actor), obs, act, chunk)


def critic_fisher(
    critic: nn.Module, obs: torch.Tensor, act: torch.Tensor, chunk: int = 512
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher of a unit-variance Gaussian likelihood around the ensemble's ``Q(s, a)``."""
    return squared_grad_mean(critic, _QSum(critic), obs, act, chunk)


def compute_fisher(algo, obs: torch.Tensor, act: torch.Tensor, cfg: EWCConfig) -> dict[str, torch.Tensor]:
    """Fisher of every penalised network of a SAC-family algorithm, keyed ``network.param``.

    ``obs``/``act`` are an earlier version's transitions (actions normalised to [-1, 1]).
    """
    nets = algo.networks()
    out: dict[str, torch.Tensor] = {}
    gen_state = torch.get_rng_state()
    torch.manual_seed(cfg.seed)
    try:
        for name in cfg.networks:
            if name not in nets:
                continue
            if name == "actor":
                f = policy_fisher(nets[name], obs, act if cfg.fisher_actions == "data" else None, cfg.chunk)
            else:
                f = critic_fisher(nets[name], obs, act, cfg.chunk)
            if cfg.normalize:
                mean = torch.cat([v.reshape(-1) for v in f.values()]).mean().clamp_min(1e-12)
                f = {k: v / mean for k, v in f.items()}
            out |= {f"{name}.{k}": v for k, v in f.items()}
    finally:
        torch.set_rng_state(gen_state)
    return out


def current_anchor(algo, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    nets = algo.networks()
    return {f"{n}.{k}": v.detach().clone() for n in names if n in nets for k, v in nets[n].named_parameters()}


class EWCPenalty:
    """``weight / 2 * sum F (theta - theta*)^2`` per network; tensors keyed ``network.param``."""

    def __init__(self, fisher: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], weight: float):
        missing = set(fisher) - set(anchor)
        if missing:
            raise ValueError(f"EWC: Fisher terms without an anchor: {sorted(missing)[:3]}")
        self.fisher, self.anchor, self.weight = fisher, anchor, weight

    def penalty(self, name: str, module: nn.Module) -> torch.Tensor:
        terms = [
            (self.fisher[key] * (p - self.anchor[key]).pow(2)).sum()
            for k, p in module.named_parameters()
            if (key := f"{name}.{k}") in self.fisher
        ]
        if not terms:
            return torch.zeros((), device=next(module.parameters()).device)
        return 0.5 * self.weight * torch.stack(terms).sum()

    def consolidate(
        self, new_fisher: dict[str, torch.Tensor], new_anchor: dict[str, torch.Tensor], decay: float
    ) -> EWCPenalty:
        """Online EWC: ``F <- decay * F + F_new``, anchor at the newest parameters."""
        fisher = {k: decay * self.fisher[k] + v if k in self.fisher else v for k, v in new_fisher.items()}
        return EWCPenalty(fisher, new_anchor, self.weight)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"ewc.fisher.{k}": v.detach().cpu().contiguous() for k, v in self.fisher.items()}
        return out | {f"ewc.anchor.{k}": v.detach().cpu().contiguous() for k, v in self.anchor.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], weight: float) -> EWCPenalty:
        f = {k[len("ewc.fisher.") :]: v for k, v in tensors.items() if k.startswith("ewc.fisher.")}
        a = {k[len("ewc.anchor.") :]: v for k, v in tensors.items() if k.startswith("ewc.anchor.")}
        return cls(f, a, weight)
