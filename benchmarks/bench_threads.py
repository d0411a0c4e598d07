"""Benchmark: a learner's gradient steps per second at 1 torch thread and at torch's default (one per core),
on an idle machine and with 1 or 2 cores kept busy by other processes, as on a shared box.

Each cell trains CQL in its own process for ``--steps`` steps on a synthetic dataset of the task's widths
(the demo preset's 64x64 networks on safe-pendulum's, the paper preset's 256x256 on safe-hopper's) and
reads ``train/steps_per_s`` from the checkpoint's record. Loaders are Python processes spinning on a core.

    python benchmarks/bench_threads.py --json benchmarks/results/threads.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = """
import json, sys
from arl_models.offline import train_cql
from arl_models.presets import apply_threads
data, out, preset, threads, steps = sys.argv[1:6]
apply_threads(preset, int(threads))
final = train_cql(data, out, preset=preset, steps=int(steps), progress=False, eval_episodes=0)
print(json.dumps(final["train/steps_per_s"]))
"""
SHAPES = {"demo": ("safe-pendulum", 3, 1), "paper": ("safe-hopper", 11, 3)}


def spin(stop: mp.Event) -> None:
    x = 0
    while not stop.is_set():
        x = (x * 1103515245 + 12345) % 2**31


def dataset(root: Path, preset: str) -> Path:
    """20k random transitions of the preset's task widths (throughput does not depend on the values)."""
    import numpy as np

    from arl_models.data.dataset import DatasetInfo, Transitions, with_metadata, write_dataset
    from arl_models.envs import get_task

    task, obs_dim, act_dim = SHAPES[preset]
    n, length = 20_000, 200
    rng = np.random.default_rng(0)
    step = np.tile(np.arange(length), n // length).astype(np.int32)
    t = Transitions(
        obs=rng.normal(size=(n, obs_dim)).astype(np.float32),
        action=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        cost=rng.uniform(size=n).astype(np.float32),
        next_obs=rng.normal(size=(n, obs_dim)).astype(np.float32),
        terminated=np.zeros(n, bool),
        truncated=step == length - 1,
        episode_id=np.repeat(np.arange(n // length), length).astype(np.int64),
        step=step,
        **with_metadata(n, env_version="1.0.0", policy_hash="ab" * 32, random_seed=0),
    )
    spec = get_task(task)
    info = DatasetInfo(
        task=task,
        env_id=spec.env_id,
        env_version="1.0.0",
        obs_dim=obs_dim,
        action_dim=act_dim,
        action_low=[-1.0] * act_dim,
        action_high=[1.0] * act_dim,
        quality="random",
        ref_random_return=None,
        ref_expert_return=None,
        cost_budget=spec.cost_budget,
    )
    return write_dataset(root / preset, t, info)


def cell(data: Path, preset: str, threads: int, steps: int, root: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=root))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    res = subprocess.run(
        [sys.executable, "-c", RUN, str(data), str(out), preset, str(threads), str(steps)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(res.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument(
        "--loads", type=int, nargs="+", default=[0, 1, 2], help="cores kept busy by other processes"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for preset in SHAPES:
            data = dataset(root, preset)
            for load in args.loads:
                stop = mp.Event()
                loaders = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(load)]
                for proc in loaders:
                    proc.start()
                time.sleep(0.5)
                one, default = (cell(data, preset, n, args.steps, root) for n in (1, cores))
                stop.set()
                for proc in loaders:
                    proc.join()
                rows.append(
                    {
                        "preset": preset,
                        "busy_cores": load,
                        "threads_1": one,
                        f"threads_{cores}": default,
                        "ratio_1_over_default": one / default,
                    }
                )
                print(
                    f"{preset:5s} busy {load}/{cores}: 1 thread {one:7.1f} steps/s, "
                    f"{cores} threads {default:7.1f} steps/s, ratio x{one / default:.2f}",
                    flush=True,
                )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cores": cores, "steps": args.steps, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
