"""Turn a transitions table and its sidecar into the flat pandas frame the expectation suites validate.

Vector columns are checked with numpy over their flattened values (``pyarrow.compute.list_parent_indices``
maps each value back to its row), never with a Python loop per row. Properties of the whole file (its
schema) and of the sidecar (its task, version and spaces) become constant columns, so that GX judges them
with its ordinary column expectations and the report shows the offending value. Derived columns are
documented in each suite's ``meta.derived_columns`` (``expectations/*.json``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from arl_models.data.dataset import METADATA_COLUMNS, VECTOR_COLUMNS, DatasetInfo
from arl_models.envs.registry import env_dims, get_task, task_names, task_versions

INDEX_COLUMNS = ("episode_id", "step")
"""Columns that identify a row in the report's examples."""


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_vector(t: pa.DataType) -> bool:
    lists = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return lists and _is_number(t.value_type)


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


_KINDS: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    **{name: ("a list of floats", _is_vector) for name in VECTOR_COLUMNS},
    "reward": ("a float", _is_number),
    "cost": ("a float", _is_number),
    "terminated": ("a bool", pa.types.is_boolean),
    "truncated": ("a bool", pa.types.is_boolean),
    "episode_id": ("an integer", pa.types.is_integer),
    "step": ("an integer", pa.types.is_integer),
    "env_version": ("a string", _is_text),
    "policy_hash": ("a string", _is_text),
    "random_seed": ("an integer", pa.types.is_integer),
    "timestamp": ("a string", _is_text),
}
"""Every column of the data contract and the Arrow types the readers accept for it."""


def schema_problems(schema: pa.Schema) -> str:
    """The contract's columns that are missing or of a type the readers cannot use; ``""`` when none."""
    problems = []
    for name, (kind, accepts) in _KINDS.items():
        if name not in schema.names:
            problems.append(f"missing column {name}")
        elif not accepts(schema.field(name).type):
            problems.append(f"{name} is {schema.field(name).type}, expected {kind}")
    return "; ".join(problems)


def _vector_columns(col: pa.ChunkedArray | None, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per row: every component finite (and the row not null), and the row's width (NaN for a null row);
    then the flat values when the column holds numbers."""
    if col is None or not _is_vector(col.type):
        return np.zeros(n, dtype=bool), np.full(n, np.nan), None
    arr = col.combine_chunks()
    values = pc.list_flatten(arr).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
    bad = np.bincount(parents[~np.isfinite(values)], minlength=n)
    null = arr.is_null().to_numpy(zero_copy_only=False)
    widths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.float64)
    return (bad == 0) & ~null, np.where(null, np.nan, widths), values


def _action_components(values: np.ndarray | None, widths: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """``action_<i>`` for each of the sidecar's ``dim`` components; NaN throughout unless every row has
    ``dim`` values (``action_width`` fails then)."""
    n = widths.shape[0]
    if values is None or not (widths == dim).all():
        return {f"action_{i}": np.full(n, np.nan) for i in range(dim)}
    matrix = values.reshape(n, dim)
    return {f"action_{i}": matrix[:, i] for i in range(dim)}


def _numeric(table: pa.Table, name: str, n: int) -> np.ndarray:
    """A numeric column as float64 with NaN for nulls (NaN everywhere when it is missing or not numbers)."""
    if name not in table.column_names or not _is_number(table.schema.field(name).type):
        return np.full(n, np.nan)
    return pc.cast(table.column(name), pa.float64()).to_numpy().astype(np.float64)


def _episode_columns(ep: np.ndarray, step: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
    """``episode_runs``, ``episode_min_step``, ``step_delta`` and ``done_before_end`` (see the transitions
    suite)."""
    n = ep.shape[0]
    if n == 0:
        names = ("episode_runs", "episode_min_step", "step_delta", "done_before_end")
        return {k: np.zeros(0, dtype=np.int64) for k in names}
    start = np.ones(n, dtype=bool)
    start[1:] = ep[1:] != ep[:-1]
    end = np.ones(n, dtype=bool)
    end[:-1] = start[1:]
    _, first, inv = np.unique(ep, return_index=True, return_inverse=True)
    runs_per_episode = np.bincount(inv[start], minlength=first.size)
    lowest = np.full(first.size, np.inf)
    np.minimum.at(lowest, inv, step)
    min_step = np.full(n, np.nan)
    min_step[first] = lowest
    step_delta = np.ones(n)
    step_delta[1:] = step[1:] - step[:-1]
    step_delta[start] = 1.0
    return {
        "episode_runs": runs_per_episode[inv].astype(np.int64),
        "episode_min_step": min_step,
        "step_delta": step_delta,
        "done_before_end": done & ~end,
    }


def _flag(table: pa.Table, name: str, n: int) -> pd.Series:
    if name not in table.column_names:
        return pd.Series([None] * n, dtype=object)
    return table.column(name).to_pandas()


def _timestamps(table: pa.Table, n: int) -> np.ndarray:
    """Seconds since the epoch of each ``timestamp`` (NaN where it does not parse or is not text)."""
    if "timestamp" not in table.column_names or not _is_text(table.schema.field("timestamp").type):
        return np.full(n, np.nan)
    ts = pd.to_datetime(table.column("timestamp").to_pandas(), utc=True, format="ISO8601", errors="coerce")
    micros = ts.dt.as_unit("us").astype("int64").to_numpy()  # pandas 3 may parse to us or ns
    return np.where(ts.isna().to_numpy(), np.nan, micros / 1e6)


def _spaces_text(obs_dim: int, low: list[float], high: list[float]) -> str:
    """Observation width and action bounds as text, the bounds rounded to float32 as the environments hold
    them."""

    def f32(values: list[float]) -> list[float]:
        return [float(v) for v in np.asarray(values, dtype=np.float32)]

    return f"obs_dim {obs_dim}, action_dim {len(low)}, action_low {f32(low)}, action_high {f32(high)}"


def registered_tasks() -> list[str]:
    """``name@version`` of every task in the registry (``arl_models.envs.registry``)."""
    return [f"{name}@{v}" for name in task_names() for v in task_versions(name)]


@cache
def _env_space(key: str) -> tuple[int, list[float], list[float]]:
    """``(obs_dim, action_low, action_high)`` of the registered task ``name@version`` (its environment is
    built once)."""
    obs_dim, _, low, high, _ = env_dims(get_task(key))
    return obs_dim, low.tolist(), high.tolist()


def _task_space(key: str) -> tuple[int, list[float], list[float]] | None:
    """:func:`_env_space` of ``key`` if it is registered, else None."""
    return _env_space(key) if key in registered_tasks() else None


def _sidecar_key(info: DatasetInfo) -> str:
    return f"{info.task}@{info.env_version}"


def _sidecar_columns(info: DatasetInfo, n: int) -> dict[str, np.ndarray]:
    """``sidecar_task`` and ``sidecar_spaces``: what dataset.json claims, on every row."""
    spaces = _spaces_text(info.obs_dim, info.action_low, info.action_high)
    return {
        "sidecar_task": np.full(n, _sidecar_key(info), dtype=object),
        "sidecar_spaces": np.full(n, spaces, dtype=object),
    }


def validation_frame(table: pa.Table, info: DatasetInfo) -> pd.DataFrame:
    """Metadata columns, flags, index columns and every derived column, one row per transition."""
    n = table.num_rows
    cols: dict[str, Any] = {"schema_problems": np.full(n, schema_problems(table.schema), dtype=object)}
    for name in METADATA_COLUMNS:
        if name in table.column_names:
            cols[name] = table.column(name).to_pandas()
    cols["timestamp_epoch_s"] = _timestamps(table, n)
    values = {}
    for name in VECTOR_COLUMNS:
        col = table.column(name) if name in table.column_names else None
        cols[f"{name}_finite"], cols[f"{name}_width"], values[name] = _vector_columns(col, n)
    cols.update(_action_components(values["action"], cols["action_width"], info.action_dim))
    for name in ("reward", "cost"):
        cols[f"{name}_finite"] = np.isfinite(_numeric(table, name, n))
    cost = _numeric(table, "cost", n)
    cols["cost"] = np.where(np.isfinite(cost), cost, np.nan)
    cols["terminated"] = _flag(table, "terminated", n)
    cols["truncated"] = _flag(table, "truncated", n)
    ep, step = _numeric(table, "episode_id", n), _numeric(table, "step", n)
    cols["episode_id"], cols["step"] = ep, step
    done = cols["terminated"].fillna(False).astype(bool) | cols["truncated"].fillna(False).astype(bool)
    cols.update(_episode_columns(ep, step, done.to_numpy()))
    cols.update(_sidecar_columns(info, n))
    return pd.DataFrame(cols)


def run_parameters(info: DatasetInfo, *, clock_skew_s: float = 60.0) -> dict[str, Any]:
    """Values the suites take at validation time: now (plus allowed clock skew), the sidecar's widths and
    row count, the registered tasks, and the task's spaces and action bounds (the sidecar's own where the
    task is not registered or its action width differs: ``sidecar_task`` or ``sidecar_spaces`` fail then)."""
    space = _task_space(_sidecar_key(info))
    low, high = info.action_low, info.action_high
    if space is not None and len(space[1]) == info.action_dim:
        low, high = space[1], space[2]
    params: dict[str, Any] = {
        "now_epoch_s": datetime.now(UTC).timestamp() + clock_skew_s,
        "num_transitions": info.num_transitions,
        "obs_dim": info.obs_dim,
        "action_dim": info.action_dim,
        "registered_tasks": registered_tasks(),
        "task_spaces": [_spaces_text(*(space or (info.obs_dim, info.action_low, info.action_high)))],
    }
    for i in range(info.action_dim):
        params[f"action_low_{i}"] = float(low[i])
        params[f"action_high_{i}"] = float(high[i])
    return params
