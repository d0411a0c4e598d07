"""``arl doctor``'s checks of each data-pipeline subsystem alone: the task's environment step, actor
inference single and batched, replay sampling uniform and prioritised, the learner-side observation
transform and the learners' updates, each as a rate (:func:`measure`).

Each check passes, warns, fails with a message naming what is wrong, or is skipped when an optional part
(the prioritised replay) is not installed; :func:`guard` turns a crash into a failed check.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Check:
    name: str
    group: str
    """``subsystem``, ``interface`` or ``stress``."""
    status: str
    """``pass``, ``warn``, ``fail`` or ``skip``."""
    message: str
    rate: float | None = None
    unit: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ms_per_item(self) -> float | None:
        return 1000.0 / self.rate if self.rate else None


def optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def measure(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> float:
    """Calls per second of ``fn`` over about ``seconds`` of wall time (one warm-up call first)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while n < min_calls or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def guard(name: str, group: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as e:  # a doctor reports a broken subsystem rather than crashing on it
        return Check(name, group, "fail", f"{type(e).__name__}: {e}")


def _rate_check(name: str, rate: float, unit: str, what: str, **details: Any) -> Check:
    ok = math.isfinite(rate) and rate > 0
    return Check(
        name,
        "subsystem",
        "pass" if ok else "fail",
        what if ok else f"{what}: no progress",
        rate,
        unit,
        details,
    )


def check_env(spec, seconds: float) -> Check:
    from arl_models.envs.registry import make_env

    env = make_env(spec)
    env.reset(seed=0)
    env.action_space.seed(0)

    def step() -> None:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()

    try:
        rate = measure(step, seconds)
    finally:
        env.close()
    return _rate_check("env_step", rate, "steps/s", f"{spec.key} random actions, one process")


def check_inference(algo, obs_dim: int, seconds: float, batch: int) -> list[Check]:
    import numpy as np

    out = []
    for name, b in (("inference_single", 1), ("inference_batched", batch)):
        obs = np.random.default_rng(0).normal(size=(b, obs_dim)).astype(np.float32)
        rate = measure(lambda o=obs: algo.act(o, deterministic=False), seconds)
        out.append(
            _rate_check(
                name, rate, "calls/s", f"actor.act on ({b}, {obs_dim}) = {rate * b:,.0f} obs/s", batch=b
            )
        )
    return out


def random_replay(obs_dim: int, act_dim: int, size: int, seed: int = 0):
    import numpy as np

    from arl_models.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(size, obs_dim, act_dim)
    buf.add(
        obs=rng.normal(size=(size, obs_dim)),
        act=rng.uniform(-1, 1, size=(size, act_dim)),
        rew=rng.normal(size=size),
        cost=(rng.uniform(size=size) < 0.1),
        next_obs=rng.normal(size=(size, obs_dim)),
        done=np.zeros(size),
    )
    return buf


def check_replay_uniform(replay, seconds: float, batch: int) -> Check:
    rate = measure(lambda: replay.sample(batch), seconds)
    return _rate_check("replay_uniform", rate, "batches/s", f"ReplayBuffer({len(replay):,}).sample({batch})")


def check_replay_prioritized(obs_dim: int, act_dim: int, size: int, seconds: float, batch: int) -> Check:
    mod = optional("arl_models.prioritized")
    if mod is None:
        return Check("replay_prioritized", "subsystem", "skip", "arl_models.prioritized is not present")
    import numpy as np
    import torch

    per = mod.PrioritizedReplay(size, obs_dim, act_dim, mod.PERConfig())
    src = random_replay(obs_dim, act_dim, size)
    per.add(**{k: v.numpy() for k, v in src.data.items()})
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)

    def step() -> None:
        _, idx, _ = per.sample(batch, generator=gen)
        per.update_priorities(idx, torch.as_tensor(rng.exponential(size=len(idx)), dtype=torch.float32))

    rate = measure(step, seconds)
    return _rate_check(
        "replay_prioritized",
        rate,
        "batches/s",
        f"PrioritizedReplay({size:,}) sample({batch}) + priority update",
    )


def check_preprocess(name: str, replay, seconds: float, batch: int) -> Check:
    """The learner-side observation transform (``FinetuneConfig.preprocess``, at its default scale) on
    sampled batches."""
    from arl_models.online.config import FinetuneConfig
    from arl_models.preprocess import ObsStats, make_preprocessor

    scale = FinetuneConfig().preprocess_scale
    prep = make_preprocessor(name, scale, ObsStats.of(replay.data["obs"][: len(replay)]))
    b = replay.sample(batch)
    rate = measure(lambda: prep(b), seconds)
    return _rate_check(
        "preprocess", rate, "batches/s", f"preprocess {name!r} on a batch of {batch}, learner side"
    )


def check_learner(name: str, algo, replay, seconds: float) -> Check:
    bs = algo.cfg.batch_size
    rate = measure(lambda: algo.update(replay.sample(bs)), seconds)
    return _rate_check(
        name, rate, "updates/s", f"{type(algo).__name__} update, batch {bs}, hidden {algo.cfg.hidden}"
    )


def build_learners(preset, obs_dim: int, act_dim: int) -> dict[str, Any]:
    """The offline stage's CQL and the online stage's learner (SAC: Cal-QL's critic with no conservative
    term)."""
    from dataclasses import fields

    from arl_models.algos.calql import CalQL, CalQLConfig
    from arl_models.algos.cql import CQL

    base = {f.name: getattr(preset.cql, f.name) for f in fields(preset.cql)}
    online_cfg = CalQLConfig(**{**base, "conservative": "none", "backup_entropy": True})
    return {
        "learner_cql": CQL(obs_dim, act_dim, preset.cql),
        "learner_online": CalQL(obs_dim, act_dim, online_cfg),
    }
