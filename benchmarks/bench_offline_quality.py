"""Offline learning quality: our CQL against d3rlpy 2.8's on the same generated datasets.

For each task the dataset is generated once with :func:`arl_models.data.generate.generate_dataset`
(D4RL-style, reference scores measured here) and both libraries train on the same rows, for the same
number of gradient steps and the same seeds, with the same networks and learning rates (a preset's),
in one process: a chunk of ``--eval-every`` steps of ours, then of d3rlpy's, each followed by an
evaluation with our :func:`arl_models.evaluate.evaluate` (same episodes, same environment seeds).
Only training time is counted in the wall times (not evaluation).

Same objective: our CQL with a fixed conservative weight (``lagrangian_threshold=None``, the presets'
setting) and no cost critic; d3rlpy with ``alpha_learning_rate=0`` (alpha stays 1, so its loss
``w * (gap - 10)`` has the gradient of our ``w * gap``). ``--peer-lagrangian`` gives d3rlpy its own
default instead (alpha tuned towards threshold 10). Actions: our datasets store raw environment
actions; ours normalise with :class:`ActionScaler`, d3rlpy gets a ``MinMaxActionScaler`` with the
same bounds.

    .venv-bench/bin/python benchmarks/bench_offline_quality.py --tasks safe-pendulum:medium-replay \
        --seeds 0 1 2 --steps 5000 --preset demo --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer import d3rlpy_act_fn, d3rlpy_cql_like, to_mdp_dataset  # noqa: E402

from arl_models.algos.cql import CQL, CQLConfig  # noqa: E402
from arl_models.data.dataset import SIDECAR_FILE, DatasetInfo, Transitions, read_dataset  # noqa: E402
from arl_models.data.generate import generate_dataset  # noqa: E402
from arl_models.envs.registry import get_task  # noqa: E402
from arl_models.evaluate import evaluate  # noqa: E402
from arl_models.presets import get_preset  # noqa: E402
from arl_models.replay import ActionScaler, ReplayBuffer  # noqa: E402


def dataset(
    task: str, quality: str, root: Path, transitions: int, behaviour_steps: int | None
) -> tuple[Transitions, DatasetInfo, Path]:
    path = root / f"{task}-{quality}"
    if not (path / SIDECAR_FILE).is_file():
        t0 = time.perf_counter()
        generate_dataset(
            task,
            quality,
            path,
            transitions=transitions,
            seed=0,
            behaviour_steps=behaviour_steps,
            progress=False,
        )
        print(f"generated {path} in {time.perf_counter() - t0:.0f} s")
    t, info = read_dataset(path)
    return t, info, path


def run_seed(
    t: Transitions,
    info: DatasetInfo,
    cfg: CQLConfig,
    steps: int,
    eval_every: int,
    episodes: int,
    peer_lagrangian: bool,
) -> dict[str, Any]:
    """Train both for ``steps`` in alternating chunks; returns their curves (step, train seconds, score)."""
    import d3rlpy

    spec = get_task(info.task, info.env_version)
    refs = (info.ref_random_return, info.ref_expert_return)
    low, high = np.asarray(info.action_low, np.float32), np.asarray(info.action_high, np.float32)
    scaler = ActionScaler(low, high)
    buf = ReplayBuffer.from_transitions(t, scaler)
    ours = CQL(info.obs_dim, info.action_dim, cfg)
    d3rlpy.seed(cfg.seed)
    peer_data = peer_dataset(t)
    peer = d3rlpy_cql_like(
        peer_data, cfg, alpha_lr=1e-4 if peer_lagrangian else 0.0, action_low=low, action_high=high
    )
    acts = {"ours": lambda o: scaler.unnormalize(ours.act(o)), "d3rlpy": d3rlpy_act_fn(peer)}
    steps_fn = {
        "ours": lambda: ours.update(buf.sample(cfg.batch_size)),
        "d3rlpy": lambda: peer.update(peer_data.sample_transition_batch(cfg.batch_size)),
    }
    curves: dict[str, list[dict[str, float]]] = {"ours": [], "d3rlpy": []}
    wall = {"ours": 0.0, "d3rlpy": 0.0}

    def score(name: str) -> float:
        res = evaluate(acts[name], spec, episodes, seed=12345, ref_scores=refs)
        return float(res.normalized_score)

    for name in curves:
        curves[name].append({"step": 0, "train_s": 0.0, "score": score(name)})
    done = 0
    while done < steps:
        n = min(eval_every, steps - done)
        for name in curves:
            t0 = time.perf_counter()
            for _ in range(n):
                steps_fn[name]()
            wall[name] += time.perf_counter() - t0
            curves[name].append({"step": done + n, "train_s": wall[name], "score": score(name)})
        done += n
        print(
            f"  step {done}: "
            + ", ".join(f"{k} {c[-1]['score']:6.1f} ({c[-1]['train_s']:.0f} s)" for k, c in curves.items()),
            flush=True,
        )
    return {"curves": curves, "steps_per_s": {k: steps / max(w, 1e-9) for k, w in wall.items()}}


_PEER_DATA: dict[int, Any] = {}


def peer_dataset(t: Transitions) -> Any:
    """One MDPDataset per Transitions object (building it walks every episode)."""
    key = id(t)
    if key not in _PEER_DATA:
        _PEER_DATA[key] = to_mdp_dataset(t)
    return _PEER_DATA[key]


def time_to_reach(curve: list[dict[str, float]], target: float) -> float | None:
    """Training seconds of the first evaluation at or above ``target`` (``None``: never reached)."""
    for p in curve[1:]:
        if p["score"] >= target:
            return p["train_s"]
    return None


def summarise(task_key: str, runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    rows = {}
    for seed, r in runs.items():
        c = r["curves"]
        target = c["d3rlpy"][-1]["score"]
        rows[seed] = {
            "final": {k: v[-1]["score"] for k, v in c.items()},
            "steps_per_s": r["steps_per_s"],
            "d3rlpy_train_s": c["d3rlpy"][-1]["train_s"],
            "ours_train_s": c["ours"][-1]["train_s"],
            "ours_s_to_d3rlpy_final": time_to_reach(c["ours"], target),
        }
    finals = {k: [rows[s]["final"][k] for s in rows] for k in ("ours", "d3rlpy")}
    mean = {k: statistics.fmean(v) for k, v in finals.items()}
    # the mean curves over seeds: when does ours' mean reach d3rlpy's mean final score?
    n_points = min(len(r["curves"]["ours"]) for r in runs.values())
    mean_curve = [
        {
            "step": next(iter(runs.values()))["curves"]["ours"][i]["step"],
            "train_s": statistics.fmean(r["curves"]["ours"][i]["train_s"] for r in runs.values()),
            "score": statistics.fmean(r["curves"]["ours"][i]["score"] for r in runs.values()),
        }
        for i in range(n_points)
    ]
    out = {
        "per_seed": rows,
        "mean_final": mean,
        "std_final": {k: statistics.pstdev(v) for k, v in finals.items()},
        "ours_mean_s_to_d3rlpy_mean_final": time_to_reach(mean_curve, mean["d3rlpy"]),
        "d3rlpy_mean_train_s": statistics.fmean(r["d3rlpy_train_s"] for r in rows.values()),
    }
    print(f"\n== {task_key}: normalised score after the same gradient steps ==")
    print(
        f"{'seed':>5s} {'ours':>8s} {'d3rlpy':>8s} {'ours st/s':>10s} {'d3 st/s':>9s} "
        f"{'ours s->d3 final':>17s} {'d3 train s':>11s}"
    )
    for seed, r in rows.items():
        reach = r["ours_s_to_d3rlpy_final"]
        print(
            f"{seed:5d} {r['final']['ours']:8.1f} {r['final']['d3rlpy']:8.1f} "
            f"{r['steps_per_s']['ours']:10.1f} {r['steps_per_s']['d3rlpy']:9.1f} "
            f"{'never' if reach is None else f'{reach:.0f}':>17s} {r['d3rlpy_train_s']:11.0f}"
        )
    sd = out["std_final"]
    reach = out["ours_mean_s_to_d3rlpy_mean_final"]
    print(
        f" mean {mean['ours']:8.1f} {mean['d3rlpy']:8.1f}   (std {sd['ours']:.1f} / {sd['d3rlpy']:.1f}); "
        f"ours' mean curve reaches d3rlpy's mean final score after "
        f"{'never' if reach is None else f'{reach:.0f} s'} of training "
        f"(d3rlpy: {out['d3rlpy_mean_train_s']:.0f} s)"
    )
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["safe-pendulum:medium-replay"], help="task:quality ...")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=5000, help="gradient steps per run (both libraries)")
    ap.add_argument(
        "--preset", default="demo", help="network sizes and learning rates: demo (64x64) or paper (256x256)"
    )
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument(
        "--transitions", type=int, default=100_000, help="rows of generated rollout datasets (medium, expert)"
    )
    ap.add_argument(
        "--behaviour-steps",
        type=int,
        default=None,
        help="steps of the behaviour SAC run (Hopper's default is 300k)",
    )
    ap.add_argument("--data-dir", type=Path, default=Path("data/bench"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--peer-lagrangian",
        action="store_true",
        help="d3rlpy's default Lagrangian alpha instead of a fixed weight",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    base = replace(get_preset(args.preset).cql, learn_cost=False, lagrangian_threshold=None)
    results: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    }
    for key in args.tasks:
        task, _, quality = key.partition(":")
        t, info, path = dataset(
            task, quality or "medium", args.data_dir, args.transitions, args.behaviour_steps
        )
        print(
            f"{key}: {len(t)} transitions, {info.num_episodes} episodes, "
            f"refs random {info.ref_random_return:.1f} / expert {info.ref_expert_return:.1f}; "
            f"preset {args.preset} {base.hidden}"
        )
        runs = {}
        for seed in args.seeds:
            print(f" seed {seed}", flush=True)
            runs[seed] = run_seed(
                t,
                info,
                replace(base, seed=seed),
                args.steps,
                args.eval_every,
                args.eval_episodes,
                args.peer_lagrangian,
            )
            if args.json:  # partial results survive an interrupted run
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results | {key: {"runs": runs}}, indent=2) + "\n")
        results[key] = {"dataset": str(path), "runs": runs, "summary": summarise(key, runs)}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
