"""Benchmark: EWC continual learning over three versions of a task, against naive sequential fine-tuning
(the baseline, trained in the same run from the same start).

The chain: CQL on version 0's dataset, then ``train_continual`` on version 1 (EWC, and naive), then on
version 2 (EWC continuing the EWC chain, naive continuing the naive chain). After each new version
both policies are evaluated on every version; the issue's criteria, checked after each new version
(a chain that never learns a version cannot forget it, so the last step alone can pass vacuously):
mean forgetting with EWC <= 1/3 of naive's, and EWC's new-version score >= 0.9 x naive's.

    for v in 2.0.0 2.1.0 2.2.0; do arl data generate -t safe-pendulum@$v -q expert -o data/cl/pend-$v; done
    python benchmarks/bench_continual.py --task safe-pendulum --data data/cl/pend-2.{0,1,2}.0 --json out.json

Datasets come from ``arl data generate -t TASK@VERSION -q QUALITY`` (one per version, oldest first). The
observed line (2.x: the plant's configuration is in the observation, 2.1.0 reverses the actuators) is
the one where sequential training has something to forget; on the 1.x variants it does not.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def criteria(ewc: dict, naive: dict) -> dict[str, bool]:
    """The issue's two criteria on one step's reports (``train_continual``'s ``ewc`` and ``naive``)."""
    fe, fn = ewc["mean_forgetting"], naive["mean_forgetting"]
    ne, nn = ewc["new_score"], naive["new_score"]
    return {
        "ewc_forgetting_at_most_a_third_of_naive": fe <= fn / 3.0 if fn > 0 else fe <= 0.0,
        "ewc_new_score_at_least_90pct_of_naive": ne >= nn - 0.1 * abs(nn),
    }


def curves(out: Path) -> dict[str, list[float]]:
    """Per-version normalised scores from a stage's ``metrics.jsonl``, with the steps they were taken at."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if any(k.startswith("eval/") for k in r)]
    keys = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith("/normalized_score")})
    return {"step": [r["step"] for r in rows]} | {k.split("/")[1]: [r[k] for r in rows] for k in keys}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="safe-pendulum")
    p.add_argument(
        "--data", type=Path, nargs=3, required=True, help="datasets of three versions, oldest first"
    )
    p.add_argument(
        "--bc-steps",
        type=int,
        default=0,
        help="behaviour-cloning steps on version 0 whose actor starts CQL, as the pipeline does "
        "(0: CQL from scratch)",
    )
    p.add_argument("--cql-steps", type=int, default=3000, help="CQL steps on version 0")
    p.add_argument("--steps", type=int, default=2000, help="offline steps per new version")
    p.add_argument("--n-action-samples", type=int, default=4)
    p.add_argument(
        "--conservative-weight",
        type=float,
        help="CQL's conservative weight, every stage of both chains (default: CQLConfig's, 5)",
    )
    p.add_argument("--actor-lr", type=float, default=3e-4, help="actor and temperature learning rate")
    p.add_argument(
        "--actor-warmup",
        type=int,
        default=0,
        help="steps of each stage in which the actor imitates the data while the critics learn",
    )
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    p.add_argument(
        "--context-dim",
        type=int,
        help="trailing observation entries that FiLM-condition the networks (default: the task's, "
        "3 on the 2.x versions; 0: unconditioned, as before stop 21)",
    )
    p.add_argument(
        "--context-lr-scale",
        type=float,
        help="the FiLM weights' learning rate as a multiple of their network's, both chains (default: "
        "SACConfig's, 30; 1 as before stop 22)",
    )
    p.add_argument("--ewc-weight", type=float, help="EWC penalty weight (default: EWCConfig's)")
    p.add_argument(
        "--decay", type=float, help="online EWC decay of the accumulated Fisher (default: EWCConfig's, 0.9)"
    )
    p.add_argument(
        "--ewc-networks",
        nargs="+",
        help="networks the EWC penalty holds, of actor, critic, cost_critic "
        "(default: all; the policy alone: actor)",
    )
    p.add_argument(
        "--rehearsal",
        type=float,
        default=0.0,
        help="share of each EWC-chain batch drawn from the earlier versions' data (naive never rehearses; "
        "with --ewc-weight 0 this is rehearsal alone)",
    )
    p.add_argument("--online-steps", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also evaluate both chains on every version each this many steps of a stage "
        "(curves in the JSON)",
    )
    p.add_argument(
        "--no-constraint",
        action="store_true",
        help="train the chain without the offline cost constraint, so scores measure forgetting alone",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/arl-bench-continual"))
    p.add_argument(
        "--resume", action="store_true", help="continue the run already in --workdir (default: refuse it)"
    )
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    # every stage resumes what it finds there
    if a.workdir.is_dir() and any(a.workdir.iterdir()) and not a.resume:
        p.error(
            f"{a.workdir} already holds a run that would be resumed; pass --resume to continue it, "
            "or another --workdir"
        )

    import torch

    torch.set_num_threads(1)
    from arl_models.algos.bc import BCConfig
    from arl_models.algos.cql import CQLConfig
    from arl_models.algos.ewc import NETWORKS, EWCConfig
    from arl_models.continual import ContinualConfig, train_continual
    from arl_models.offline import train_bc, train_cql
    from arl_models.presets import with_given

    t0 = time.perf_counter()
    a.workdir.mkdir(parents=True, exist_ok=True)
    start = a.workdir / "v0-cql"
    cql = with_given(
        CQLConfig(
            hidden=tuple(a.hidden),
            n_action_samples=a.n_action_samples,
            actor_lr=a.actor_lr,
            temp_lr=a.actor_lr,
            actor_warmup_steps=a.actor_warmup,
        ),
        context_lr_scale=a.context_lr_scale,
        conservative_weight=a.conservative_weight,
    )
    bc = None
    if a.bc_steps > 0:
        bc = a.workdir / "v0-bc"
        train_bc(
            a.data[0],
            bc,
            steps=a.bc_steps,
            seed=a.seed,
            config=BCConfig(hidden=tuple(a.hidden)),
            progress=False,
            eval_episodes=0,
            context_dim=a.context_dim,
        )
    train_cql(
        a.data[0],
        start,
        steps=a.cql_steps,
        seed=a.seed,
        config=cql,
        progress=False,
        eval_episodes=0,
        init_actor=bc,
        constrained=not a.no_constraint,
        context_dim=a.context_dim,
    )
    ewc = with_given(
        EWCConfig(seed=a.seed, networks=tuple(a.ewc_networks or NETWORKS)), weight=a.ewc_weight, decay=a.decay
    )
    cfg = ContinualConfig(
        seed=a.seed,
        steps=a.steps,
        ewc=ewc,
        rehearsal=a.rehearsal,
        online_steps=a.online_steps,
        eval_episodes=a.eval_episodes,
        eval_every=a.eval_every,
    )
    ewc_from, naive_from, steps = start, start, []
    for k in (1, 2):
        out = a.workdir / f"v{k}"
        rep = train_continual(
            ewc_from,
            a.data[k],
            out,
            previous=list(a.data[:k]),
            naive_from=naive_from,
            config=cfg,
            progress=False,
        )
        steps.append(
            {
                name: {
                    key: rep[name][key]
                    for key in (
                        "start_scores",
                        "scores",
                        "forgetting",
                        "mean_forgetting",
                        "new_score",
                        "best_earlier",
                    )
                }
                for name in ("ewc", "naive")
            }
            | {
                "forgetting_ratio": rep["forgetting_ratio"],
                "new_score_ratio": rep["new_score_ratio"],
                "criteria": criteria(rep["ewc"], rep["naive"]),
            }
        )
        if a.eval_every:
            steps[-1]["curves"] = {"ewc": curves(out), "naive": curves(out / "naive")}
        print(json.dumps(steps[-1], indent=2), flush=True)
        ewc_from, naive_from = out, out / "naive"
    report = {
        "task": a.task,
        "datasets": [str(d) for d in a.data],
        "settings": vars(a)
        | {
            "data": [str(d) for d in a.data],
            "workdir": str(a.workdir),
            "json": str(a.json),
            "ewc_weight": ewc.weight,
            "decay": ewc.decay,
            "conservative_weight": cql.conservative_weight,
            "context_lr_scale": cql.context_lr_scale,
        },
        "steps": steps,
        "criteria": {k: all(st["criteria"][k] for st in steps) for k in steps[0]["criteria"]},
        "wall_s": time.perf_counter() - t0,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
