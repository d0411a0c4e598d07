"""Training steps per second of our TD3+BC and IQL against d3rlpy 2.8's, side by side in one process.

The same networks, batch and settings as ``bench_offline_algos.py`` (a preset's, through ``peer.py``), on
random-but-fixed data of Hopper's shapes (obs 11, act 3), one torch thread for everyone. A step is what a
training loop does: sample a batch from the library's own replay and update. The contestants run
alternately for several rounds, the order reversed every round, so a burst of load from other processes
hits all of them; the table gives each one's median and the ratio to its peer. Ours run with their cost
critic (what the pipeline trains) and without it (d3rlpy has none).

    .venv-bench/bin/python benchmarks/bench_offline_algos_speed.py --preset demo \\
        [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_offline_algos import quiet_d3rlpy  # noqa: E402
from bench_offline_throughput import interleaved, summary  # noqa: E402
from peer import d3rlpy_iql, d3rlpy_td3bc, random_transitions, to_mdp_dataset  # noqa: E402

from arl_models.algos.iql import IQL  # noqa: E402
from arl_models.algos.td3bc import TD3BC  # noqa: E402
from arl_models.presets import get_preset  # noqa: E402
from arl_models.replay import ActionScaler, ReplayBuffer  # noqa: E402

OBS, ACT = 11, 3


def contestants(preset: str, rows: int, seed: int) -> dict:
    t = random_transitions(rows, OBS, ACT, seed=seed)
    low, high = -np.ones(ACT, np.float32), np.ones(ACT, np.float32)
    buf = ReplayBuffer.from_transitions(t, ActionScaler(low, high))
    quiet_d3rlpy()
    mdp = to_mdp_dataset(t)
    p = get_preset(preset)
    out = {}
    for name, cls, peer in (("td3bc", TD3BC, d3rlpy_td3bc), ("iql", IQL, d3rlpy_iql)):
        cfg = replace(p.offline_config(name), seed=seed)
        for label, learn_cost in (("", False), ("+cost", True)):
            algo = cls(OBS, ACT, replace(cfg, learn_cost=learn_cost))
            out[f"ours/{name}{label}"] = lambda a=algo, b=cfg.batch_size: a.update(buf.sample(b))
        theirs = peer(mdp, cfg, low, high)
        out[f"d3rlpy/{name}"] = lambda a=theirs, b=cfg.batch_size: a.update(mdp.sample_transition_batch(b))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=300, help="steps per contestant per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rates = interleaved(contestants(a.preset, a.rows, 0), a.steps, a.rounds, warmup=50)
    med = summary(rates)
    print(
        f"steps/s, median of {a.rounds} interleaved rounds of {a.steps} steps, preset {a.preset}, one thread"
    )
    for name, r in med.items():
        algo = name.split("/")[1].split("+")[0]
        ratio = r / med[f"d3rlpy/{algo}"]
        print(f"  {name:18s} {r:8.1f}   x{ratio:.2f} of d3rlpy/{algo}")
    if a.json:
        a.json.write_text(json.dumps({"preset": a.preset, "rounds": rates, "median": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()
