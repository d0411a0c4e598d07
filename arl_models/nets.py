"""Networks shared by every algorithm: MLPs, fused critic ensembles, and the two actors.

A critic ensemble keeps its members' weights stacked as ``(E, in, out)`` and evaluates all members in
one batched matmul (``torch.baddbmm``) per layer: one fused pass, not a Python loop over critics.
Actors work in the normalised action space [-1, 1]; the environment boundary rescales.

With ``context_dim`` k > 0 the last k observation entries are a context (the observed plant of the
``2.x`` task versions: its dynamics offsets, 0 at nominal) that modulates the input of every linear layer
of actor and critics, the network's own input included, and an actor's action mean, FiLM (Perez et al.,
"FiLM: Visual Reasoning with a General Conditioning Layer", AAAI 2018): ``x <- x * (1 + W_g c) + W_b c``.
A plant that needs the opposite action is then a change of sign (the action's column of a critic's
input, the actor's mean), not a new region of the input space that one shared network must carve out.
The actor's sign sits on its output, not on the features under its heads: those feed ``log_std`` too,
and flipping them flips the spread with the mean. ``W`` starts at zero and has no bias, so at context 0
a conditioned network computes exactly what the unconditioned one does, and data of the nominal plant
leave ``W`` untouched (its gradient is proportional to ``c``).

Every network first standardises its observation with fixed statistics (:class:`ObsNorm`, identity
until an offline stage sets the data's: :func:`standardize_inputs`), as TD3+BC does (Fujimoto and Gu
2021): the statistics travel in the weights, so whatever acts on or warm-starts from a checkpoint sees
the observations its networks were trained on.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

OBS_STD_FLOOR = 1e-2
"""The smallest standard deviation an observation entry is divided by: an entry (nearly) constant in the
data is shifted, not blown up where it varies later."""


class ObsNorm(nn.Module):
    """``(obs - mean) / std`` with fixed buffers (no parameters), identity until set; a checkpoint written
    before networks had one loads with the identity, the raw inputs it was trained on
    (``checkpoint.load_weights``)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, obs_dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(obs_dim))
        self.register_buffer("std", torch.ones(obs_dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.mean) / self.std


def obs_standardization(obs: np.ndarray, context_dim: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` of the observations ``obs`` ``(N, O)``, the std floored at :data:`OBS_STD_FLOOR`;
    the last ``context_dim`` entries, the context that FiLM reads, get ``(0, 1)``: they stay as they are."""
    o = np.asarray(obs, dtype=np.float64)
    mean, std = o.mean(0), np.maximum(o.std(0), OBS_STD_FLOOR)
    if context_dim:
        mean[-context_dim:], std[-context_dim:] = 0.0, 1.0
    return mean, std


@torch.no_grad()
def standardize_inputs(nets: Iterable[nn.Module], obs: np.ndarray, context_dim: int = 0) -> None:
    """Set every :class:`ObsNorm` in ``nets`` to :func:`obs_standardization` of ``obs``."""
    mean, std = obs_standardization(obs, context_dim)
    for net in nets:
        for m in net.modules():
            if isinstance(m, ObsNorm):
                m.mean.copy_(torch.as_tensor(mean, dtype=m.mean.dtype))
                m.std.copy_(torch.as_tensor(std, dtype=m.std.dtype))


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [
            nn.Linear(d, h),
            nn.ReLU(inplace=True),
        ]  # in place: addmm's backward does not need its output
        d = h
    if out_dim is not None:
        layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def modulate(h: torch.Tensor, gamma_beta: torch.Tensor) -> torch.Tensor:
    """``h * (1 + gamma) + beta`` with ``gamma_beta`` the two halves along the last axis."""
    gamma, beta = gamma_beta.chunk(2, dim=-1)
    return torch.addcmul(h + beta, h, gamma)


def _check_context(obs_dim: int, context_dim: int) -> None:
    if not 0 <= context_dim < obs_dim:
        raise ValueError(
            f"context_dim must lie in [0, {obs_dim}) for observations of {obs_dim} entries, got {context_dim}"
        )


class ConditionedMLP(nn.Module):
    """:func:`mlp` whose input and hidden layers are FiLM-modulated by the last ``context_dim`` input
    entries."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], context_dim: int):
        super().__init__()
        _check_context(in_dim, context_dim)
        self.context_dim = context_dim
        dims = [in_dim, *hidden]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True))
        self.film = nn.ParameterList(nn.Parameter(torch.zeros(context_dim, 2 * d)) for d in dims)  # (k, 2D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x[..., -self.context_dim :]
        x = modulate(x, c @ self.film[0])
        for i, layer in enumerate(self.layers, start=1):  # indexed: a slice of a ParameterList re-wraps the
            x = modulate(
                torch.relu_(layer(x)), c @ self.film[i]
            )  # tensors functional_call swaps in (EWC's Fisher)
        return x


def trunk(in_dim: int, hidden: tuple[int, ...], context_dim: int = 0) -> nn.Module:
    """An actor's hidden layers: plain, or conditioned on the context (the plain one keeps its
    ``nn.Sequential`` parameter names, so checkpoints from before conditioning load unchanged)."""
    return mlp(in_dim, hidden) if context_dim == 0 else ConditionedMLP(in_dim, hidden, context_dim)


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers evaluated in one ``baddbmm``."""

    def __init__(self, ensemble: int, in_dim: int, out_dim: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default initialisation, per member
        self.weight = nn.Parameter(torch.empty(ensemble, in_dim, out_dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(ensemble, 1, out_dim).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (E, B, in) or (B, in) shared by all members -> (E, B, out)
        if x.dim() == 2:
            # materialised: a stride-0 batch sends the weight gradient down a slow GEMM path
            x = x.unsqueeze(0).expand(self.weight.shape[0], -1, -1).contiguous()
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    """Layer normalisation of each member's features, with a scale and shift per member: ``(E, B, D)``."""

    def __init__(self, ensemble: int, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ensemble, 1, dim))
        self.bias = nn.Parameter(torch.zeros(ensemble, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, F.layer_norm(x, x.shape[-1:], eps=self.eps), self.weight)


class EnsembleCritic(nn.Module):
    """``E`` Q-functions ``Q_e(s, a)``; ``forward`` returns ``(E, B)``.

    With ``layer_norm`` every hidden layer's activations are normalised after the ReLU (Ba et al. 2016),
    as ReBRAC's critics are (Tarasov et al. 2023; CORL's ``algorithms/offline/rebrac.py``); off, the
    parameters and their names are those of a critic built before the option existed.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: tuple[int, ...],
        ensemble: int = 2,
        context_dim: int = 0,
        layer_norm: bool = False,
    ):
        super().__init__()
        _check_context(obs_dim, context_dim)
        self.ensemble, self.context_dim = ensemble, context_dim
        self.obs_norm = ObsNorm(obs_dim)
        dims = [obs_dim + act_dim, *hidden]
        self.hidden = nn.ModuleList(
            EnsembleLinear(ensemble, i, o) for i, o in zip(dims[:-1], dims[1:], strict=True)
        )
        self.norms = nn.ModuleList(EnsembleLayerNorm(ensemble, h) for h in hidden) if layer_norm else None
        self.out = EnsembleLinear(ensemble, dims[-1], 1)
        # FiLM weights per member for the input of every layer, (E, k, 2D), zero: see the module docstring
        self.film = (
            nn.ParameterList(nn.Parameter(torch.zeros(ensemble, context_dim, 2 * d)) for d in dims)
            if context_dim
            else None
        )

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        obs = self.obs_norm(obs)
        x = torch.cat([obs, act], dim=-1)  # (B, O+A)
        c = obs[..., -self.context_dim :]  # (B, k), used only with FiLM
        if self.film is not None:  # (B, k) @ (E, k, 2D) -> (E, B, 2D): x is per member from here
            x = modulate(x, torch.matmul(c, self.film[0]))
        for i, layer in enumerate(self.hidden, start=1):  # indexed, as in ConditionedMLP
            x = torch.relu_(layer(x))  # (E, B, H); in place: baddbmm's backward does not need its output
            if self.norms is not None:
                x = self.norms[i - 1](x)
            if self.film is not None:
                x = modulate(x, torch.matmul(c, self.film[i]))
        return self.out(x).squeeze(-1)  # (E, B)


def action_film(context_dim: int, act_dim: int) -> nn.Parameter | None:
    """An actor's FiLM weights for its action mean, ``(k, 2A)``, zero; ``None`` without a context."""
    return nn.Parameter(torch.zeros(context_dim, 2 * act_dim)) if context_dim else None


def modulated_mean(
    head: nn.Linear, film: torch.Tensor | None, h: torch.Tensor, obs: torch.Tensor
) -> torch.Tensor:
    """An actor's action mean ``head(h)``, FiLM-modulated by the context at the end of ``obs`` when
    ``film``."""
    mu = head(h)
    return mu if film is None else modulate(mu, obs[..., -film.shape[0] :] @ film)


class DeterministicActor(nn.Module):
    """``a = tanh(mu(s))``: behaviour cloning's deterministic policy."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], context_dim: int = 0):
        super().__init__()
        self.obs_norm = ObsNorm(obs_dim)
        self.trunk = trunk(obs_dim, hidden, context_dim)
        self.mu = nn.Linear(hidden[-1], act_dim)
        self.film = action_film(context_dim, act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = self.obs_norm(obs)
        return torch.tanh(modulated_mean(self.mu, self.film, self.trunk(obs), obs))

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return self(obs)


class TanhGaussianActor(nn.Module):
    """A Gaussian squashed by tanh (Haarnoja et al. 2018): the policy of SAC, CQL and Gaussian BC.

    Shares ``trunk``, ``mu`` and ``film`` with :class:`DeterministicActor`, so a deterministic BC actor
    can warm-start it (``log_std`` keeps its initialisation).
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], context_dim: int = 0):
        super().__init__()
        self.obs_norm = ObsNorm(obs_dim)
        self.trunk = trunk(obs_dim, hidden, context_dim)
        self.mu = nn.Linear(hidden[-1], act_dim)
        self.log_std = nn.Linear(hidden[-1], act_dim)
        self.film = action_film(context_dim, act_dim)

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obs = self.obs_norm(obs)
        h = self.trunk(obs)
        log_std = self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return modulated_mean(self.mu, self.film, h, obs), log_std

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample and its log-probability: ``(B, A)``, ``(B,)``."""
        mu, log_std = self.dist_params(obs)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        return a, _tanh_gaussian_log_prob(u, mu, log_std)

    def log_prob(self, obs: torch.Tensor, act: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """Log-density of given actions in [-1, 1] (clipped away from the bounds)."""
        mu, log_std = self.dist_params(obs)
        a = act.clamp(-1.0 + eps, 1.0 - eps)
        return _tanh_gaussian_log_prob(torch.atanh(a), mu, log_std)

    def act_mean(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action ``tanh(mu(s))``, differentiable (TD3+BC's policy)."""
        return torch.tanh(self.dist_params(obs)[0])

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if deterministic:
            mu, _ = self.dist_params(obs)
            return torch.tanh(mu)
        return self.sample(obs)[0]


Actor = DeterministicActor | TanhGaussianActor
"""Either policy network: both have ``act(obs, deterministic)`` in [-1, 1]."""


def _tanh_gaussian_log_prob(u: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    z = (u - mu) / log_std.exp()
    gauss = -0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    # log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), numerically stable
    correction = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
    return (gauss - correction).sum(-1)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging ``target <- (1 - tau) target + tau source``, fused over all parameters."""
    t: list[torch.Tensor] = list(target.parameters())
    torch._foreach_lerp_(t, list(source.parameters()), tau)


def adam(params, lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam with the fused kernel: one pass over each parameter instead of about ten element-wise ops."""
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)


CONTEXT_LR_SCALE = 30.0
"""Default multiple of a network's learning rate for its FiLM weights (``SACConfig.context_lr_scale``)."""


def network_adam(
    net: nn.Module, lr: float, context_lr_scale: float = 1.0, weight_decay: float = 0.0
) -> torch.optim.Adam:
    """:func:`adam` over a network, its FiLM weights (parameters named ``film``) at ``context_lr_scale``
    times ``lr``. A network without them, or scale 1, has one parameter group (the checkpoint format of
    every network before the scale existed)."""
    film: list[nn.Parameter] = []
    rest: list[nn.Parameter] = []
    for name, p in net.named_parameters():
        (film if "film" in name.split(".") else rest).append(p)
    if context_lr_scale == 1.0 or not film:
        return adam(
            net.parameters(), lr, weight_decay
        )  # the module's order: what saved optimizer states index
    return adam([{"params": rest}, {"params": film, "lr": lr * context_lr_scale}], lr, weight_decay)


def layout_signature() -> str:
    """A hash of every network's parameter names and shapes, built at a small reference size with a
    context: it changes whenever the networks' parameters do. The pipeline keys its cached stages on it,
    so a cached checkpoint of an older layout is retrained rather than loaded."""
    nets = {
        "critic": EnsembleCritic(3, 2, (4, 4), ensemble=2, context_dim=1),
        "deterministic": DeterministicActor(3, 2, (4, 4), context_dim=1),
        "gaussian": TanhGaussianActor(3, 2, (4, 4), context_dim=1),
    }
    layout = {k: [(n, list(p.shape)) for n, p in net.named_parameters()] for k, net in nets.items()}
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:16]


def copy_matching(module: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load the entries of ``state`` whose names and shapes ``module`` shares; returns their names."""
    own = module.state_dict()
    shared = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    module.load_state_dict(shared, strict=False)
    return sorted(shared)
