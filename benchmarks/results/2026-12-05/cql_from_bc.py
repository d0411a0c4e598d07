"""How CQL moves a behaviour-cloned actor: its score on the data's version every 2,500 steps (demo preset).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/results/2026-12-05/cql_from_bc.py BC_DIR DATA OUT \
        '{"conservative_weight": 20.0}'

The JSON sets CQLConfig fields over the continual benchmark's (64x64, 4 action samples, actor rate 3e-4);
no offline cost constraint, seed 0, 30 evaluation episodes, 10k steps unless it sets ``steps``.
"""

import json
import sys
import time
from pathlib import Path

import torch

from arl_models.algos.cql import CQLConfig
from arl_models.offline import train_cql


def main() -> None:
    torch.set_num_threads(1)
    bc, data, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    overrides = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    steps = overrides.pop("steps", 10_000)
    cfg = CQLConfig(
        **{"hidden": (64, 64), "n_action_samples": 4, "actor_lr": 3e-4, "temp_lr": 3e-4, **overrides}
    )
    t0 = time.perf_counter()
    train_cql(
        data,
        out,
        steps=steps,
        seed=0,
        config=cfg,
        progress=False,
        eval_episodes=30,
        init_actor=bc,
        constrained=False,
    )
    with open(out / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    scores = [(r["step"], round(r["eval/normalized_score"], 1)) for r in rows if "eval/normalized_score" in r]
    print(out.name, overrides, scores, f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
