"""Offline learning quality: our stage-2 algorithms against d3rlpy 2.8's, side by side, on given datasets.

Every job is one (dataset, seed, learner) run in a worker process of its own (one thread): it trains for
``--steps`` gradient steps in chunks of ``--eval-every``, and after each chunk (and before the first)
evaluates the deterministic policy with our :func:`arl_models.evaluate.evaluate` on the dataset's task,
the same episodes and environment seeds (``EVAL_SEED``) for every learner. Only training is timed.

Ours run as the pipeline runs them: the preset's configs, a cost critic, held to the dataset's cost
budget (``held_to_budget``; ``--unconstrained`` lifts the constraint, the cost critic still learns),
with ``--bc-init`` starting from a BC actor trained here first (its seconds are reported apart, not in
the training time). A step is ``algo.update(buffer.sample(B))``, what ``fit`` does without checkpoints.
d3rlpy's learners get the same networks, batch sizes, learning rates and algorithm settings
(``peer.py``, with the differences that remain listed there) and step by ``update`` on batches of their
own sampler, so they write no logs. Our CQL keeps a fixed conservative weight, so d3rlpy's gets
``alpha_learning_rate=0`` unless our config sets ``lagrangian_threshold``.

"Time to reach": for each of our learners, the first training time at which its evaluation reached the
best final score of the peers on the same dataset and seed, and its ratio to that peer's training time.

    .venv-bench/bin/python benchmarks/bench_offline_algos.py --data data/pend-medium data/hopper-medium \
        --seeds 0 1 2 --steps 20000 --eval-every 5000 --ours bc td3bc iql --peers td3bc iql --bc-init \
        --workers 2 --json benchmarks/results/offline_algos.json
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import logging
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer import (  # noqa: E402
    d3rlpy_act_fn,
    d3rlpy_bc,
    d3rlpy_cql_like,
    d3rlpy_iql,
    d3rlpy_rebrac,
    d3rlpy_td3bc,
    to_mdp_dataset,
)

from arl_models.data.dataset import DatasetInfo, Transitions, read_dataset  # noqa: E402
from arl_models.envs.registry import get_task  # noqa: E402
from arl_models.evaluate import EVAL_SEED, evaluate  # noqa: E402
from arl_models.nets import obs_standardization  # noqa: E402
from arl_models.offline import OFFLINE_CLASSES, bc_learner, conditioning, held_to_budget  # noqa: E402
from arl_models.presets import get_preset  # noqa: E402
from arl_models.replay import ActionScaler, ReplayBuffer  # noqa: E402

LEARNERS = ("bc", "td3bc", "iql", "cql", "rebrac")


@dataclass(frozen=True)
class Job:
    data: str
    seed: int
    side: str
    """``ours`` or ``d3rlpy``."""
    learner: str
    steps: int
    eval_every: int
    episodes: int
    preset: str
    bc_steps: int
    """Steps of the BC actor our td3bc/iql/cql/rebrac start from; 0: from scratch."""
    constrained: bool
    overrides: tuple[tuple[str, Any], ...] = ()
    """Fields replaced in the preset's config of this learner, ours and d3rlpy's alike (``--set``)."""

    @property
    def name(self) -> str:
        return f"{self.side}/{self.learner}"


def refs_of(info: DatasetInfo) -> tuple[float, float] | None:
    if info.ref_random_return is None or info.ref_expert_return is None:
        return None
    return info.ref_random_return, info.ref_expert_return


def build_ours(job: Job, t: Transitions, info: DatasetInfo) -> tuple[Callable[[], Any], Callable, float]:
    """``(step, act, bc_init_s)``: one gradient step, environment actions, seconds of the BC start."""
    p = get_preset(job.preset)
    scaler = ActionScaler.of(info.action_low, info.action_high)
    needs_next = getattr(OFFLINE_CLASSES.get(job.learner), "next_actions", False)
    buffer = ReplayBuffer.from_transitions(t, scaler, next_actions=needs_next)
    ctx = conditioning(info, None)
    bc_cfg = replace(p.bc, seed=job.seed, context_dim=ctx)
    bc_init_s = 0.0
    if job.learner == "bc":
        algo: Any = bc_learner(bc_cfg, info, t)
    else:
        cfg = replace(config_of(job), seed=job.seed, context_dim=ctx)
        algo = held_to_budget(OFFLINE_CLASSES[job.learner], cfg, info, t, job.constrained)
        if job.bc_steps:
            t0 = time.perf_counter()
            bc = bc_learner(bc_cfg, info, t)
            for _ in range(job.bc_steps):
                bc.update(buffer.sample(bc_cfg.batch_size))
            if not algo.warm_start_actor(bc.actor.state_dict()):
                raise ValueError(f"no BC actor weights match {job.learner}'s actor")
            bc_init_s = time.perf_counter() - t0
    batch_size = algo.cfg.batch_size
    return (
        lambda: algo.update(buffer.sample(batch_size)),
        lambda o: scaler.unnormalize(algo.act(o)),
        bc_init_s,
    )


def config_of(job: Job) -> Any:
    """The preset's config of the job's learner with the job's overrides."""
    return replace(getattr(get_preset(job.preset), job.learner), **dict(job.overrides))


def quiet_d3rlpy() -> Any:
    """d3rlpy, imported without gym's deprecation notice and with its info logs (dataset signatures) off."""
    with contextlib.redirect_stderr(io.StringIO()):
        import d3rlpy
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return d3rlpy


def build_peer(job: Job, t: Transitions, info: DatasetInfo) -> tuple[Callable[[], Any], Callable]:
    d3rlpy = quiet_d3rlpy()
    p = get_preset(job.preset)
    d3rlpy.seed(job.seed)
    data = to_mdp_dataset(t)
    low, high = np.asarray(info.action_low, np.float32), np.asarray(info.action_high, np.float32)
    cfg: Any = p.bc if job.learner == "bc" else config_of(job)
    stats = obs_standardization(t.obs, conditioning(info, None)) if cfg.normalize_obs else None
    if job.learner == "bc":
        algo = d3rlpy_bc(
            data,
            hidden=cfg.hidden,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            action_low=low,
            action_high=high,
            policy_type="stochastic" if cfg.policy == "gaussian" else "deterministic",
            obs_stats=stats,
        )
    elif job.learner == "td3bc":
        algo = d3rlpy_td3bc(data, cfg, low, high, stats)
    elif job.learner == "iql":
        algo = d3rlpy_iql(data, cfg, low, high, stats)
    elif job.learner == "rebrac":
        algo = d3rlpy_rebrac(data, cfg, low, high, stats)
    else:
        alpha_lr = 0.0 if cfg.lagrangian_threshold is None else cfg.alpha_lr
        algo = d3rlpy_cql_like(
            data, cfg, alpha_lr=alpha_lr, action_low=low, action_high=high, obs_stats=stats
        )
    return lambda: algo.update(data.sample_transition_batch(cfg.batch_size)), d3rlpy_act_fn(algo)


def run_job(job: Job) -> dict[str, Any]:
    """Train one learner in chunks; returns its curve of (step, train_s, return, score, cost)."""
    t, info = read_dataset(job.data)
    spec = get_task(info.task, info.env_version)
    refs = refs_of(info)
    bc_init_s = 0.0
    if job.side == "ours":
        step, act, bc_init_s = build_ours(job, t, info)
    else:
        step, act = build_peer(job, t, info)

    def point(n: int, train_s: float) -> dict[str, float]:
        res = evaluate(act, spec, job.episodes, seed=EVAL_SEED, ref_scores=refs)
        score = res.mean_return if res.normalized_score is None else res.normalized_score
        return {
            "step": n,
            "train_s": train_s,
            "return": res.mean_return,
            "score": score,
            "cost": res.mean_cost,
        }

    curve = [point(0, 0.0)]
    done, wall = 0, 0.0
    while done < job.steps:
        n = min(job.eval_every, job.steps - done)
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        wall += time.perf_counter() - t0
        done += n
        curve.append(point(done, wall))
    return asdict(job) | {"name": job.name, "curve": curve, "train_s": wall, "bc_init_s": bc_init_s}


def _init_worker() -> None:
    torch.set_num_threads(1)


def time_to_reach(run: dict[str, Any], target: float) -> float | None:
    """Training seconds, the BC start's included, of the first evaluation at or above ``target`` (``None``:
    never). The evaluation before training counts only for a run that started from a BC actor (an untrained
    one's is luck)."""
    curve = run["curve"] if run["bc_steps"] and run["learner"] != "bc" else run["curve"][1:]
    return next((run["bc_init_s"] + p["train_s"] for p in curve if p["score"] >= target), None)


def data_score(t: Transitions, info: DatasetInfo) -> float:
    """The dataset's own mean episode return, normalised with its references where it has them."""
    ret = float(t.episode_returns().mean())
    return ret if refs_of(info) is None else info.normalized_score(ret)


def report(data: str, meta: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the dataset's table and return its summary (per learner, and time to reach d3rlpy's best)."""
    seeds = sorted({r["seed"] for r in runs})
    by = {(r["name"], r["seed"]): r for r in runs}
    names = sorted({r["name"] for r in runs}, key=lambda n: (n.split("/")[0] != "ours", n))
    learners: dict[str, Any] = {}
    for name in names:
        rs = [by[(name, s)] for s in seeds if (name, s) in by]
        learners[name] = {
            "final": {r["seed"]: r["curve"][-1]["score"] for r in rs},
            "best": statistics.fmean(max(p["score"] for p in r["curve"]) for r in rs),
            "cost": statistics.fmean(r["curve"][-1]["cost"] for r in rs),
            "train_s": statistics.fmean(r["train_s"] for r in rs),
            "bc_init_s": statistics.fmean(r["bc_init_s"] for r in rs),
        }
    reach: dict[str, dict[int, Any]] = {}
    for s in seeds:
        peers = [by[(n, s)] for n in names if n.startswith("d3rlpy/") and (n, s) in by]
        if not peers:
            continue
        top = max(peers, key=lambda r: r["curve"][-1]["score"])
        target = top["curve"][-1]["score"]
        for name in (n for n in names if n.startswith("ours/") and (n, s) in by):
            secs = time_to_reach(by[(name, s)], target)
            reach.setdefault(name, {})[s] = {
                "peer": top["name"],
                "target": target,
                "peer_train_s": top["train_s"],
                "train_s": secs,
                "ratio": None if secs is None else secs / max(top["train_s"], 1e-9),
            }
    has_refs = meta["ref_random_return"] is not None and meta["ref_expert_return"] is not None
    unit = "normalised score" if has_refs else "return (no references)"
    print(
        f"\n== {data}: {meta['task']}@{meta['env_version']}, {meta['quality']}, {meta['transitions']} rows; "
        f"data {meta['data_score']:.1f} (cost {meta['data_mean_cost']:.1f}, budget {meta['cost_budget']}); "
        f"{unit} after the same steps =="
    )
    print(
        f"{'learner':14s} {'final mean ± std':>16s}  {'per seed':22s} {'best':>7s} {'cost':>7s} "
        f"{'train s':>8s} {'init s':>6s}  time to reach d3rlpy's best final (s, x its time)"
    )
    for name, row in learners.items():
        finals = list(row["final"].values())
        mean_std = f"{statistics.fmean(finals):7.1f} ± {statistics.pstdev(finals):5.1f}"
        per_seed = " ".join(f"{v:.1f}" for v in finals)
        to_best = "  ".join(
            f"s{s}: " + ("not reached" if r["train_s"] is None else f"{r['train_s']:.1f} ({r['ratio']:.2f}x)")
            for s, r in reach.get(name, {}).items()
        )
        print(
            f"{name:14s} {mean_std:>16s}  {per_seed:22s} {row['best']:7.1f} {row['cost']:7.1f} "
            f"{row['train_s']:8.1f} {row['bc_init_s']:6.1f}  {to_best}"
        )
    return {"learners": learners, "time_to_peer_best": reach}


def dataset_meta(path: str) -> dict[str, Any]:
    t, info = read_dataset(path)
    get_task(info.task, info.env_version)  # fails here, not in a worker, for an unregistered task
    return {
        "task": info.task,
        "env_version": info.env_version,
        "quality": info.quality,
        "transitions": len(t),
        "episodes": int(len(np.unique(t.episode_id))),
        "ref_random_return": info.ref_random_return,
        "ref_expert_return": info.ref_expert_return,
        "cost_budget": info.cost_budget,
        "data_score": data_score(t, info),
        "data_mean_cost": float(t.episode_costs().mean()),
    }


def parse_set(items: list[str]) -> dict[str, dict[str, Any]]:
    """``LEARNER.FIELD=VALUE`` items as ``{learner: {field: value}}``, each value a Python literal (a bare
    word stays a string); a field the learner's config lacks is refused here, not in a worker."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, _, text = item.partition("=")
        learner, _, field = key.partition(".")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if learner not in LEARNERS or field not in {
            f.name for f in fields(getattr(get_preset("demo"), learner))
        }:
            raise SystemExit(f"--set {item}: {learner!r} has no config field {field!r}")
        out.setdefault(learner, {})[field] = value
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="dataset directories (arl data generate/import)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20_000, help="gradient steps of every learner")
    ap.add_argument("--eval-every", type=int, default=5_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--preset", default="demo", help="configs and networks: demo (64x64), paper (256x256)")
    ap.add_argument("--ours", nargs="*", default=["bc", "td3bc", "iql"], choices=LEARNERS)
    ap.add_argument("--peers", nargs="*", default=["td3bc", "iql"], choices=LEARNERS, help="d3rlpy's")
    ap.add_argument("--bc-init", action="store_true", help="our td3bc/iql/cql/rebrac start from our BC actor")
    ap.add_argument("--bc-steps", type=int, default=None, help="steps of that BC actor (default: preset's)")
    ap.add_argument("--unconstrained", action="store_true", help="ours not held to the cost budget")
    ap.add_argument("--workers", type=int, default=2, help="processes, one thread each")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="LEARNER.FIELD=VALUE",
        help="replace a field of a learner's preset config, ours and d3rlpy's (the value a Python literal: "
        "rebrac.batch_size=1024 rebrac.hidden=(256,256))",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    bc_steps = args.bc_steps or get_preset(args.preset).bc_steps if args.bc_init else 0
    metas = {d: dataset_meta(d) for d in args.data}
    common = dict(
        steps=args.steps,
        eval_every=args.eval_every,
        episodes=args.eval_episodes,
        preset=args.preset,
        bc_steps=bc_steps,
        constrained=not args.unconstrained,
    )
    overrides = parse_set(args.set)
    jobs = [
        Job(d, s, side, learner, **common, overrides=tuple(overrides.get(learner, {}).items()))  # type: ignore[arg-type]
        for d in args.data
        for s in args.seeds
        for side, names in (("ours", args.ours), ("d3rlpy", args.peers))
        for learner in names
    ]
    results: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "datasets": {d: {"meta": m, "runs": []} for d, m in metas.items()},
    }

    def write() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    print(
        f"{len(jobs)} jobs ({len(args.data)} datasets x {len(args.seeds)} seeds x "
        f"{len(args.ours) + len(args.peers)} learners) on {args.workers} workers",
        flush=True,
    )
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=_init_worker) as pool:
        for i, r in enumerate(pool.imap_unordered(run_job, jobs), 1):
            results["datasets"][r["data"]]["runs"].append(r)
            write()  # partial results survive an interrupted run
            print(
                f"[{i}/{len(jobs)} {time.perf_counter() - t0:6.0f} s] {Path(r['data']).name} "
                f"seed {r['seed']} {r['name']}: final {r['curve'][-1]['score']:.1f}, {r['train_s']:.1f} s",
                flush=True,
            )
    for d, entry in results["datasets"].items():
        entry["summary"] = report(d, entry["meta"], entry["runs"])
    write()
    return results


if __name__ == "__main__":
    main()
