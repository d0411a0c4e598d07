"""Small hand-built datasets for the pipeline tests (no generator, no environment)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from arl_models.data.dataset import DatasetInfo, Transitions, with_metadata, write_dataset

OBS_DIM, ACT_DIM = 3, 1
"""safe-pendulum's widths (a registered task's spaces: the suites check the sidecar against them)."""
TIMESTAMP = "2026-01-02T03:04:05.123456Z"


def make_transitions(
    n_episodes: int = 4, ep_len: int = 25, seed: int = 0, act_dim: int = ACT_DIM
) -> Transitions:
    rng = np.random.default_rng(seed)
    n = n_episodes * ep_len
    step = np.tile(np.arange(ep_len, dtype=np.int32), n_episodes)
    last = step == ep_len - 1
    return Transitions(
        obs=rng.normal(size=(n, OBS_DIM)).astype(np.float32),
        action=rng.uniform(-2, 2, size=(n, act_dim)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        cost=(rng.uniform(size=n) < 0.1).astype(np.float32),
        next_obs=rng.normal(size=(n, OBS_DIM)).astype(np.float32),
        terminated=np.zeros(n, dtype=bool),
        truncated=last,
        episode_id=np.repeat(np.arange(n_episodes, dtype=np.int64), ep_len),
        step=step,
        **with_metadata(n, env_version="1.0.0", policy_hash="0123abcd", random_seed=7, timestamp=TIMESTAMP),
    )


def make_info() -> DatasetInfo:
    return DatasetInfo(
        task="safe-pendulum",
        env_id="Pendulum-v1",
        env_version="1.0.0",
        obs_dim=OBS_DIM,
        action_dim=ACT_DIM,
        action_low=[-2.0] * ACT_DIM,
        action_high=[2.0] * ACT_DIM,
        quality="random",
        ref_random_return=-1200.0,
        ref_expert_return=-150.0,
        cost_budget=5.0,
    )


def make_dataset(path: Path, transitions: Transitions | None = None, **kw: int) -> Path:
    return write_dataset(
        path, transitions if transitions is not None else make_transitions(**kw), make_info()
    )
