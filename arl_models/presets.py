"""Presets: ``demo`` (small networks, the whole offline part in minutes on 2 cores) and ``paper``
(d3rlpy 2.8 / CORL network sizes and hyperparameters, for benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

from arl_models.algos.bc import BCConfig
from arl_models.algos.cql import CQLConfig

C = TypeVar("C")


def with_given(cfg: C, **fields: Any) -> C:
    """``cfg`` with the fields a caller gave (not None) replaced: optional overrides from a command line or
    a flow form, so that a default lives in its config class alone."""
    return replace(cfg, **{k: v for k, v in fields.items() if v is not None})  # type: ignore[type-var]


@dataclass(frozen=True)
class Preset:
    name: str
    bc: BCConfig
    bc_steps: int
    cql: CQLConfig
    cql_steps: int
    finetune_steps: int
    """Environment steps of constrained online fine-tuning (stage 3)."""
    continual_steps: int
    """Offline gradient steps of EWC continual learning on a new data version (stage 4)."""
    log_every: int
    save_every: int
    eval_every: int
    eval_episodes: int

    def with_seed(self, seed: int) -> Preset:
        return replace(self, bc=replace(self.bc, seed=seed), cql=replace(self.cql, seed=seed))


PRESETS: dict[str, Preset] = {
    "demo": Preset(
        name="demo",
        bc=BCConfig(hidden=(64, 64), batch_size=256, lr=1e-3),
        bc_steps=2_000,
        cql=CQLConfig(hidden=(64, 64), batch_size=256, n_action_samples=10, actor_lr=3e-4, temp_lr=3e-4),
        cql_steps=5_000,
        finetune_steps=6_400,
        continual_steps=2_000,
        log_every=250,
        save_every=1_000,
        eval_every=2_500,
        eval_episodes=10,
    ),
    # d3rlpy 2.8's CQL defaults: 256x256, 2 critics, 10 samples, batch 256, actor 1e-4, critic 3e-4,
    # temperature 1e-4, conservative weight 5.
    "paper": Preset(
        name="paper",
        bc=BCConfig(hidden=(256, 256), batch_size=256, lr=1e-3),
        bc_steps=100_000,
        cql=CQLConfig(hidden=(256, 256), batch_size=256),
        cql_steps=500_000,
        finetune_steps=250_000,
        continual_steps=100_000,
        log_every=1_000,
        save_every=10_000,
        eval_every=10_000,
        eval_episodes=10,
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
