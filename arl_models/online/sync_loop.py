"""The synchronous loop of stage 3: rounds over a vector environment, collection and updates in turn.

A round resets every environment with seeds derived from (seed, round), collects
``episodes_per_round`` episodes with one batched policy call per step while doing ``utd`` gradient
updates per environment step, then updates the multiplier, logs, evaluates when due and checkpoints.
Rounds end on whole episodes, so a run interrupted after a round's checkpoint resumes to the same weights.
"""

from __future__ import annotations

import time

import gymnasium as gym

from arl_models.envs.registry import TaskSpec, make_env
from arl_models.online.config import FinetuneConfig
from arl_models.online.rounds import Round, after_round
from arl_models.online.session import Session


def make_envs(spec: TaskSpec, cfg: FinetuneConfig) -> gym.vector.VectorEnv:
    """``cfg.num_envs`` environments of ``spec``, in worker processes (``vector="async"``) or in-process."""
    fns = [lambda: make_env(spec) for _ in range(cfg.num_envs)]
    if cfg.vector == "async":
        return gym.vector.AsyncVectorEnv(fns)
    if cfg.vector == "sync":
        return gym.vector.SyncVectorEnv(fns)
    raise ValueError(f"vector must be 'async' or 'sync', got {cfg.vector!r}")


def run_sync(s: Session, stop_after_rounds: int | None = None) -> dict[str, float]:
    """Rounds until ``cfg.steps`` environment steps (or ``stop_after_rounds`` rounds of this call, with a
    checkpoint); returns the final record, or the last round's metrics when stopped early."""
    cfg, state = s.cfg, s.state
    t0, start_steps = time.perf_counter(), state.env_steps
    latest: dict[str, float] = {}
    rounds_here = 0
    envs = make_envs(s.spec, cfg)
    try:
        while state.env_steps < cfg.steps:
            rnd = Round(s.algo, cfg, s.scaler, s.writer)
            rnd.run(envs, cfg.seed * 1_000_003 + state.rounds * cfg.num_envs, s.update)
            latest = after_round(s.algo, state, rnd, s.budget, s.out)
            elapsed = max(time.perf_counter() - t0, 1e-9)
            latest["online/steps_per_s"] = (state.env_steps - start_steps) / elapsed
            s.report_round(latest)
            rounds_here += 1
            if s.end_round(rounds_here, stop_after_rounds):
                return latest
    finally:
        envs.close()
    return s.finish(latest, t0)
