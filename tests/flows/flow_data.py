"""Small hand-built safe-pendulum datasets for the flow tests (no generator, no behaviour SAC)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from arl_models.data.dataset import DatasetInfo, Transitions, with_metadata, write_dataset
from arl_models.envs import get_task

# Tiny training for every pipeline test: seconds per stage, not minutes.
TINY = {
    "bc_steps": 5,
    "offline_steps": 5,
    "finetune_steps": 200,
    "finetune_envs": 1,
    "eval_episodes": 0,
    "continual_steps": 5,
}
GATE = {"eval_episodes": 2, "cost_budget": 1e9, "tolerance": 5.0}


def pendulum_transitions(n_episodes: int = 6, length: int = 50, seed: int = 0) -> Transitions:
    rng = np.random.default_rng(seed)
    n = n_episodes * length
    theta = rng.uniform(-np.pi, np.pi, size=n)
    obs = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, size=n)], axis=1).astype(np.float32)
    step = np.tile(np.arange(length), n_episodes).astype(np.int32)
    # an energy-pumping controller: push with the swing at 1.6 N m, 0.6 past the 1 N m where cost starts
    action = np.clip(1.6 * np.sign(obs[:, 2:3]) + rng.normal(0.0, 0.2, size=(n, 1)), -2, 2).astype(np.float32)
    next_obs = np.roll(obs, -1, axis=0)
    return Transitions(
        obs=obs,
        action=action,
        reward=(-(theta**2)).astype(np.float32),
        cost=get_task("safe-pendulum").cost_fn.batch_cost(action, next_obs),
        next_obs=next_obs,
        terminated=np.zeros(n, bool),
        truncated=step == length - 1,
        episode_id=np.repeat(np.arange(n_episodes), length).astype(np.int64),
        step=step,
        **with_metadata(n, env_version="1.0.0", policy_hash="ab" * 32, random_seed=seed),
    )


def pendulum_info() -> DatasetInfo:
    return DatasetInfo(
        task="safe-pendulum",
        env_id="Pendulum-v1",
        env_version="1.0.0",
        obs_dim=3,
        action_dim=1,
        action_low=[-2.0],
        action_high=[2.0],
        quality="random",
        ref_random_return=-1200.0,
        ref_expert_return=-150.0,
        cost_budget=get_task("safe-pendulum").cost_budget,
        extra={"max_episode_steps": 200},
    )


def write_pendulum(
    path: Path, seed: int = 0, broken_policy_hash: bool = False, reward_scale: float = 1.0
) -> Path:
    t = pendulum_transitions(seed=seed)
    t.reward = (t.reward * reward_scale).astype(np.float32)
    if broken_policy_hash:
        t.policy_hash = t.policy_hash.copy()
        t.policy_hash[:7] = "NOT-A-HASH"
    return write_dataset(path, t, pendulum_info())


def ingest_pendulum(path: Path, **kw) -> dict[str, str]:
    """:func:`write_pendulum` (``kw`` its options) imported, validated and versioned by ``ingest_flow`` under
    the folder's name; returns the flow's version (``path``, ``md5``)."""
    from flows.ingest import ingest_flow
    from flows.params import IngestSource

    src = write_pendulum(path, **kw)
    return ingest_flow(
        IngestSource(kind="import", task="safe-pendulum", source=str(src), format="arl", name=path.name),
        emit_event=False,
    )
