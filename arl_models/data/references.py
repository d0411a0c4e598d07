"""Reference returns of a task version: the (random, expert) pair a D4RL-style normalised score spans.

:func:`resolve_references` answers from one ordered lookup, and every answer names its source:

1. ``d4rl``: the velocity tasks on the nominal plant (``safe-hopper``, ``safe-halfcheetah``,
   ``safe-walker2d`` at a version whose dynamics are unchanged, ``1.0.0`` and ``2.0.0``) take D4RL's
   published ``REF_MIN_SCORE`` / ``REF_MAX_SCORE`` (Fu et al. 2020, "D4RL: Datasets for Deep
   Data-Driven Reinforcement Learning", ``d4rl/infos.py``). They were measured on the ``-v2``
   environments, whose reward the ``-v5`` ones keep, so imported data score on the scale the offline
   RL literature reports. A changed plant (``1.1.0``, ``2.1.0``, ...) has other returns and falls through.
2. ``measured``: the expert return of a cached behaviour run of :mod:`arl_models.data.generate` (no
   cost penalty, the task's default steps, the lowest seed found under ``~/.cache/arl/behaviour``:
   the run ``arl data generate`` trains), with the random return measured here the way that run
   measures it (uniform actions, :data:`RANDOM_EPISODES` episodes, seed 0), so a seed-0 run's
   generated datasets and imported data of the task share one scale. The random return is measured
   once and cached as JSON under ``~/.cache/arl/references/<task>@<version>.json``.
3. ``None``: no expert is known; the sidecar keeps no references and scores are not normalised.

A caller's own pair (``arl data import --ref-random --ref-expert``) wins over all of them (``given``).
Generated datasets keep measuring their own references (:mod:`arl_models.data.generate`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arl_models.data.behaviour import behaviour_config, default_behaviour_dir
from arl_models.envs.registry import TaskSpec, env_dims, get_task
from arl_models.evaluate import evaluate
from arl_models.replay import ActionScaler

D4RL_REFERENCES: dict[str, tuple[float, float]] = {
    "safe-hopper": (-20.272305, 3234.3),
    "safe-halfcheetah": (-280.178953, 12135.0),
    "safe-walker2d": (1.629008, 4592.3),
}
"""(REF_MIN_SCORE, REF_MAX_SCORE) of D4RL's hopper, halfcheetah and walker2d (Fu et al. 2020)."""

RANDOM_EPISODES = 10
RANDOM_SEED = 0
"""As a seed-0 behaviour run measures its random return (:mod:`arl_models.data.behaviour`)."""


@dataclass(frozen=True)
class References:
    random_return: float
    expert_return: float
    source: str
    """``given``, ``d4rl`` or ``measured``: the sidecar's ``ref_source``."""
    detail: str
    """Where the numbers come from, for people: a paper, a behaviour run's directory, a cache file."""


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "arl" / "references"


def given_references(ref_scores: tuple[float, float]) -> References:
    """A caller's (random, expert) pair, checked: the expert must score above random."""
    random_return, expert_return = (float(x) for x in ref_scores)
    if not expert_return > random_return:
        raise ValueError(
            f"reference expert return {expert_return:g} must exceed the random return {random_return:g}"
        )
    return References(random_return, expert_return, "given", "given by the caller")


def resolve_references(
    task: str, env_version: str | None = None, cache_dir: Path | None = None
) -> References | None:
    """The references of ``task`` (``name`` or ``name@version``), by the module's lookup; ``KeyError``
    for a task the registry does not know."""
    spec = get_task(task, env_version)
    if spec.name in D4RL_REFERENCES and spec.dynamics.is_default():
        lo, hi = D4RL_REFERENCES[spec.name]
        return References(lo, hi, "d4rl", "D4RL REF_MIN_SCORE / REF_MAX_SCORE (Fu et al. 2020)")
    found = _behaviour_expert(spec)
    if found is None:
        return None
    expert_return, bdir = found
    random_return, cache = measure_random_return(spec, cache_dir)
    return References(
        random_return,
        expert_return,
        "measured",
        f"expert of behaviour run {bdir}; random of {RANDOM_EPISODES} uniform episodes ({cache})",
    )


def reference_returns(
    task: str, env_version: str | None = None, cache_dir: Path | None = None
) -> tuple[float, float] | None:
    """``(random, expert)`` returns of a task version, or ``None`` where none is known (module docstring)."""
    refs = resolve_references(task, env_version, cache_dir)
    return None if refs is None else (refs.random_return, refs.expert_return)


def _behaviour_expert(spec: TaskSpec) -> tuple[float, Path] | None:
    """The expert return of the lowest-seed unpenalised default behaviour run cached for ``spec``."""
    root = default_behaviour_dir(spec, behaviour_config(spec.name)).parent
    seeds = sorted(
        int(m.group(1))
        for p in root.glob(f"{spec.key}-seed*")
        if (m := re.fullmatch(rf"{re.escape(spec.key)}-seed(\d+)-[0-9a-f]{{10}}", p.name))
    )
    for seed in seeds:
        bdir = default_behaviour_dir(spec, behaviour_config(spec.name, seed=seed))
        record = bdir / "behaviour.json"
        if record.is_file():
            return float(json.loads(record.read_text())["expert_return"]), bdir
    return None


def measure_random_return(spec: TaskSpec, cache_dir: Path | None = None) -> tuple[float, Path]:
    """Mean return of uniform random actions over :data:`RANDOM_EPISODES` episodes, and its cache file;
    measured once per task version and plant, then read back."""
    cache = (cache_dir or default_cache_dir()) / f"{spec.key}.json"
    plant = {
        "env_id": spec.env_id,
        "dynamics": repr(spec.dynamics),
        "episodes": RANDOM_EPISODES,
        "seed": RANDOM_SEED,
    }
    if cache.is_file():
        record = json.loads(cache.read_text())
        if all(record.get(k) == v for k, v in plant.items()):
            return float(record["random_return"]), cache
    _, act_dim, low, high, _ = env_dims(spec)
    scaler = ActionScaler.of(low, high)
    rng = np.random.default_rng(RANDOM_SEED)
    res = evaluate(
        lambda o: scaler.unnormalize(rng.uniform(-1, 1, (len(o), act_dim))),
        spec,
        RANDOM_EPISODES,
        seed=RANDOM_SEED + 1,
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    tmp.write_text(
        json.dumps(
            {"task": spec.name, "env_version": spec.env_version, **plant, "random_return": res.mean_return},
            indent=2,
        )
        + "\n"
    )
    os.replace(tmp, cache)
    return res.mean_return, cache
