"""Benchmark: retraining on a new data version at the pipeline's defaults, against training from scratch
on it.

Each cell, in fresh state directories (``ARL_HOME``), with the ``arl`` commands a user runs:

1. first run: ``arl pipeline run --task safe-pendulum@BASE --seed S`` makes a champion on the base version;
2. retrain: ``arl pipeline run --task safe-pendulum@NEW --seed S`` in the same home (new data, so stage 4
   continues the champion with EWC and the gate judges the candidate the retraining rule names);
3. scratch: the same command in another fresh home (no champion: stages 1-3 on the new version alone).

Reported per cell: the retrained policy's gated score against the scratch one's (target >= 90%), its
forgetting on the base version (target <= 10 points), whether it was promoted, the candidate the rule
chose, and the retrain's wall time against the first run's (target <= 1). Behaviour runs that make each
version's demo data are trained (and cached) before any timing.

    python benchmarks/bench_retrain.py --seeds 0 1 2 --workers 2 --json benchmarks/results/retrain.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHAINS = {"1.0.0": ["1.1.0", "1.2.0"], "2.0.0": ["2.1.0", "2.2.0"]}
ARL = str(Path(sys.executable).with_name("arl"))


def arl(home: Path, *args: str) -> float:
    """Run ``arl ARGS`` with ``ARL_HOME=home``; returns its wall time in seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARL_", "MLFLOW_", "PREFECT_"))}
    env |= {"ARL_HOME": str(home), "OMP_NUM_THREADS": "1"}
    home.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = subprocess.run([ARL, *args], cwd=home, env=env, capture_output=True, text=True)
    (home / f"arl-{int(t0)}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"arl {' '.join(args)} failed in {home}:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def last_run(home: Path) -> dict:
    """The newest pipeline run of the home's MLflow store: gated score, forgetting, verdict, reason."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = c.get_experiment_by_name("arl-safe-pendulum")
    run = c.search_runs(
        [exp.experiment_id],
        filter_string="tags.`arl.task` = 'safe-pendulum'",  # parent runs
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )[0]
    m, t = run.data.metrics, run.data.tags
    return {
        "score": m.get("score"),
        "mean_cost": m.get("mean_cost"),
        "forgetting": m.get("forgetting"),
        "verdict": t.get("arl.promotion"),
        "reason": t.get("arl.promotion.reason", ""),
        "stages": {k.split("/")[0]: v for k, v in m.items() if k.endswith("/score")},
    }


def cell(root: Path, base: str, new: str, seed: int) -> dict:
    home, scratch = root / f"{new}-s{seed}", root / f"{new}-s{seed}-scratch"
    first_s = arl(home, "pipeline", "run", "--task", f"safe-pendulum@{base}", "--seed", str(seed))
    first = last_run(home)
    retrain_s = arl(home, "pipeline", "run", "--task", f"safe-pendulum@{new}", "--seed", str(seed))
    retrain = last_run(home)
    scratch_s = arl(scratch, "pipeline", "run", "--task", f"safe-pendulum@{new}", "--seed", str(seed))
    fresh = last_run(scratch)
    ratio = retrain["score"] / fresh["score"] if fresh["score"] and fresh["score"] > 0 else None
    return {
        "base": base,
        "new": new,
        "seed": seed,
        "first": first,
        "retrain": retrain,
        "scratch": fresh,
        "score_ratio": ratio,
        "wall_s": {"first": first_s, "retrain": retrain_s, "scratch": scratch_s},
        "wall_ratio": retrain_s / first_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--versions", nargs="+", help="new versions to run (default: all of CHAINS)")
    p.add_argument("--root", type=Path, help="where the state directories go (default: a temporary one)")
    p.add_argument("--json", type=Path)
    p.add_argument("--workers", type=int, default=1, help="cells run at once (one core each)")
    args = p.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="arl-bench-retrain-"))
    cells = [(b, n) for b, ns in CHAINS.items() for n in ns if not args.versions or n in args.versions]
    for v in sorted({v for b, n in cells for v in (b, n)}):  # behaviour runs, cached, outside the timings
        arl(
            root / "warm",
            "data",
            "generate",
            "-t",
            f"safe-pendulum@{v}",
            "-q",
            "medium-replay",
            "-o",
            str(root / "warm" / v),
        )
    rows: list[dict] = []
    jobs = [(base, new, seed) for seed in args.seeds for base, new in cells]
    with ThreadPoolExecutor(args.workers) as pool:  # each cell runs its arl commands one after another
        for r in pool.map(lambda job: cell(root, *job), jobs):
            rows.append(r)
            print(
                f"{r['base']} -> {r['new']} seed {r['seed']}: retrain {r['retrain']['score']:.1f} "
                f"({r['retrain']['verdict']}, forgetting {r['retrain']['forgetting']}), "
                f"scratch {r['scratch']['score']:.1f}, ratio "
                f"{r['score_ratio'] if r['score_ratio'] is None else round(r['score_ratio'], 2)}, "
                f"wall x{r['wall_ratio']:.2f}"
                f"\n  {r['retrain']['reason']}",
                flush=True,
            )
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({"root": str(root), "rows": rows}, indent=2) + "\n")
    print(summary(rows))


def summary(rows: list[dict]) -> str:
    """One line per chain over its seeds: the targets' figures."""
    out = [
        "| chain | seeds | retrain / scratch (min) | forgetting (max) | promoted | wall, retrain / first |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for chain in dict.fromkeys((r["base"], r["new"]) for r in rows):
        rs = [r for r in rows if (r["base"], r["new"]) == chain]
        ratios = [r["score_ratio"] for r in rs if r["score_ratio"] is not None]
        forgetting = [r["retrain"]["forgetting"] for r in rs if r["retrain"]["forgetting"] is not None]
        promoted = sum(r["retrain"]["verdict"] == "champion" for r in rs)
        walls = [r["wall_ratio"] for r in rs]
        out.append(
            f"| {chain[0]} -> {chain[1]} | {len(rs)} | {_mean_min(ratios, 2)} | {_mean_max(forgetting, 1)} "
            f"| {promoted} of {len(rs)} | x{sum(walls) / len(walls):.2f} |"
        )
    return "\n".join(out)


def _mean_min(xs: list[float], digits: int) -> str:
    return f"{sum(xs) / len(xs):.{digits}f} ({min(xs):.{digits}f})" if xs else "n/a"


def _mean_max(xs: list[float], digits: int) -> str:
    return f"{sum(xs) / len(xs):.{digits}f} ({max(xs):.{digits}f})" if xs else "n/a"


if __name__ == "__main__":
    main()
