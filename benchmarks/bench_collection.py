"""Environment collection throughput, 1 and 2 workers: our worker pools against gymnasium's vector env.

    .venv/bin/python benchmarks/bench_collection.py [--task safe-hopper] [--seconds 8] [--json out.json]

Every contestant steps the task with the same untrained actor (``TanhGaussianActor``, hidden 256x256,
the offline stages' size) sampling actions, one policy call per step:

* ``gym-async-k``: ``gymnasium.vector.AsyncVectorEnv`` with ``k`` environment processes; the policy
  runs in this process on the batch of ``k`` observations (the synchronous loop, ``online/sync_loop.py``).
* ``process-k``: our ``ProcessPool`` with ``k`` workers, each stepping one environment with its own
  copy of the actor (``arl_models.workers``); this process only receives chunks.
* ``ray-k``: our ``RayPool`` with ``k`` local Ray actors (when Ray is installed).

Each is timed over ``--seconds`` after a warm-up (worker start-up is not counted). Printed: env
steps/s of each, the 2-over-1 scaling of each kind (2.0 is linear), and ours over gymnasium at equal
worker counts. With 2 cores, 2 workers leave no core to this process.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch


def gym_async(task: str, k: int, seconds: float, actor) -> float:
    import gymnasium as gym

    from arl_models.envs.registry import make_env

    envs = gym.vector.AsyncVectorEnv([lambda: make_env(task) for _ in range(k)])
    low, high = envs.single_action_space.low, envs.single_action_space.high
    try:
        obs, _ = envs.reset(seed=list(range(k)))

        def step(obs):
            with torch.no_grad():
                a = actor.act(torch.as_tensor(obs, dtype=torch.float32), deterministic=False).numpy()
            return envs.step(low + (a + 1.0) * 0.5 * (high - low))[0]

        for _ in range(50):  # warm-up
            obs = step(obs)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            obs = step(obs)
            n += k
        return n / (time.perf_counter() - t0)
    finally:
        envs.close()


def ours(backend: str, spec, k: int, seconds: float, flat: np.ndarray) -> float:
    from arl_models.workers import make_pool

    with make_pool(spec, k, backend) as pool:
        pool.broadcast(flat, 0)
        started: set[int] = set()
        while len(started) < k:  # warm-up: every worker has delivered once
            started |= {c.worker for c in pool.poll(timeout=1.0)}
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += sum(len(c) for c in pool.poll(timeout=0.05))
        return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="safe-hopper")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--chunk-steps", type=int, default=50)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)

    from arl_models.envs.registry import env_dims, get_task
    from arl_models.nets import TanhGaussianActor
    from arl_models.workers import WorkerSpec, flatten

    task = get_task(a.task)
    obs_dim, act_dim, low, high, _ = env_dims(task)
    torch.manual_seed(0)
    actor = TanhGaussianActor(obs_dim, act_dim, (256, 256))
    spec = WorkerSpec(
        task=task.key,
        obs_dim=obs_dim,
        act_dim=act_dim,
        hidden=(256, 256),
        chunk_steps=a.chunk_steps,
        action_low=tuple(low.tolist()),
        action_high=tuple(high.tolist()),
    )
    flat = flatten(actor.state_dict())
    kinds = ["gym-async", "process"]
    if not a.no_ray:
        try:
            import ray  # noqa: F401

            kinds.append("ray")
        except ImportError:
            print("ray is not installed: the Ray pool is left out")
    rates: dict[str, float] = {}
    for kind in kinds:
        for k in (1, 2):
            rate = (
                gym_async(task.key, k, a.seconds, actor)
                if kind == "gym-async"
                else ours(kind, spec, k, a.seconds, flat)
            )
            rates[f"{kind}-{k}"] = rate
            print(f"{kind}-{k}: {rate:9,.0f} env steps/s", flush=True)
    print(f"\n{a.task}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for kind in kinds:
        print(
            f"{kind:10s} scaling 1 -> 2 workers: "
            f"{rates[f'{kind}-2'] / rates[f'{kind}-1']:.2f}x (2.00 is linear)"
        )
    for kind in kinds[1:]:
        for k in (1, 2):
            print(f"{kind}-{k} / gym-async-{k}: {rates[f'{kind}-{k}'] / rates[f'gym-async-{k}']:.2f}x")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {"task": a.task, "seconds": a.seconds, "rates": rates, "load": os.getloadavg()[0]}, indent=2
            )
        )


if __name__ == "__main__":
    main()
