"""Offline throughput: our CQL and BC against d3rlpy 2.8's, side by side in one process.

Same networks (actor and critics 256x256, 2 critics), batch 256, 10 action samples, obs 11 / act 3
(Hopper's shapes), the ``paper`` preset's learning rates, on the same random-but-fixed data, two torch
threads for both. After a warm-up, the contestants run alternately for several rounds (the order flips
each round, so a burst of load from other processes hits both); we report the median steps/s and the
ratio. A "step" is what a training loop does: sample a batch and take one gradient step. The update
alone (batches sampled beforehand) is timed too, to separate the batch assembly from the maths.

The physical limit is the machine's float32 GEMM rate, measured here through torch at the shapes the
critic sees (7680x256 @ 256x256, the fused ensemble's 2 x 7936x256 @ 256x256) and at 4096^3. Our
CQL update's FLOPs are counted analytically (:func:`cql_update_flops`); their rate over the GEMM rate
is the share of the limit reached.

    .venv-bench/bin/python benchmarks/bench_offline_throughput.py [--rounds 7] [--json out.json] \\
        [--profile 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer import d3rlpy_bc, d3rlpy_cql_like, random_transitions, to_mdp_dataset  # noqa: E402

from arl_models.algos.bc import BC  # noqa: E402
from arl_models.algos.cql import CQL  # noqa: E402
from arl_models.presets import get_preset  # noqa: E402
from arl_models.replay import ActionScaler, ReplayBuffer  # noqa: E402

OBS, ACT = 11, 3


# ---- the physical limit -----------------------------------------------------------------------------
def gemm_rate(shape: tuple[int, ...], seconds: float = 1.0) -> float:
    """float32 GFLOP/s of ``torch.mm`` (m, k, n) or ``torch.bmm`` (e, m, k, n), timed for about
    ``seconds``."""
    if len(shape) == 3:
        m, k, n = shape
        a, b = torch.randn(m, k), torch.randn(k, n)
        fn, flops = (lambda: torch.mm(a, b)), 2.0 * m * k * n
    else:
        e, m, k, n = shape
        a, b = torch.randn(e, m, k), torch.randn(e, k, n)
        fn, flops = (lambda: torch.bmm(a, b)), 2.0 * e * m * k * n
    for _ in range(3):
        fn()
    iters, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        fn()
        iters += 1
    return flops * iters / elapsed / 1e9


GEMM_SHAPES = {
    "7680x256x256": (7680, 256, 256),
    "2x7936x256x256": (2, 7936, 256, 256),
    "4096^3": (4096, 4096, 4096),
}


def gemm_rates(reps: int = 3) -> dict[str, float]:
    """Best of ``reps`` (other processes share the cores: the best is the closest to the machine's limit)."""
    return {name: max(gemm_rate(s) for _ in range(reps)) for name, s in GEMM_SHAPES.items()}


# ---- analytic FLOPs -----------------------------------------------------------------------------------
def _mlp_flops(dims: list[int]) -> int:
    """Multiply-adds x 2 of one row through Linear layers ``dims[0] -> dims[1] -> ...``."""
    return 2 * sum(i * o for i, o in zip(dims[:-1], dims[1:], strict=True))


def cql_update_flops(
    obs: int, act: int, hidden: tuple[int, ...], e: int, b: int, n: int, cost_critic: bool = False
) -> dict[str, int]:
    """Matmul FLOPs of one CQL update (element-wise ops, Adam and log-sum-exp not counted: < 1%).

    A Linear layer's backward costs twice its forward (input and weight gradients), except the first
    layer of a network whose input needs no gradient (no input gradient there). Per step:

    - ``pi(s')`` for the TD target (B rows) and the target critics (E x B rows), no gradient;
    - ``pi(s)`` and ``pi(s')`` for the CQL samples (2BN rows), no gradient;
    - the critics on data + uniform + pi(s) + pi(s') actions (E x (B + 3BN) rows), forward and backward;
    - the actor loss: actor forward/backward (B rows), critics forward and input-gradient only (frozen).
    """
    c = _mlp_flops([obs + act, *hidden, 1])
    a = _mlp_flops([obs, *hidden]) + 2 * 2 * hidden[-1] * act  # trunk + mu and log_std heads
    c_first, a_first = 2 * (obs + act) * hidden[0], 2 * obs * hidden[0]
    rows = e * (b + 3 * b * n)
    out = {
        "target_policy": b * a,
        "target_critics": e * b * c,
        "cql_policy_samples": 2 * b * n * a,
        "critic_forward": rows * c,
        "critic_backward": rows * (2 * c - c_first),
        "actor_forward_backward": b * a + b * (2 * a - a_first),
        "actor_loss_critics": e * b * c * 2,
    }
    if cost_critic:
        out["cost_critic"] = e * b * c + e * b * c + e * b * (2 * c - c_first) + e * b * c * 2
    out["total"] = sum(out.values())
    return out


def bc_update_flops(obs: int, act: int, hidden: tuple[int, ...], b: int) -> int:
    a = _mlp_flops([obs, *hidden]) + 2 * 2 * hidden[-1] * act
    return b * a + b * (2 * a - 2 * obs * hidden[0])


# ---- timing -------------------------------------------------------------------------------------------
def rate(fn: Callable[[], object], steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return steps / (time.perf_counter() - t0)


def interleaved(
    contestants: dict[str, Callable[[], object]], steps: int, rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Steps/s of each contestant per round, running them alternately (order reversed every round)."""
    names = list(contestants)
    for name in names:
        rate(contestants[name], warmup)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(rate(contestants[name], steps))
    return out


def summary(rates: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in rates.items()}


# ---- the contestants ----------------------------------------------------------------------------------
def build(data_rows: int, seed: int, cost_critic: bool, preset: str = "paper"):
    t = random_transitions(data_rows, OBS, ACT, seed=seed)
    scaler = ActionScaler(-np.ones(ACT, np.float32), np.ones(ACT, np.float32))
    buf = ReplayBuffer.from_transitions(t, scaler)
    mdp = to_mdp_dataset(t)
    p = get_preset(preset)
    cql_cfg = replace(p.cql, seed=seed, learn_cost=False)
    ours = CQL(OBS, ACT, cql_cfg)
    ours_cost = CQL(OBS, ACT, replace(cql_cfg, learn_cost=True)) if cost_critic else None
    ours_bf16 = CQL(OBS, ACT, replace(cql_cfg, critic_precision="bfloat16"))
    peer = d3rlpy_cql_like(mdp, p.cql, alpha_lr=1e-4)  # d3rlpy's default: Lagrangian alpha
    bc_ours = BC(OBS, ACT, replace(p.bc, seed=seed))
    bc_peer = d3rlpy_bc(
        mdp, hidden=p.bc.hidden, batch_size=p.bc.batch_size, lr=p.bc.lr, policy_type="stochastic"
    )
    return buf, mdp, ours, ours_cost, ours_bf16, peer, bc_ours, bc_peer, cql_cfg


def profile_ours(algo: CQL, buf: ReplayBuffer, steps: int, rows: int = 30) -> str:
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(3):
        algo.update(buf.sample(256))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("sample"):
                batch = buf.sample(256)
            with record_function("update"):
                algo.update(batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--steps", type=int, default=15, help="CQL gradient steps per contestant per round (BC: 10x)"
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--preset", default="paper", help="network sizes and learning rates of both (paper: 256x256)"
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=100_000, help="transitions in the random dataset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-cost-critic",
        action="store_true",
        help="skip our CQL with its cost critic (extra work d3rlpy lacks)",
    )
    ap.add_argument(
        "--profile", type=int, default=0, help="then profile N steps of our CQL with torch.profiler"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    import d3rlpy

    print(f"torch {torch.__version__}, d3rlpy {d3rlpy.__version__}, threads {torch.get_num_threads()}")
    gemm_before = gemm_rates()
    buf, mdp, ours, ours_cost, ours_bf16, peer, bc_ours, bc_peer, cfg = build(
        args.rows, args.seed, not args.no_cost_critic, args.preset
    )
    B = cfg.batch_size

    cql = {
        "ours": lambda: ours.update(buf.sample(B)),
        "d3rlpy": lambda: peer.update(mdp.sample_transition_batch(B)),
    }
    # the fused critic pass under bf16 autocast (float32 weights and losses): an opt-in precision, timed
    # only where the CPU computes bf16 natively (AVX512-BF16 / AMX); elsewhere it is emulated, ~7x slower
    cpu = {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    }
    bf16_native = cpu["native_bf16"]
    print(f"CPU capability {cpu['capability']}, native bf16: {bf16_native}")
    if bf16_native:
        cql["ours_bf16_critic"] = lambda: ours_bf16.update(buf.sample(B))
    if ours_cost is not None:
        cql["ours+cost_critic"] = lambda: ours_cost.update(buf.sample(B))
    cql_rates = interleaved(cql, args.steps, args.rounds, args.warmup)

    # the update alone, batches sampled beforehand
    ours_batches = [buf.sample(B) for _ in range(args.steps)]
    peer_batches = [mdp.sample_transition_batch(B) for _ in range(args.steps)]
    it = {"ours": iter([]), "d3rlpy": iter([])}

    def cycle(name, batches, fn):
        def step():
            try:
                b = next(it[name])
            except StopIteration:
                it[name] = iter(batches)
                b = next(it[name])
            fn(b)

        return step

    upd_rates = interleaved(
        {
            "ours": cycle("ours", ours_batches, ours.update),
            "d3rlpy": cycle("d3rlpy", peer_batches, peer.update),
        },
        args.steps,
        max(3, args.rounds // 2),
        0,
    )
    sample_ms = {
        "ours": 1e3 / rate(lambda: buf.sample(B), 200),
        "d3rlpy": 1e3 / rate(lambda: mdp.sample_transition_batch(B), 50),
    }

    bc_steps = 10 * args.steps
    bc_rates = interleaved(
        {
            "ours": lambda: bc_ours.update(buf.sample(B)),
            "d3rlpy": lambda: bc_peer.update(mdp.sample_transition_batch(B)),
        },
        bc_steps,
        args.rounds,
        2 * args.warmup,
    )
    gemm_after = gemm_rates()
    gemm = {k: max(gemm_before[k], gemm_after[k]) for k in gemm_before}

    flops = cql_update_flops(OBS, ACT, cfg.hidden, cfg.n_critics, B, cfg.n_action_samples)
    flops_cost = cql_update_flops(
        OBS, ACT, cfg.hidden, cfg.n_critics, B, cfg.n_action_samples, cost_critic=True
    )
    bc_flops = bc_update_flops(OBS, ACT, cfg.hidden, B)
    cql_med, upd_med, bc_med = summary(cql_rates), summary(upd_rates), summary(bc_rates)

    def share(steps_per_s: float, f: int) -> dict[str, float]:
        return {k: steps_per_s * f / 1e9 / g for k, g in gemm.items()}

    result = {
        "config": vars(args) | {"json": str(args.json) if args.json else None},
        "cpu": cpu,
        "gemm_gflops": gemm,
        "gemm_gflops_before": gemm_before,
        "gemm_gflops_after": gemm_after,
        "cql": {
            "steps_per_s_rounds": cql_rates,
            "steps_per_s": cql_med,
            "ratio": cql_med["ours"] / cql_med["d3rlpy"],
            "ratio_bf16_critic": cql_med["ours_bf16_critic"] / cql_med["d3rlpy"] if bf16_native else None,
            "update_only_steps_per_s": upd_med,
            "update_only_ratio": upd_med["ours"] / upd_med["d3rlpy"],
            "sample_ms": sample_ms,
            "flops_per_step": flops,
            "flops_per_step_with_cost_critic": flops_cost["total"],
            "ours_gflops": cql_med["ours"] * flops["total"] / 1e9,
            "d3rlpy_gflops": cql_med["d3rlpy"] * flops["total"] / 1e9,
            "ours_share_of_gemm": share(cql_med["ours"], flops["total"]),
            "ours_update_only_share_of_gemm": share(upd_med["ours"], flops["total"]),
        },
        "bc": {
            "steps_per_s_rounds": bc_rates,
            "steps_per_s": bc_med,
            "ratio": bc_med["ours"] / bc_med["d3rlpy"],
            "flops_per_step": bc_flops,
            "ours_share_of_gemm": share(bc_med["ours"], bc_flops),
        },
    }
    if "ours+cost_critic" in cql_med:
        result["cql"]["ours+cost_critic_share_of_gemm"] = share(
            cql_med["ours+cost_critic"], flops_cost["total"]
        )
    report(result)
    if args.profile:
        table = profile_ours(ours, buf, args.profile)
        result["profile_table"] = table
        print(f"\n== torch.profiler, our CQL (no cost critic), {args.profile} steps ==\n{table}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


def report(r: dict) -> None:
    g = r["gemm_gflops"]
    print(
        "\nfloat32 GEMM (GFLOP/s, best of before/after): " + ", ".join(f"{k} {v:.1f}" for k, v in g.items())
    )
    c = r["cql"]
    print(
        f"\nCQL ({r['config']['preset']} shapes), "
        f"{c['flops_per_step']['total'] / 1e9:.2f} GFLOP/step (analytic)"
    )
    print(f"{'':18s} {'steps/s':>9s} {'rounds':>40s}")
    for k, v in c["steps_per_s"].items():
        rounds = " ".join(f"{x:.1f}" for x in c["steps_per_s_rounds"][k])
        print(f"{k:18s} {v:9.2f} {rounds:>40s}")
    bf16 = c["ratio_bf16_critic"]
    bf16_text = (
        f"{bf16:.2f}x with the bf16 critic pass"
        if bf16 is not None
        else "bf16 critic pass not timed (no native bf16)"
    )
    print(f"ratio ours/d3rlpy (sample + update): {c['ratio']:.2f}x float32, {bf16_text}   (target >= 1.3x)")
    u = c["update_only_steps_per_s"]
    print(
        f"update only: ours {u['ours']:.2f}, d3rlpy {u['d3rlpy']:.2f} steps/s, "
        f"ratio {c['update_only_ratio']:.2f}x"
    )
    print(f"batch sampling: ours {c['sample_ms']['ours']:.3f} ms, d3rlpy {c['sample_ms']['d3rlpy']:.2f} ms")
    print(
        f"achieved: ours {c['ours_gflops']:.1f} GFLOP/s, d3rlpy {c['d3rlpy_gflops']:.1f} GFLOP/s "
        "(same FLOP count)"
    )
    print(
        "ours' share of GEMM rate: "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in c["ours_share_of_gemm"].items())
    )
    b = r["bc"]
    print(
        f"\nBC (gaussian, {r['config']['preset']} shapes, batch 256): ours {b['steps_per_s']['ours']:.1f}, "
        f"d3rlpy {b['steps_per_s']['d3rlpy']:.1f} steps/s, ratio {b['ratio']:.2f}x   (target >= 3x)"
    )
    print(
        "ours' share of GEMM rate: "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in b["ours_share_of_gemm"].items())
    )


if __name__ == "__main__":
    main()
