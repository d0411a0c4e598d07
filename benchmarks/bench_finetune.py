"""Benchmark: constrained online fine-tuning from the offline CQL policy, against the same fine-tuning
without the constraint (the baseline, from the same checkpoint, in the same run).

Reported per task: the offline policy's evaluation (return, cost), the fine-tuned policies' mean over the
last ``--last-evals`` evaluations, and the cumulative cost each incurred while learning. The issue's
criteria: return >= 1.2 x the offline policy's (measured as improvement over |offline return| for
negative-return tasks: ``(R - R0) >= 0.2 |R0|``), mean cost of the last evaluations <= budget, and
cumulative cost <= 0.5 x the unconstrained run's.

Each run also keeps ``OUT/best`` (the policy of its best evaluation within the budget, the start's
included); it is evaluated again here on ``--fresh-episodes`` episodes from other starts than the ones
it was selected on, and ``criteria_best_policy`` applies the return and cost criteria to that.

    python benchmarks/bench_finetune.py --task safe-pendulum --from CQL_DIR --steps 12000 --json out.json
    python benchmarks/bench_finetune.py --task safe-hopper --from HOPPER_CQL_DIR --steps 200000 --num-envs 8

Without ``--from``, ``--data`` and ``--cql-steps`` train the CQL start first (``train_cql``, demo preset,
constrained).

The unconstrained baseline does not depend on the constraint's settings (gains, margin), so it is kept in
``--baselines`` under a key of everything it does depend on (the start's weights, the data's bytes, the
task, the seed and the other fine-tuning settings) and reused by every later run with the same key: runs
that vary the constraint train one branch each. Runs side by side that need the same baseline train it
once (a file lock); one interrupted resumes it.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np


def _baseline_dir(root: Path, start: Path, data: Path | None, task: str, cfg) -> Path:
    """Where the unconstrained baseline of ``cfg`` lives: named by a hash of what it depends on."""
    from arl_models.checkpoint import WEIGHTS, read_config
    from arl_models.data.dataset import TRANSITIONS_FILE

    config = asdict(replace(cfg, constrained=False))
    for constraint_only in (
        "pid",
        "cost_margin",
        "cost_signal",
    ):  # left out, not set to a default: a changed default keeps the key
        del config[constraint_only]
    data = data or Path(read_config(start)["dataset"]["path"])  # as finetune resolves it

    def md5(path: Path) -> str:
        return hashlib.md5(path.read_bytes()).hexdigest()

    what = {
        "start": md5(start / WEIGHTS),
        "data": md5(data / TRANSITIONS_FILE),
        "task": task,
        "config": config,
    }
    key = hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return root / f"{task}-unconstrained-s{cfg.seed}-{key}"


def _die_with(parent: int) -> None:
    """Pool initializer: a learner ends when the benchmark's process does, killed included, instead of
    training on as an orphan (its environment workers then see their pipes close and end too)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def _run(args: tuple) -> dict:
    start, out, data, task, cfg, fresh_episodes = args
    if cfg.constrained:
        return _finetune(start, out, data, task, cfg, fresh_episodes)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:  # one run trains it, the others wait and reuse
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _finetune(start, out, data, task, cfg, fresh_episodes)


def _finetune(start: Path, out: Path, data: Path | None, task: str, cfg, fresh_episodes: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from arl_models.checkpoint import BEST, finished, load_policy
    from arl_models.envs.registry import get_task
    from arl_models.evaluate import evaluate
    from arl_models.online import best_selection, finetune

    reused = finished(out, cfg.steps) is not None
    t0 = time.perf_counter()
    final = finetune(start, out, task=task, data=data, config=cfg, progress=False)
    # a reused baseline's time is in the run that trained it
    wall = None if reused else time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/return" in r]
    best = best_selection(out)
    if (
        best is not None
    ):  # other starts than the ones it was selected on (arl_models.evaluate.EVAL_SEED onwards)
        again = evaluate(
            load_policy(Path(out) / BEST).act, get_task(task), fresh_episodes, seed=777_000 + cfg.seed
        )
        best |= {
            "fresh_return": again.mean_return,
            "fresh_cost": again.mean_cost,
            "fresh_episodes": fresh_episodes,
        }
    return {"final": final, "evals": evals, "best": best, "wall_s": wall, "dir": str(out), "reused": reused}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="safe-pendulum")
    p.add_argument("--from", dest="start", type=Path, help="CQL checkpoint to fine-tune")
    p.add_argument("--data", type=Path, help="offline dataset (default: the checkpoint's)")
    p.add_argument("--cql-steps", type=int, default=5000)
    p.add_argument("--steps", type=int, default=12_000, help="online environment steps")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument(
        "--episodes-per-round", type=int, help="episodes between multiplier updates (default: --num-envs)"
    )
    p.add_argument("--eval-every", type=int, default=2, help="rounds")
    p.add_argument("--eval-episodes", type=int, default=50, help="episodes per evaluation (fixed starts)")
    p.add_argument("--last-evals", type=int, default=3)
    p.add_argument(
        "--fresh-episodes", type=int, default=20, help="episodes of each run's best/ policy from fresh starts"
    )
    p.add_argument("--conservative", default="none")
    p.add_argument("--utd", type=float, default=1.0, help="gradient updates per environment step (both runs)")
    p.add_argument(
        "--offline-ratio",
        type=float,
        default=0.5,
        help="share of each batch from the offline data (both runs)",
    )
    p.add_argument("--budget", type=float, help="episode cost budget (default: the task's)")
    p.add_argument(
        "--cost-margin", type=float, default=0.6, help="share of the budget the multiplier holds in reserve"
    )
    p.add_argument(
        "--cost-signal",
        choices=("evaluation", "episodes"),
        help="what the multiplier measures (default: the library's, FinetuneConfig.cost_signal)",
    )
    p.add_argument("--kp", type=float, default=1.0, help="multiplier gains (per round, on cost / budget - 1)")
    p.add_argument("--ki", type=float, default=0.5)
    p.add_argument("--kd", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arl-bench-finetune"))
    p.add_argument(
        "--baselines",
        type=Path,
        default=Path("/tmp/arl-bench-finetune-baselines"),
        help="where unconstrained baselines are kept and reused by runs that differ only in the constraint",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the constrained run already in --workdir (default: refuse it)",
    )
    p.add_argument("--json", type=Path)
    a = p.parse_args()

    from arl_models.lagrange import PIDConfig
    from arl_models.online import FinetuneConfig

    a.workdir.mkdir(parents=True, exist_ok=True)
    start = a.start
    if start is None:
        from arl_models.offline import train_cql

        start = a.workdir / f"cql-{a.task}"
        train_cql(a.data, start, steps=a.cql_steps, seed=a.seed, progress=False, eval_episodes=0)
    cfg = FinetuneConfig(
        seed=a.seed,
        steps=a.steps,
        num_envs=a.num_envs,
        episodes_per_round=a.episodes_per_round,
        eval_every=a.eval_every,
        eval_episodes=a.eval_episodes,
        conservative=a.conservative,
        utd=a.utd,
        offline_ratio=a.offline_ratio,
        cost_budget=a.budget,
        cost_margin=a.cost_margin,
        pid=PIDConfig(kp=a.kp, ki=a.ki, kd=a.kd),
    )
    if a.cost_signal:
        cfg = replace(cfg, cost_signal=a.cost_signal)
    runs = {"constrained": cfg, "unconstrained": replace(cfg, constrained=False)}
    dirs = {
        "constrained": a.workdir / f"{a.task}-constrained-s{a.seed}",
        "unconstrained": _baseline_dir(a.baselines, start, a.data, a.task, cfg),
    }
    jobs = [(start, dirs[name], a.data, a.task, c, a.fresh_episodes) for name, c in runs.items()]
    # a stage resumes what its directory holds: old figures under new settings
    if dirs["constrained"].exists() and not a.resume:
        p.error(
            f"{dirs['constrained']} already exists and would be resumed; pass --resume to continue it, "
            "or another --workdir"
        )
    # the two runs side by side (executor workers may start their own env workers; Pool's may not)
    with ProcessPoolExecutor(
        len(jobs), mp_context=mp.get_context("spawn"), initializer=_die_with, initargs=(os.getpid(),)
    ) as pool:
        results = dict(zip(runs, pool.map(_run, jobs), strict=True))

    c = results["constrained"]
    r0, c0 = c["final"]["online/initial_return"], c["final"]["online/initial_cost"]
    budget = json.loads((jobs[0][1] / "config.json").read_text())["env"]["cost_budget"]

    def last(res: dict, key: str) -> float:
        return float(np.mean([e[key] for e in res["evals"][-a.last_evals :]]))

    report = {
        "task": a.task,
        "from": str(start),
        "online_steps": a.steps,
        "budget": budget,
        "episodes_per_round": a.episodes_per_round or a.num_envs,
        "pid": {"kp": a.kp, "ki": a.ki, "kd": a.kd},
        "cost_margin": a.cost_margin,
        "cost_signal": cfg.cost_signal,
        "utd": a.utd,
        "offline_ratio": a.offline_ratio,
        "eval_episodes": a.eval_episodes,
        "conservative": a.conservative,
        "offline": {"return": r0, "cost": c0},
        **{
            name: {
                "last_eval_return": last(res, "eval/return"),
                "last_eval_cost": last(res, "eval/cost"),
                "cumulative_cost": res["final"]["online/cumulative_cost"],
                "violating_episodes": res["final"]["online/violating_episodes"],
                "episodes": res["final"]["online/episodes"],
                "wall_s": res["wall_s"],
                "best": res["best"],
                "dir": res["dir"],
                "reused": res["reused"],
                "evals": [(e["step"], e["eval/return"], e["eval/cost"]) for e in res["evals"]],
            }
            for name, res in results.items()
        },
    }

    def return_and_cost(ret: float, cost: float) -> dict[str, bool]:
        return {
            "return_20pct_above_offline": ret - r0 >= 0.2 * abs(r0),
            "cost_at_or_below_budget": cost <= budget,
        }

    rc = report["constrained"]
    report["criteria"] = return_and_cost(rc["last_eval_return"], rc["last_eval_cost"]) | {
        "cumulative_cost_at_most_half_of_unconstrained": rc["cumulative_cost"]
        <= 0.5 * report["unconstrained"]["cumulative_cost"],
    }
    best = rc["best"]  # None only if not even the start was within the budget
    report["criteria_best_policy"] = (
        None if best is None else return_and_cost(best["fresh_return"], best["fresh_cost"])
    )
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
