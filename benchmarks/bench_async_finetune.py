"""End-to-end online fine-tuning: the asynchronous pipeline against the synchronous loop, equal samples.

    .venv/bin/python benchmarks/bench_async_finetune.py [--task safe-pendulum] [--steps 6000] [--workers 2]
        [--from CQL_DIR --data DATA_DIR] [--json out.json]

Both start from the same CQL checkpoint and run ``finetune`` with the same settings (UTD, batch, offline
ratio, multiplier gains, evaluations) for ``--steps`` environment steps, one after the other in this
process: ``sync`` is the loop of ``online/sync_loop.py`` (``--workers`` environments in
``gymnasium.vector.AsyncVectorEnv`` processes, collection and updates in turn), ``async`` the pipeline of
``online/async_loop.py`` (``--workers`` worker processes collecting while the learner updates). Printed: wall
time, env steps/s, updates done, final evaluation of every run (``--repeats`` of each, the order
flipping), and the ratio of the median wall times.

Without ``--from`` a start is made here: ``--data-steps`` of uniform-random actions recorded as a dataset,
and ``--cql-steps`` of constrained CQL on it (demo preset). The comparison is of the data path, not of the
policy's quality; both runs' evaluations are printed so a regression in learning would show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


def make_start(task: str, work: Path, data_steps: int, cql_steps: int) -> tuple[Path, Path]:
    from arl_models.data.dataset import DatasetInfo, write_dataset
    from arl_models.data.recorder import rollout
    from arl_models.envs.registry import env_dims, get_task
    from arl_models.offline import train_cql

    spec = get_task(task)
    obs_dim, act_dim, low, high, _ = env_dims(spec)
    rng = np.random.default_rng(0)
    t = rollout(
        lambda o: rng.uniform(low, high).astype(np.float32),
        spec,
        data_steps,
        seed=0,
        policy="uniform-random",
        progress=False,
    )
    info = DatasetInfo(
        task=spec.name,
        env_id=spec.env_id,
        env_version=spec.env_version,
        obs_dim=obs_dim,
        action_dim=act_dim,
        action_low=low.tolist(),
        action_high=high.tolist(),
        quality="random",
        cost_budget=spec.cost_budget,
    )
    data = write_dataset(work / "data", t, info)
    train_cql(data, work / "cql", steps=cql_steps, progress=False, eval_episodes=0)
    return work / "cql", data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="safe-pendulum")
    ap.add_argument("--from", dest="start", type=Path)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--data-steps", type=int, default=10_000)
    ap.add_argument("--cql-steps", type=int, default=500)
    ap.add_argument("--steps", type=int, default=6_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--utd", type=float, default=1.0)
    ap.add_argument("--eval-episodes", type=int, default=5)
    ap.add_argument(
        "--repeats", type=int, default=2, help="runs of each, the order flipping; medians compared"
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)

    from arl_models.online import FinetuneConfig, WorkerConfig, finetune

    with tempfile.TemporaryDirectory(prefix="arl-bench-async-") as tmp:
        work = Path(tmp)
        start, data = (a.start, a.data) if a.start else make_start(a.task, work, a.data_steps, a.cql_steps)
        base = FinetuneConfig(
            seed=0,
            steps=a.steps,
            num_envs=a.workers,
            vector="async",
            utd=a.utd,
            eval_every=0,
            eval_episodes=a.eval_episodes,
        )
        configs = {
            "sync": base,
            "async": replace(base, pipeline="async", workers=WorkerConfig(num_workers=a.workers)),
        }
        runs: dict[str, list[dict]] = {"sync": [], "async": []}
        order = [
            n for i in range(a.repeats) for n in (("sync", "async") if i % 2 == 0 else ("async", "sync"))
        ]
        for i, name in enumerate(order):  # the order flips every repeat, so load from elsewhere falls on both
            t0 = time.perf_counter()
            final = finetune(start, work / f"{name}-{i}", data=data, config=configs[name], progress=False)
            wall = time.perf_counter() - t0
            r = {
                "wall_s": wall,
                "env_steps": final["online/env_steps_total"],
                "updates": final["online/updates"],
                "eval_return": final.get("eval/return"),
                "eval_cost": final.get("eval/cost"),
                "load": os.getloadavg()[0],
            }
            runs[name].append(r)
            print(
                f"{name:5s}: {wall:7.1f} s  {r['env_steps'] / wall:7.0f} env steps/s  "
                f"{r['updates']:7.0f} updates (utd {r['updates'] / r['env_steps']:.2f})  "
                f"eval return {r['eval_return']:.1f} cost {r['eval_cost']:.1f}  load {r['load']:.2f}",
                flush=True,
            )
        results = {
            n: {"wall_s": statistics.median(r["wall_s"] for r in rs), "runs": rs} for n, rs in runs.items()
        }
    s, y = results["sync"], results["async"]
    print(
        f"\n{a.task}, {a.steps} env steps, {a.workers} workers, utd {a.utd}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"median wall time, async / sync: {y['wall_s'] / s['wall_s']:.2f} "
        f"(below 1: the asynchronous pipeline is faster); speed-up {s['wall_s'] / y['wall_s']:.2f}x"
    )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {
                    "task": a.task,
                    "steps": a.steps,
                    "workers": a.workers,
                    "utd": a.utd,
                    "results": results,
                    "load": os.getloadavg()[0],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
