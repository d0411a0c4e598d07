"""What each training stage trains: the flow's form, converted once into the library's configs.

A :class:`StageSpec` holds everything that determines a stage's output apart from its data and its start
(the dataset hash and the upstream stage): the algorithm, its config dataclass, the steps, the seed. The
builders below take the form's optional overrides (None: the library's default, which lives in the
config class alone) and resolve the preset once; the stage verbs in :mod:`tasks.train` take the result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

STAGES = ("bc", "offline", "finetune", "ewc")


@dataclass(frozen=True)
class StageSpec:
    stage: str
    """``bc`` | ``offline`` | ``finetune`` | ``ewc``."""
    algo: str
    """The library's learner: ``bc``, ``cql``, ``td3bc``, ``iql``, ``finetune`` or ``ewc``."""
    preset: str
    """The preset the config came from (its logging, checkpoint and evaluation cadence apply)."""
    seed: int
    steps: int
    config: Any
    """The library's config: ``BCConfig``, ``CQLConfig``/``TD3BCConfig``/``IQLConfig``, ``FinetuneConfig``
    or ``ContinualConfig``."""
    eval_episodes: int
    """Evaluation episodes during training."""
    constrained: bool = True
    """Stage 2: hold the actor to the dataset's cost budget (Lagrangian)."""
    threads: int | None = None
    """torch threads of the learner (None: the preset's); changes speed, not results, so not in the key."""

    def identity(self) -> dict[str, Any]:
        """Everything that determines the stage's output (the cache key's part from the form)."""
        fields = dataclasses.asdict(self) | {"config": _as_dict(self.config)}
        fields.pop("threads")
        return fields


def _as_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)


def _preset(name: str) -> Any:
    from arl_models.presets import get_preset

    return get_preset(name)


def bc_spec(
    preset: str,
    seed: int,
    steps: int | None = None,
    eval_episodes: int | None = None,
    threads: int | None = None,
) -> StageSpec:
    """Stage 1: behaviour cloning with the preset's network."""
    from dataclasses import replace

    p = _preset(preset)
    return StageSpec(
        "bc",
        "bc",
        preset,
        seed,
        steps or p.bc_steps,
        replace(p.bc, seed=seed),
        p.eval_episodes if eval_episodes is None else eval_episodes,
        threads=threads,
    )


def offline_spec(
    preset: str,
    seed: int,
    task: str,
    algo: str | None = None,
    steps: int | None = None,
    constrained: bool = True,
    eval_episodes: int | None = None,
    threads: int | None = None,
) -> StageSpec:
    """Stage 2 on ``task``: ``algo`` (None: the preset's for the task) with its cost critic, from the BC
    actor."""
    from dataclasses import replace

    p = _preset(preset)
    algo = algo or p.stage2_algo(task)
    config = replace(p.offline_config(algo), seed=seed)
    episodes = p.eval_episodes if eval_episodes is None else eval_episodes
    return StageSpec(
        "offline",
        algo,
        preset,
        seed,
        steps or p.offline_steps_of(algo),
        config,
        episodes,
        constrained,
        threads,
    )


def finetune_spec(
    preset: str,
    seed: int,
    steps: int | None = None,
    num_envs: int | None = None,
    vector: str | None = None,
    cost_budget: float | None = None,
    eval_episodes: int | None = None,
    threads: int | None = None,
) -> StageSpec:
    """Stage 3: constrained online fine-tuning (``arl_models.online.FinetuneConfig``)."""
    from arl_models.online import FinetuneConfig
    from arl_models.presets import with_given

    p = _preset(preset)
    steps = p.finetune_steps if steps is None else steps
    episodes = p.eval_episodes if eval_episodes is None else eval_episodes
    config = with_given(
        FinetuneConfig(seed=seed, steps=steps, eval_episodes=episodes),
        num_envs=num_envs,
        vector=vector,
        cost_budget=cost_budget,
    )
    return StageSpec("finetune", "finetune", preset, seed, steps, config, episodes, threads=threads)


def ewc_spec(
    online: StageSpec,
    forgetting_episodes: int,
    steps: int | None = None,
    weight: float | None = None,
    rehearsal: float | None = None,
) -> StageSpec:
    """Stage 4: the champion continued on the new version under an EWC penalty (offline), then fine-tuned
    online as ``online`` (stage 3's spec) says, under the same penalty; forgetting measured over
    ``forgetting_episodes`` on each earlier version."""
    from arl_models.algos.ewc import EWCConfig
    from arl_models.continual import ContinualConfig
    from arl_models.presets import with_given

    p = _preset(online.preset)
    steps = p.continual_steps if steps is None else steps
    config = with_given(
        ContinualConfig(
            seed=online.seed,
            steps=steps,
            ewc=with_given(EWCConfig(seed=online.seed), weight=weight),
            baseline=False,  # the naive baseline is the benchmark's business, not every run's
            eval_episodes=forgetting_episodes,
            online_steps=online.steps,
            finetune=online.config,
        ),
        rehearsal=rehearsal,
    )
    return StageSpec(
        "ewc", "ewc", online.preset, online.seed, steps, config, online.eval_episodes, threads=online.threads
    )
