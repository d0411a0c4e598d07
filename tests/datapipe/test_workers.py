"""Environment workers: processes and Ray actors give the same data; a dead worker is replaced, nothing
twice."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from arl_models.data.recorder import policy_hash
from arl_models.envs.registry import env_dims, get_task
from arl_models.nets import TanhGaussianActor
from arl_models.workers import Collector, WorkerPool, WorkerSpec, flatten, make_pool

HIDDEN = (32, 32)


@pytest.fixture(scope="module")
def spec() -> WorkerSpec:
    task = get_task("safe-pendulum")
    obs_dim, act_dim, low, high, _ = env_dims(task)
    return WorkerSpec(
        task=task.key,
        obs_dim=obs_dim,
        act_dim=act_dim,
        hidden=HIDDEN,
        seed=3,
        chunk_steps=40,
        action_low=tuple(low.tolist()),
        action_high=tuple(high.tolist()),
    )


def actor(spec: WorkerSpec, seed: int) -> TanhGaussianActor:
    torch.manual_seed(seed)
    return TanhGaussianActor(spec.obs_dim, spec.act_dim, spec.hidden)


def collect(pool: WorkerPool, until, timeout_s: float = 120.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while not until(got):
        assert time.monotonic() < deadline, f"workers delivered only {len(got)} chunks in {timeout_s} s"
        got += pool.poll(timeout=0.2)
    return got


def first_chunks(pool: WorkerPool, flat: np.ndarray, per_worker: int) -> dict:
    with pool:
        pool.broadcast(flat, 0)
        got = collect(
            pool,
            lambda g: all(
                sum(c.worker == w and c.incarnation == 0 for c in g) >= per_worker for w in range(2)
            ),
        )
    return {c.key: c for c in got if c.seq < per_worker}


def test_a_chunk_carries_its_episodes_metadata_and_policy(spec):
    a = actor(spec, 0)
    c = Collector(spec, worker=0)
    c.load(flatten(a.state_dict()), version=7)
    chunks = [c.collect() for _ in range(6)]  # 240 steps: one 200-step pendulum episode ends inside
    rows = sum(len(ch) for ch in chunks)
    assert rows == 6 * spec.chunk_steps and [ch.seq for ch in chunks] == list(range(6))
    assert sum(len(ch.episodes) for ch in chunks) == sum(int(ch.episode_end.sum()) for ch in chunks) == 1
    assert sum(ch.episodes[0][2] for ch in chunks if ch.episodes) == 200
    ch = chunks[0]
    assert ch.policy_version == 7 and ch.meta["policy_hash"] == policy_hash(a.state_dict())
    assert ch.meta["env_version"] == get_task(spec.task).env_version and ch.meta[
        "random_seed"
    ] == spec.stream_seed(0, 0)
    assert np.all(np.abs(ch.act) <= 1.0) and ch.obs.shape == (spec.chunk_steps, spec.obs_dim)
    np.testing.assert_array_equal(ch.obs[1:], ch.next_obs[:-1])  # one environment's rows are contiguous


def test_processes_follow_the_newest_broadcast_version(spec):
    a0, a1 = actor(spec, 0), actor(spec, 1)
    with make_pool(spec, 2, "process") as pool:
        pool.broadcast(flatten(a0.state_dict()), 0)
        collect(pool, lambda g: len(g) >= 2)
        pool.broadcast(flatten(a1.state_dict()), 1)
        got = collect(pool, lambda g: {c.worker for c in g if c.policy_version == 1} == {0, 1})
    newest = [c for c in got if c.policy_version == 1]
    assert all(c.meta["policy_hash"] == policy_hash(a1.state_dict()) for c in newest)


@pytest.mark.parametrize("backend", ["process", "ray"])
def test_a_dead_worker_is_replaced_and_no_chunk_is_counted_twice(spec, backend):
    if backend == "ray":
        pytest.importorskip("ray")
    with make_pool(spec, 2, backend) as pool:
        pool.broadcast(flatten(actor(spec, 0).state_dict()), 0)
        got = collect(pool, lambda g: len(g) >= 2)
        pool.kill(0)  # type: ignore[attr-defined]
        got += collect(pool, lambda g: any(c.worker == 0 and c.incarnation == 1 for c in g))
        assert pool.replaced >= 1 and pool.incarnations[0] >= 1 and pool.num_workers == 2
    keys = [c.key for c in got]
    assert len(keys) == len(set(keys))
    for w, inc in {(c.worker, c.incarnation) for c in got}:  # each stream is gap-free from seq 0
        seqs = sorted(c.seq for c in got if (c.worker, c.incarnation) == (w, inc))
        assert seqs == list(range(len(seqs)))
    new = next(c for c in got if c.worker == 0 and c.incarnation == 1)
    assert new.meta["random_seed"] == spec.stream_seed(0, 1) != spec.stream_seed(0, 0)


def test_ray_actors_and_processes_produce_the_same_data_for_the_same_seeds(spec):
    pytest.importorskip("ray")
    flat = flatten(actor(spec, 0).state_dict())
    by_process = first_chunks(make_pool(spec, 2, "process"), flat, per_worker=3)
    by_ray = first_chunks(make_pool(spec, 2, "ray"), flat, per_worker=3)
    assert set(by_process) == set(by_ray) and len(by_process) == 6
    for k, c in by_process.items():
        r = by_ray[k]
        for name in ("obs", "act", "rew", "cost", "next_obs", "term", "episode_end"):
            np.testing.assert_array_equal(getattr(c, name), getattr(r, name), err_msg=f"{k} {name}")


def test_resize_changes_the_number_of_running_workers(spec):
    with make_pool(spec, 1, "process") as pool:
        pool.broadcast(flatten(actor(spec, 0).state_dict()), 0)
        pool.resize(2)
        got = collect(pool, lambda g: {c.worker for c in g} == {0, 1})
        pool.resize(1)
        assert pool.num_workers == 1 and list(pool.incarnations) == [0]
        got += collect(pool, lambda g: len(g) >= len(got) + 2)
    assert len({c.key for c in got}) == len(got)


@pytest.fixture(scope="module", autouse=True)
def _stop_ray_after_the_module():
    yield
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
