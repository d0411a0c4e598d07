"""Dataset I/O at a million transitions: ours (Parquet, fixed-size float lists, vectorised) against
the two ways people commonly store the same rows, in one run.

    .venv/bin/python benchmarks/bench_dataset_io.py [--rows 1000000]

Prints write and read wall times and the ratios. "read" means: from disk to contiguous (N, dim)
float32 arrays of obs/action/next_obs plus the scalar and metadata columns.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from arl_models.data.dataset import DatasetInfo, Transitions, read_dataset, with_metadata, write_dataset


def make(n: int, obs_dim: int = 11, act_dim: int = 3) -> Transitions:
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
    ep = np.arange(n, dtype=np.int64) // 1000
    return Transitions(
        obs=obs,
        action=rng.uniform(-1, 1, (n, act_dim)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32),
        cost=(rng.uniform(size=n) < 0.1).astype(np.float32),
        next_obs=np.roll(obs, -1, 0),
        terminated=np.zeros(n, bool),
        truncated=(np.arange(n) % 1000) == 999,
        episode_id=ep,
        step=(np.arange(n) % 1000).astype(np.int32),
        **with_metadata(n, env_version="1.0.0", policy_hash="ab" * 32, random_seed=1),
    )


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    n = ap.parse_args().rows
    t = make(n)
    info = DatasetInfo(
        task="safe-hopper",
        env_id="Hopper-v5",
        env_version="1.0.0",
        obs_dim=11,
        action_dim=3,
        action_low=[-1.0] * 3,
        action_high=[1.0] * 3,
        quality="random",
    )
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        w_ours, _ = timed(lambda: write_dataset(d / "ours", t, info))
        r_ours, (back, _) = timed(lambda: read_dataset(d / "ours"))
        assert np.array_equal(back.obs, t.obs)

        # pandas with list-valued columns: the usual first attempt at "one transition per row"
        def pd_write():
            df = pd.DataFrame({k: (list(v) if v.ndim == 2 else v) for k, v in t.__dict__.items()})
            df.to_parquet(d / "pandas.parquet")

        def pd_read():
            df = pd.read_parquet(d / "pandas.parquet")
            return np.stack(df["obs"].to_numpy()).astype(np.float32)

        w_pd, _ = timed(pd_write)
        r_pd, obs = timed(pd_read)
        assert np.array_equal(obs, t.obs)

        # HDF5 arrays (D4RL's layout): columnar, fast, but no per-row schema or metadata types
        def h5_write():
            with h5py.File(d / "d4rl.hdf5", "w") as f:
                for k, v in t.__dict__.items():
                    f[k] = v.astype("S") if v.dtype == object else v

        def h5_read():
            with h5py.File(d / "d4rl.hdf5", "r") as f:
                return {k: f[k][:] for k in f}

        w_h5, _ = timed(h5_write)
        r_h5, _ = timed(h5_read)
        size = sum(p.stat().st_size for p in (d / "ours").iterdir())
    print(f"rows: {n:,}   ours on disk: {size / 1e6:.1f} MB")
    print(f"{'':22s}{'write s':>10s}{'read s':>10s}")
    for name, w, r in (
        ("ours (pyarrow)", w_ours, r_ours),
        ("pandas list columns", w_pd, r_pd),
        ("h5py arrays (D4RL)", w_h5, r_h5),
    ):
        print(f"{name:22s}{w:10.2f}{r:10.2f}")
    print(f"ratio pandas/ours: write {w_pd / w_ours:.1f}x, read {r_pd / r_ours:.1f}x")
    print(f"ratio h5py/ours:   write {w_h5 / w_ours:.2f}x, read {r_h5 / r_ours:.2f}x")


if __name__ == "__main__":
    main()
