"""Shared fixtures: small synthetic datasets built in memory (no training needed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from arl_models.data.dataset import DatasetInfo, Transitions, with_metadata, write_dataset
from arl_models.replay import ActionScaler, ReplayBuffer


def pytest_configure(config: pytest.Config) -> None:
    """Each test process as on a busy two-core machine (`make test` runs two workers): one torch thread, as
    the presets give each learner, and a temporary Prefect server given the time to start that the `arl`
    commands give it (arl_cli/pipeline.py). Before collection, since Prefect reads its settings on import."""
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def make_transitions(
    n_episodes: int = 4, length: int = 50, obs_dim: int = 3, act_dim: int = 1, seed: int = 0
) -> Transitions:
    rng = np.random.default_rng(seed)
    n = n_episodes * length
    obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
    episode_id = np.repeat(np.arange(n_episodes), length).astype(np.int64)
    step = np.tile(np.arange(length), n_episodes).astype(np.int32)
    last = step == length - 1
    return Transitions(
        obs=obs,
        action=rng.uniform(-2, 2, size=(n, act_dim)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        cost=(rng.uniform(size=n) < 0.1).astype(np.float32),
        next_obs=np.roll(obs, -1, axis=0),
        terminated=np.zeros(n, bool),
        truncated=last,
        episode_id=episode_id,
        step=step,
        **with_metadata(n, env_version="1.0.0", policy_hash="ab" * 32, random_seed=7),
    )


def make_buffer() -> ReplayBuffer:
    """:func:`make_transitions` in a replay buffer, actions scaled from Pendulum's [-2, 2]."""
    scaler = ActionScaler(np.array([-2.0], np.float32), np.array([2.0], np.float32))
    return ReplayBuffer.from_transitions(make_transitions(), scaler)


def pendulum_info(**kw) -> DatasetInfo:
    base = dict(
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
        cost_budget=12.0,
        extra={"max_episode_steps": 200},
    )
    return DatasetInfo(**{**base, **kw})


@pytest.fixture
def tiny_dataset(tmp_path):
    """A 200-row synthetic safe-pendulum dataset on disk."""
    path = tmp_path / "tiny"
    write_dataset(path, make_transitions(), pendulum_info())
    return path


@pytest.fixture(scope="session")
def pendulum_datasets(tmp_path_factory):
    """Real safe-pendulum datasets from one behaviour SAC run (about 2 minutes on 2 cores).

    Returns ``{quality: path}`` for expert, medium-replay and random; shared by every slow learning test.
    """
    from arl_models.data.generate import generate_dataset

    root = tmp_path_factory.mktemp("pendulum")
    out = {}
    for quality in ("medium-replay", "expert", "random"):
        out[quality] = root / quality
        generate_dataset(
            "safe-pendulum",
            quality,
            out[quality],
            transitions=10_000,
            seed=0,
            behaviour_steps=8_000,
            behaviour_dir=root / "behaviour",
            progress=False,
        )
    return out
