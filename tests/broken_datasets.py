"""A corpus of broken datasets and sidecars, each a copy of one small valid dataset with one thing wrong.

The valid dataset is written by the project's own writer (``write_dataset``) from ``tests.conftest``'s
synthetic safe-pendulum transitions. Each case is a function that breaks a copy in place, and the word an
error about it must contain (a column, a derived column of the suites, or the offending value).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from arl_models.data.dataset import SIDECAR_FILE, TRANSITIONS_FILE, Transitions, read_dataset, write_dataset
from tests.conftest import make_transitions, pendulum_info


def write_valid(path: Path) -> Path:
    """The corpus' valid base: 3 safe-pendulum episodes of 8 steps."""
    return write_dataset(path, make_transitions(n_episodes=3, length=8), pendulum_info())


@dataclass(frozen=True)
class Case:
    breaks: Callable[[Path], None]
    """Breaks the dataset directory it is given, in place."""
    word: str
    """What an error about this dataset must say."""


def _rows(change: Callable[[Transitions], Any]) -> Callable[[Path], None]:
    """Rewrite the dataset, with the writer, after ``change`` edits its arrays in place."""

    def breaks(path: Path) -> None:
        t, info = read_dataset(path)
        t = Transitions(**{k: np.array(v) for k, v in t.__dict__.items()})  # writable copies
        change(t)
        write_dataset(path, t, info)

    return breaks


def _table(change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    """Rewrite the Parquet file with the table ``change`` returns (for what the writer would refuse)."""

    def breaks(path: Path) -> None:
        f = path / TRANSITIONS_FILE
        pq.write_table(change(pq.read_table(f)), f)

    return breaks


def _column(
    name: str, values: Callable[[pa.Table], Any], typ: pa.DataType | None = None
) -> Callable[[Path], None]:
    """Replace column ``name`` by ``values(table)`` (a list or array, of Arrow type ``typ`` if given)."""

    def change(table: pa.Table) -> pa.Table:
        return table.set_column(table.column_names.index(name), name, pa.array(values(table), type=typ))

    return _table(change)


def _with_null(name: str) -> Callable[[Path], None]:
    def values(table: pa.Table) -> list[Any]:
        col = table.column(name).to_pylist()
        col[4] = None
        return col

    return _column(name, values, typ=pa.string() if name != "random_seed" else pa.int64())


def _vector_rows(name: str, edit: Callable[[list[list[float]]], None]) -> Callable[[Path], None]:
    """Column ``name`` as variable-length lists, after ``edit`` changes some rows' lengths."""

    def values(table: pa.Table) -> list[list[float]]:
        rows = table.column(name).to_pylist()
        edit(rows)
        return rows

    return _column(name, values, typ=pa.list_(pa.float32()))


def _shift_widths(rows: list[list[float]]) -> None:
    """One value moves from row 5 to row 4: the total count stays right, every later value shifts."""
    rows[4].append(rows[5].pop(0))


def _sidecar(**changes: Any) -> Callable[[Path], None]:
    def breaks(path: Path) -> None:
        f = path / SIDECAR_FILE
        f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))

    return breaks


def _sidecar_without(key: str) -> Callable[[Path], None]:
    def breaks(path: Path) -> None:
        f = path / SIDECAR_FILE
        f.write_text(json.dumps({k: v for k, v in json.loads(f.read_text()).items() if k != key}))

    return breaks


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda path: (path / name).write_text(text)


def _truncate(path: Path) -> None:
    f = path / TRANSITIONS_FILE
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _corrupt(path: Path) -> None:
    """Zero a stretch of the column chunks between the magic bytes and the footer."""
    f = path / TRANSITIONS_FILE
    data = bytearray(f.read_bytes())
    data[64:1024] = bytes(960)
    f.write_bytes(bytes(data))


def _set(field: str, index: Any, value: Any) -> Callable[[Path], None]:
    return _rows(lambda t: getattr(t, field).__setitem__(index, value))


def _interleave(t: Transitions) -> None:
    order = np.r_[8:12, 0:8, 12:24]  # episode 1 split by episode 0
    for k, v in t.__dict__.items():
        setattr(t, k, v[order])


BROKEN: dict[str, Case] = {
    # non-finite numbers, in every numeric column
    "obs NaN": Case(_set("obs", (3, 1), np.nan), "obs_finite"),
    "next_obs -inf": Case(_set("next_obs", (6, 0), -np.inf), "next_obs_finite"),
    "action inf": Case(_set("action", (2, 0), np.inf), "action_finite"),
    "reward NaN": Case(_set("reward", 9, np.nan), "reward_finite"),
    "reward inf": Case(_set("reward", 9, np.inf), "reward_finite"),
    "cost NaN": Case(_set("cost", 9, np.nan), "cost_finite"),
    "cost inf": Case(_set("cost", 9, np.inf), "cost_finite"),
    # vector widths, per row
    "obs widths shifted": Case(_vector_rows("obs", _shift_widths), "obs_width"),
    "next_obs row short": Case(_vector_rows("next_obs", lambda r: r[7].pop()), "next_obs_width"),
    "action row long": Case(_vector_rows("action", lambda r: r[3].append(0.5)), "action_width"),
    "obs row null": Case(
        _column("obs", lambda t: [None, *t.column("obs").to_pylist()[1:]], typ=pa.list_(pa.float32())),
        "obs_finite",
    ),
    # the sidecar against the registry and the rows
    "unknown task": Case(_sidecar(task="safe-nope"), "safe-nope@1.0.0"),
    "unknown version": Case(_sidecar(env_version="9.9.9"), "safe-pendulum@9.9.9"),
    "bounds widened": Case(_sidecar(action_low=[-5.0], action_high=[5.0]), "sidecar_spaces"),
    "bounds widened, actions outside": Case(
        lambda p: (_set("action", (5, 0), 4.5)(p), _sidecar(action_low=[-5.0], action_high=[5.0])(p)),
        "action_0",
    ),
    "action above bound": Case(_set("action", (5, 0), 2.5), "action_0"),
    "obs_dim wrong": Case(_sidecar(obs_dim=4), "obs_width"),
    "obs_dim not a number": Case(_sidecar(obs_dim="three"), "obs_dim"),
    "bounds of the wrong length": Case(_sidecar(action_low=[-2.0, -2.0]), "action_low"),
    "row count differs": Case(_sidecar(num_transitions=25), "expect_table_row_count_to_equal"),
    "sidecar without task": Case(_sidecar_without("task"), "'task'"),
    "sidecar not JSON": Case(_write(SIDECAR_FILE, '{"task": "safe-pendulum",'), "malformed sidecar"),
    "sidecar a list": Case(_write(SIDECAR_FILE, "[1, 2]"), "JSON object"),
    # costs and steps
    "cost negative": Case(_set("cost", 10, -1.0), "column 'cost'"),
    "steps start at 3": Case(_rows(lambda t: t.step.__iadd__(3)), "episode_min_step"),
    "step repeats": Case(_set("step", 12, 3), "step_delta"),
    "steps decrease": Case(
        _rows(lambda t: t.step.__setitem__(slice(8, 16), t.step[8:16][::-1])), "step_delta"
    ),
    "episodes interleaved": Case(_rows(_interleave), "episode_runs"),
    # files
    "parquet truncated": Case(_truncate, "cannot read the Parquet file"),
    "parquet corrupt bytes": Case(_corrupt, "cannot read the Parquet file"),
    "parquet is text": Case(_write(TRANSITIONS_FILE, "obs,action\n1,2\n"), "cannot read the Parquet file"),
    "parquet missing": Case(lambda p: (p / TRANSITIONS_FILE).unlink(), "missing transitions.parquet"),
    "sidecar missing": Case(lambda p: (p / SIDECAR_FILE).unlink(), "missing dataset.json"),
    "0 rows": Case(_rows(lambda t: t.__dict__.update({k: v[:0] for k, v in t.__dict__.items()})), "0 rows"),
    # columns and types
    "reward missing": Case(_table(lambda t: t.drop_columns(["reward"])), "missing column reward"),
    "reward as text": Case(
        _column("reward", lambda t: [str(v) for v in t.column("reward").to_pylist()]), "reward is string"
    ),
    "terminated as int8": Case(
        _column("terminated", lambda t: np.zeros(t.num_rows, np.int8)), "terminated is int8"
    ),
    "step as float": Case(
        _column("step", lambda t: t.column("step").to_numpy().astype(np.float64)), "step is double"
    ),
    "action as text lists": Case(_column("action", lambda t: [["x"]] * t.num_rows), "action is list<"),
    # the data-version metadata
    "env_version null": Case(_with_null("env_version"), "env_version"),
    "policy_hash null": Case(_with_null("policy_hash"), "policy_hash"),
    "random_seed null": Case(_with_null("random_seed"), "random_seed"),
    "timestamp null": Case(_with_null("timestamp"), "timestamp"),
    "env_version empty": Case(_set("env_version", slice(None), ""), "env_version"),
    "policy_hash empty": Case(_set("policy_hash", 2, ""), "policy_hash"),
    "timestamp empty": Case(_set("timestamp", 2, ""), "timestamp"),
    "timestamp in the future": Case(_set("timestamp", 0, "2999-01-01T00:00:00Z"), "timestamp_epoch_s"),
}
