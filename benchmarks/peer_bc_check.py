"""Our deterministic BC against d3rlpy's, step for step: both start from d3rlpy's initial weights and the
same observation scaling, train on the same d3rlpy batches, and the largest gap between their actions on
the dataset's first 512 observations is printed as they go.

With ``--as-d3rlpy`` ours takes d3rlpy's two numerical choices (the loss averaged over action entries as
well as rows, Adam without the fused kernel): the gap then stays at float32 rounding, which shows the
algorithms are the same. Without it the gap grows from rounding, as any two runs of the same stochastic
optimisation drift apart.

    .venv-bench/bin/python benchmarks/peer_bc_check.py --data data/gen/walker2d-medium --as-d3rlpy
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import d3rlpy_bc, to_mdp_dataset  # noqa: E402

import arl_models.algos.bc as bc_module  # noqa: E402
from arl_models.data.dataset import read_dataset  # noqa: E402
from arl_models.nets import obs_standardization  # noqa: E402
from arl_models.offline import bc_learner  # noqa: E402
from arl_models.presets import get_preset  # noqa: E402

D3RLPY_SCALER_EPS = 1e-3
"""d3rlpy's ``StandardObservationScaler`` divides by ``std + 1e-3``; ours by the std alone."""


def main(argv: list[str] | None = None) -> list[tuple[int, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a dataset directory")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--as-d3rlpy", action="store_true", help="ours with d3rlpy's loss mean and plain Adam")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with contextlib.redirect_stderr(io.StringIO()):
        import d3rlpy

    t, info = read_dataset(args.data)
    cfg = replace(get_preset("demo").bc, seed=args.seed, policy="deterministic")
    ours = bc_learner(cfg, info, t)
    d3rlpy.seed(args.seed)
    data = to_mdp_dataset(t)
    low, high = np.asarray(info.action_low, np.float32), np.asarray(info.action_high, np.float32)
    stats = obs_standardization(t.obs)
    peer = d3rlpy_bc(data, hidden=cfg.hidden, batch_size=cfg.batch_size, lr=cfg.lr, action_low=low,
                     action_high=high, policy_type="deterministic", obs_stats=stats)  # fmt: skip
    policy = peer._impl._modules.imitator
    layers = [m for m in policy._encoder._layers if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        mine = [ours.actor.trunk[0], ours.actor.trunk[2], ours.actor.mu]
        for ours_layer, theirs in zip(mine, [*layers, policy._fc], strict=True):
            ours_layer.weight.copy_(theirs.weight)
            ours_layer.bias.copy_(theirs.bias)
        ours.actor.obs_norm.std.add_(D3RLPY_SCALER_EPS)
    if args.as_d3rlpy:
        ours.actor_opt = torch.optim.Adam(ours.actor.parameters(), lr=cfg.lr)
        bc_module.compute_bc_loss = lambda actor, o, a: bc_module.BCLosses(
            actor=torch.nn.functional.mse_loss(actor(o), a)
        )
    obs = t.obs[:512].astype(np.float32)

    def gap() -> float:
        return float(np.abs(ours.act(obs) - peer.predict(obs)).max())

    gaps = [(0, gap())]
    for step in range(1, args.steps + 1):
        batch = data.sample_transition_batch(cfg.batch_size)
        peer.update(batch)
        ours.update(SimpleNamespace(obs=torch.as_tensor(np.asarray(batch.observations)),
                                    act=torch.as_tensor(np.asarray(batch.actions))))  # fmt: skip
        if step in (1, 10, 100, 1000) or step == args.steps:
            gaps.append((step, gap()))
    for step, g in gaps:
        print(f"step {step:6d}: largest action gap {g:.2e}")
    return gaps


if __name__ == "__main__":
    main()
