"""Fixtures of the online stages: a tiny CQL checkpoint on a synthetic safe-pendulum dataset."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from arl_models.algos.cql import CQLConfig
from arl_models.data.dataset import write_dataset
from arl_models.offline import train_cql
from tests.conftest import make_transitions, pendulum_info

TINY_CQL = CQLConfig(hidden=(16, 16), batch_size=32, n_action_samples=2)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny networks: one thread avoids contention on a loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_pendulum_data(path, version: str = "1.0.0", seed: int = 0):
    t = make_transitions(n_episodes=4, length=50, seed=seed)
    t.env_version[:] = version
    write_dataset(path, t, pendulum_info(env_version=version))
    return path


@pytest.fixture(scope="session")
def pendulum_data(tmp_path_factory):
    return write_pendulum_data(tmp_path_factory.mktemp("data") / "v1.0.0")


@pytest.fixture(scope="session")
def tiny_cql(tmp_path_factory, pendulum_data):
    """A constrained CQL checkpoint (20 steps): enough to warm-start from, not to act well."""
    out = tmp_path_factory.mktemp("cql") / "cql"
    train_cql(pendulum_data, out, steps=20, config=TINY_CQL, progress=False, eval_episodes=0)
    return out


@contextmanager
def saved_multiplier(ckpt: Path, value: float):
    """The checkpoint's saved multiplier set to ``value`` for the block (the fixture is shared)."""
    ts = ckpt / "train_state" / "state.json"
    meta = json.loads(ts.read_text())
    saved = meta["extra"].copy()
    try:
        meta["extra"] |= {"lagrangian.value": value, "lagrangian.integral": value}
        ts.write_text(json.dumps(meta))
        yield
    finally:
        meta["extra"] = saved
        ts.write_text(json.dumps(meta))
