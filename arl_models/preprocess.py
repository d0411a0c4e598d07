"""Observation preprocessing on the learner's device: batched, and off the acting path.

Workers act on the raw observations and the replays store them raw. A preprocessor runs where the
learner is: on every training batch, the ``obs`` and ``next_obs`` of all ``B`` rows at once, on the
batch's device, between sampling and the update (``FinetuneConfig.preprocess``). Acting never waits for
it, and the stored data never depend on it, so it can be changed between runs without recollecting.

Built in: the two state augmentations of Laskin et al., "Reinforcement Learning with Augmented Data"
(NeurIPS 2020), which regularise the critics and the actor of a policy that still acts on raw states:

* ``amplitude``: every row's ``obs`` and ``next_obs`` multiplied by one ``z ~ U[1 - scale, 1 + scale]``;
* ``noise``: ``N(0, (scale * sigma_j)^2)`` added to dimension ``j`` of ``obs`` and of ``next_obs``
  (independent draws), ``sigma_j`` the standard deviation of dimension ``j`` over the offline dataset
  (a constant dimension gets no noise).

Draws come from torch's default generator of the batch's device, so with CPU learners a resumed run
repeats them exactly (the checkpoint holds that generator's state). Other transforms register a factory
``(stats, scale) -> preprocessor`` with :func:`register_preprocessor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import torch

from arl_models.replay import Batch

B = TypeVar("B", bound=Batch)


@dataclass(frozen=True)
class ObsStats:
    """Per-dimension mean and standard deviation of a dataset's observations (float32, ``(O,)``)."""

    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def of(cls, obs: torch.Tensor) -> ObsStats:
        o = obs.double()
        return cls(o.mean(0).float(), o.std(0, correction=0).float())

    def to(self, device: torch.device) -> ObsStats:
        return ObsStats(self.mean.to(device), self.std.to(device))


class Preprocessor(Protocol):
    """A batched transform of a training batch's observations (other fields pass through)."""

    def __call__(self, batch: B) -> B: ...


class RandomAmplitude:
    def __init__(self, stats: ObsStats, scale: float):
        if not 0.0 <= scale < 1.0:
            raise ValueError(f"amplitude scale must lie in [0, 1), got {scale}")
        self.scale = scale

    def __call__(self, batch: B) -> B:
        o = batch.obs
        z = 1.0 + self.scale * (2.0 * torch.rand(o.shape[0], 1, device=o.device, dtype=o.dtype) - 1.0)
        return replace(batch, obs=o * z, next_obs=batch.next_obs * z)


class GaussianNoise:
    def __init__(self, stats: ObsStats, scale: float):
        if scale < 0.0:
            raise ValueError(f"noise scale must be >= 0, got {scale}")
        self.sigma = scale * stats.std

    def __call__(self, batch: B) -> B:
        o, o2 = batch.obs, batch.next_obs
        sigma = self.sigma.to(o.device)
        noise = torch.randn(2, *o.shape, device=o.device, dtype=o.dtype) * sigma
        return replace(batch, obs=o + noise[0], next_obs=o2 + noise[1])


Factory = Callable[[ObsStats, float], Preprocessor]
PREPROCESSORS: dict[str, Factory] = {"amplitude": RandomAmplitude, "noise": GaussianNoise}


def register_preprocessor(name: str, factory: Factory) -> None:
    """Make ``name`` usable as ``FinetuneConfig.preprocess`` (``factory(stats, scale)``)."""
    if name == "none":
        raise ValueError("'none' means no preprocessing and cannot be registered")
    PREPROCESSORS[name] = factory


def make_preprocessor(name: str, scale: float, stats: ObsStats) -> Preprocessor | None:
    """The preprocessor called ``name`` (``None`` for ``"none"``)."""
    if name == "none":
        return None
    if name not in PREPROCESSORS:
        raise ValueError(
            f"unknown preprocess {name!r}; choose none or one of {', '.join(sorted(PREPROCESSORS))}"
        )
    return PREPROCESSORS[name](stats, scale)
