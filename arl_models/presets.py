"""Presets: ``demo`` (small networks, the whole offline part in minutes on 2 cores) and ``paper``
(d3rlpy 2.8 / CORL network sizes and hyperparameters, for benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeVar

from arl_models.algos.bc import BCConfig
from arl_models.algos.cql import CQLConfig
from arl_models.algos.iql import IQLConfig
from arl_models.algos.rebrac import ReBRACConfig
from arl_models.algos.td3bc import TD3BCConfig

C = TypeVar("C")

OFFLINE_ALGOS = ("cql", "td3bc", "iql", "rebrac")
"""The algorithms stage 2 can run, each with a cost critic and constraint and a BC warm start."""


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
    td3bc: TD3BCConfig
    iql: IQLConfig
    rebrac: ReBRACConfig
    offline_algo: str
    """Stage 2's algorithm (``cql``, ``td3bc``, ``iql`` or ``rebrac``) on a task
    :attr:`offline_algo_by_task` does not name."""
    offline_algo_by_task: Mapping[str, str]
    """Stage 2's algorithm by task name, where another measured better than :attr:`offline_algo`
    (benchmarks/README.md, "Offline algorithms on data the project did not make" and "The offline half
    held to the budget")."""
    offline_steps: dict[str, int]
    """Gradient steps of stage 2 by algorithm: a CQL step costs several of TD3+BC's, IQL's or ReBRAC's (it
    evaluates the critics on ``1 + 3N`` action sets), so each gets the budget the preset affords it."""
    finetune_steps: int
    """Environment steps of constrained online fine-tuning (stage 3)."""
    continual_steps: int
    """Offline gradient steps of EWC continual learning on a new data version (stage 4)."""
    log_every: int
    save_every: int
    eval_every: int
    eval_episodes: int
    threads: int = 1
    """torch intra-op threads of a learner: one each, so two learners (or a learner and its environments)
    fill two cores instead of oversubscribing them (benchmarks/bench_threads.py)."""

    def with_seed(self, seed: int) -> Preset:
        return replace(
            self,
            bc=replace(self.bc, seed=seed),
            cql=replace(self.cql, seed=seed),
            td3bc=replace(self.td3bc, seed=seed),
            iql=replace(self.iql, seed=seed),
            rebrac=replace(self.rebrac, seed=seed),
        )

    def stage2_algo(self, task: str) -> str:
        """Stage 2's algorithm on ``task`` (``name`` or ``name@version``)."""
        return self.offline_algo_by_task.get(task.partition("@")[0], self.offline_algo)

    def offline_steps_of(self, algo: str) -> int:
        """Stage 2's gradient steps for ``algo``."""
        self.offline_config(algo)  # names the choices when ``algo`` is unknown
        return self.offline_steps[algo]

    def offline_config(self, algo: str) -> Any:
        """The config of offline algorithm ``algo``."""
        if algo not in OFFLINE_ALGOS:
            raise KeyError(f"unknown offline algorithm {algo!r}; known: {', '.join(OFFLINE_ALGOS)}")
        return getattr(self, algo)


LOCOMOTION_STAGE2 = MappingProxyType(
    {"safe-hopper": "td3bc", "safe-halfcheetah": "td3bc", "safe-walker2d": "iql"}
)
"""Where CQL is not stage 2: on the MuJoCo tasks, the algorithm that scored best on their data."""

PRESETS: dict[str, Preset] = {
    "demo": Preset(
        name="demo",
        bc=BCConfig(hidden=(64, 64), batch_size=256, lr=1e-3),
        bc_steps=10_000,
        cql=CQLConfig(hidden=(64, 64), batch_size=256, n_action_samples=10, actor_lr=3e-4, temp_lr=3e-4),
        td3bc=TD3BCConfig(hidden=(64, 64), batch_size=256),
        iql=IQLConfig(hidden=(64, 64), batch_size=256),
        rebrac=ReBRACConfig(hidden=(64, 64), batch_size=256),
        offline_algo="cql",
        offline_algo_by_task=LOCOMOTION_STAGE2,
        offline_steps={"cql": 5_000, "td3bc": 30_000, "iql": 30_000, "rebrac": 30_000},
        finetune_steps=6_400,
        continual_steps=2_000,
        log_every=250,
        save_every=1_000,
        eval_every=2_500,
        eval_episodes=10,
    ),
    # d3rlpy 2.8's CQL defaults: 256x256, 2 critics, 10 samples, batch 256, actor 1e-4, critic 3e-4,
    # temperature 1e-4, conservative weight 5. ReBRAC: CORL's (ReBRACConfig), batch 1024, two hidden layers.
    "paper": Preset(
        name="paper",
        bc=BCConfig(hidden=(256, 256), batch_size=256, lr=1e-3),
        bc_steps=100_000,
        cql=CQLConfig(hidden=(256, 256), batch_size=256),
        td3bc=TD3BCConfig(hidden=(256, 256), batch_size=256),
        iql=IQLConfig(hidden=(256, 256), batch_size=256),
        rebrac=ReBRACConfig(hidden=(256, 256), batch_size=1024),
        offline_algo="cql",
        offline_algo_by_task=LOCOMOTION_STAGE2,
        offline_steps={"cql": 500_000, "td3bc": 1_000_000, "iql": 1_000_000, "rebrac": 1_000_000},
        finetune_steps=250_000,
        continual_steps=100_000,
        log_every=1_000,
        save_every=10_000,
        eval_every=10_000,
        eval_episodes=10,
    ),
}


DEFAULT_PRESET = "demo"
"""The preset of every entry point that is not given one."""


def apply_threads(preset: str = DEFAULT_PRESET, threads: int | None = None) -> int:
    """Set this process's torch intra-op threads to ``threads``, or the preset's; returns the number."""
    import torch

    n = threads or get_preset(preset).threads
    torch.set_num_threads(n)
    return n


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
