"""Prioritised replay: our ``PrioritizedReplay`` against TorchRL's ``PrioritizedReplayBuffer``, one process.

Both hold ``--capacity`` transitions (Hopper's shapes: obs 11, act 3, plus reward, cost, next obs and
done, float32) and use the same alpha and beta. One "batch" is what a learner does each step: draw
``--batch`` transitions by priority, gather their tensors, and write back new priorities (random
``|TD error|``, the same pool for both). TorchRL: ``PrioritizedReplayBuffer(alpha, beta,
storage=LazyTensorStorage(capacity))``, ``sample(return_info=True)`` then ``update_priority(index, td)``
(its C++ sum and min segment trees). Ours: ``sample`` then ``update_priorities`` with the buffer-minimum
normalisation of the IS weights, as TorchRL's. After a warm-up the contestants run alternately for
``--rounds`` rounds of ``--seconds`` each (the order flips every round, so load from other processes
falls on both); we print every round, the median batches/s of each and the ratio.

TorchRL's compiled extension does not load beside this project's torch 2.13.0+cpu; it does beside
torch 2.14.1, so the benchmark runs in its own environment (``make bench-torchrl-env``)::

    .venv-torchrl/bin/python benchmarks/bench_replay.py [--rounds 5] [--seconds 3] [--json out.json]

Without TorchRL importable it times ours alone and says so. Extra contestants of ours (not in the ratio):
``--extra`` adds freshness on (half-life 100k insertions) and batch-max normalisation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from arl_models.prioritized import PERConfig, PrioritizedReplay, half_life_freshness

OBS, ACT = 11, 3
FIELDS = {"obs": (OBS,), "act": (ACT,), "rew": (), "cost": (), "next_obs": (OBS,), "done": ()}


def make_rows(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.rand((n, *s), generator=g) for k, s in FIELDS.items()}


def ours(
    rows: dict[str, torch.Tensor], cfg: PERConfig, batch: int, tds: list[torch.Tensor]
) -> Callable[[], None]:
    n = len(rows["rew"])
    per = PrioritizedReplay(n, OBS, ACT, cfg)
    per.add(**{k: v.numpy() for k, v in rows.items()})
    it = iter(range(1 << 62))

    def step() -> None:
        b, idx, w = per.sample(batch)
        per.update_priorities(idx, tds[next(it) % len(tds)])

    return step


def torchrl_peer(
    rows: dict[str, torch.Tensor], alpha: float, beta: float, batch: int, tds: list[torch.Tensor]
) -> Callable[[], None]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    n = len(rows["rew"])
    rb = PrioritizedReplayBuffer(alpha=alpha, beta=beta, storage=LazyTensorStorage(n), batch_size=batch)
    rb.extend(TensorDict(dict(rows), batch_size=[n]))
    it = iter(range(1 << 62))

    def step() -> None:
        s, info = rb.sample(return_info=True)
        rb.update_priority(info["index"], tds[next(it) % len(tds)])

    return step


def rate(step: Callable[[], None], seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        step()
        n += 1
    return n / elapsed


def torchrl_status() -> str | None:
    """``None`` when TorchRL and its prioritised sampler load, else why not."""
    try:
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401  # the compiled segment trees
        from torchrl.data import PrioritizedReplayBuffer  # noqa: F401
    except Exception as e:  # noqa: BLE001  # any import failure means: ours alone
        return f"{type(e).__name__}: {e}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--beta", type=float, default=0.4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--extra", action="store_true", help="also time ours with freshness and with batch-max weights"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    load0 = os.getloadavg()
    rows = make_rows(args.capacity)
    g = torch.Generator().manual_seed(1)
    tds = [torch.empty(args.batch).exponential_(generator=g) for _ in range(64)]
    base = PERConfig(alpha=args.alpha, beta=args.beta)
    contestants = {"ours": ours(rows, base, args.batch, tds)}
    why = torchrl_status()
    if why is None:
        import torchrl

        contestants["torchrl"] = torchrl_peer(rows, args.alpha, args.beta, args.batch, tds)
        peer = f"torchrl {torchrl.__version__}"
    else:
        peer = None
        print(
            f"TorchRL is not importable here ({why}): timing ours alone. "
            "Run it in .venv-torchrl (make bench-torchrl-env) for the comparison."
        )
    if args.extra:
        contestants["ours+freshness"] = ours(
            rows,
            PERConfig(alpha=args.alpha, beta=args.beta, freshness=half_life_freshness(100_000)),
            args.batch,
            tds,
        )
        contestants["ours(batch-max w)"] = ours(
            rows, PERConfig(alpha=args.alpha, beta=args.beta, normalize="batch"), args.batch, tds
        )
    print(
        f"capacity {args.capacity:,}  batch {args.batch}  alpha {args.alpha}  beta {args.beta}  "
        f"torch {torch.__version__} ({args.threads} thread)  {peer or 'no peer'}  load {load0[0]:.2f}"
    )
    for step in contestants.values():
        rate(step, 0.5)  # warm-up
    results: dict[str, list[float]] = {k: [] for k in contestants}
    for r in range(args.rounds):
        names = list(contestants) if r % 2 == 0 else list(reversed(contestants))
        for name in names:
            results[name].append(rate(contestants[name], args.seconds))
        print(
            f"round {r + 1}: "
            + "  ".join(f"{k} {v[-1]:.0f}/s" for k, v in results.items())
            + f"  load {os.getloadavg()[0]:.2f}"
        )
    med = {k: statistics.median(v) for k, v in results.items()}
    print("median batches/s: " + "  ".join(f"{k} {v:.0f}" for k, v in med.items()))
    out = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "rounds": results,
        "median": med,
        "load_before": load0,
        "load_after": os.getloadavg(),
        "torch": torch.__version__,
        "peer": peer,
    }
    if "torchrl" in med:
        per_round = [a / b for a, b in zip(results["ours"], results["torchrl"], strict=True)]
        out["ratio"] = med["ours"] / med["torchrl"]
        out["ratio_per_round"] = per_round
        print("ratio per round: " + " ".join(f"{x:.2f}" for x in per_round))
        print(
            f"ratio ours / torchrl: {out['ratio']:.2f}x of the medians, {statistics.median(per_round):.2f}x "
            "median of the rounds (target >= 5x)"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
