"""Turn a transitions table into the flat pandas frame the expectation suites validate.

Vector columns are checked with numpy over their flattened values (``pyarrow.compute.list_parent_indices``
maps each value back to its row), never with a Python loop per row. Derived columns are documented in
each suite's ``meta.derived_columns`` (``expectations/*.json``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from arl_models.data.dataset import METADATA_COLUMNS, DatasetInfo

INDEX_COLUMNS = ("episode_id", "step")
"""Columns that identify a row in the report's examples."""


def _vector_finite(col: pa.ChunkedArray | None, dim: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per row: the vector has ``dim`` components, all finite; and the (n, dim) values when all do."""
    if col is None:
        return np.zeros(n, dtype=bool), None
    arr = col.combine_chunks()
    if not (pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type)):
        return np.zeros(n, dtype=bool), None
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    lengths = np.bincount(parents, minlength=n)
    bad = np.bincount(parents[~np.isfinite(values)], minlength=n)
    ok = (lengths == dim) & (bad == 0) & ~arr.is_null().to_numpy(zero_copy_only=False)
    matrix = values.reshape(n, dim) if values.size == n * dim and (lengths == dim).all() else None
    return ok, matrix


def _numeric(table: pa.Table, name: str, n: int) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls (NaN everywhere when the column is missing)."""
    if name not in table.column_names:
        return np.full(n, np.nan)
    try:
        return table.column(name).to_numpy().astype(np.float64)
    except (pa.ArrowInvalid, ValueError):
        return pc.cast(table.column(name), pa.float64(), safe=False).to_numpy().astype(np.float64)


def _episode_columns(ep: np.ndarray, step: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
    """``episode_runs``, ``step_delta`` and ``done_before_end`` (see the transitions suite)."""
    n = ep.shape[0]
    if n == 0:
        return {k: np.zeros(0, dtype=np.int64) for k in ("episode_runs", "step_delta", "done_before_end")}
    start = np.ones(n, dtype=bool)
    start[1:] = ep[1:] != ep[:-1]
    end = np.ones(n, dtype=bool)
    end[:-1] = start[1:]
    _, inv = np.unique(ep, return_inverse=True)
    runs_per_episode = np.bincount(inv[start], minlength=int(inv.max()) + 1)
    step_delta = np.ones(n)
    step_delta[1:] = step[1:] - step[:-1]
    step_delta[start] = 1.0
    return {
        "episode_runs": runs_per_episode[inv].astype(np.int64),
        "step_delta": step_delta,
        "done_before_end": done & ~end,
    }


def _flag(table: pa.Table, name: str, n: int) -> pd.Series:
    if name not in table.column_names:
        return pd.Series([None] * n, dtype=object)
    return table.column(name).to_pandas()


def _timestamps(table: pa.Table, n: int) -> np.ndarray:
    """Seconds since the epoch of each ``timestamp`` (NaN where it does not parse)."""
    if "timestamp" not in table.column_names:
        return np.full(n, np.nan)
    ts = pd.to_datetime(table.column("timestamp").to_pandas(), utc=True, format="ISO8601", errors="coerce")
    micros = ts.dt.as_unit("us").astype("int64").to_numpy()  # pandas 3 may parse to us or ns
    return np.where(ts.isna().to_numpy(), np.nan, micros / 1e6)


def validation_frame(table: pa.Table, info: DatasetInfo) -> pd.DataFrame:
    """Metadata columns, flags, index columns and every derived column, one row per transition."""
    n = table.num_rows
    cols: dict[str, object] = {}
    for name in METADATA_COLUMNS:
        if name in table.column_names:
            cols[name] = table.column(name).to_pandas()
    cols["timestamp_epoch_s"] = _timestamps(table, n)
    dims = {"obs": info.obs_dim, "next_obs": info.obs_dim, "action": info.action_dim}
    action = None
    for name, dim in dims.items():
        col = table.column(name) if name in table.column_names else None
        cols[f"{name}_finite"], matrix = _vector_finite(col, dim, n)
        if name == "action":
            action = matrix
    for i in range(info.action_dim):
        cols[f"action_{i}"] = action[:, i] if action is not None else np.full(n, np.nan)
    for name in ("reward", "cost"):
        cols[f"{name}_finite"] = np.isfinite(_numeric(table, name, n))
    cols["terminated"] = _flag(table, "terminated", n)
    cols["truncated"] = _flag(table, "truncated", n)
    ep, step = _numeric(table, "episode_id", n), _numeric(table, "step", n)
    cols["episode_id"], cols["step"] = ep, step
    done = cols["terminated"].fillna(False).astype(bool) | cols["truncated"].fillna(False).astype(bool)
    cols.update(_episode_columns(ep, step, done.to_numpy()))
    return pd.DataFrame(cols)


def run_parameters(info: DatasetInfo, *, clock_skew_s: float = 60.0) -> dict[str, float]:
    """Values the suites take at validation time: now (plus allowed clock skew), bounds, row count."""
    params: dict[str, float] = {
        "now_epoch_s": datetime.now(UTC).timestamp() + clock_skew_s,
        "num_transitions": info.num_transitions,
    }
    for i in range(info.action_dim):
        params[f"action_low_{i}"] = float(info.action_low[i])
        params[f"action_high_{i}"] = float(info.action_high[i])
    return params
