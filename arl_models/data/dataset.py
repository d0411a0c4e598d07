"""The dataset format: one transition per row in Parquet, plus a small JSON sidecar.

A dataset is a directory::

    PATH/
      transitions.parquet   obs, action, reward, cost, next_obs, terminated, truncated,
                            episode_id, step, env_version, policy_hash, random_seed, timestamp
      dataset.json          task, env spec, reference scores, quality label, row count

``obs``/``next_obs``/``action`` are fixed-size float32 lists, so a million rows convert to
contiguous ``(N, dim)`` arrays without a Python loop. Every row carries the data-version
metadata (``env_version`` semver, ``policy_hash`` hex, ``random_seed`` uint32, ``timestamp``
ISO-8601 UTC). Writes go to a temporary directory beside the target and are renamed into
place, so a crash never leaves a half-written dataset under the final name.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TRANSITIONS_FILE = "transitions.parquet"
SIDECAR_FILE = "dataset.json"
FORMAT_VERSION = 1

VECTOR_COLUMNS = ("obs", "action", "next_obs")
SCALAR_COLUMNS: dict[str, pa.DataType] = {
    "reward": pa.float32(),
    "cost": pa.float32(),
    "terminated": pa.bool_(),
    "truncated": pa.bool_(),
    "episode_id": pa.int64(),
    "step": pa.int32(),
}
METADATA_COLUMNS: dict[str, pa.DataType] = {
    "env_version": pa.string(),
    "policy_hash": pa.string(),
    "random_seed": pa.int64(),
    "timestamp": pa.string(),
}
COLUMNS = (*VECTOR_COLUMNS, *SCALAR_COLUMNS, *METADATA_COLUMNS)


class DatasetError(ValueError):
    """A dataset file that does not satisfy the format; the message names file, column and problem."""


@dataclass(frozen=True)
class DatasetInfo:
    """The JSON sidecar: what the rows alone cannot say."""

    task: str
    """Registered task name (``safe-pendulum``, :mod:`arl_models.envs.registry`); validation refuses one
    it does not know."""
    env_id: str
    env_version: str
    obs_dim: int
    action_dim: int
    action_low: list[float]
    action_high: list[float]
    quality: str
    """``random``, ``medium``, ``expert``, ``medium-replay``, ``medium-expert``, ``imported`` or ``mixed``."""
    ref_random_return: float | None = None
    ref_expert_return: float | None = None
    ref_source: str | None = None
    """Where the reference returns come from (:mod:`arl_models.data.references`): ``d4rl``, ``measured``,
    ``given`` or, for parts that disagree, ``merged``; ``None`` where unrecorded (older sidecars)."""
    cost_budget: float | None = None
    num_transitions: int = 0
    num_episodes: int = 0
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def references(self) -> tuple[float, float] | None:
        """The (random, expert) reference returns, or None where either is unknown."""
        return reference_pair(self.ref_random_return, self.ref_expert_return)

    def normalized_score(self, ret: float) -> float:
        """D4RL-style normalised score of a return (:func:`normalized_score`): 0 = random, 100 = expert."""
        refs = self.references
        if refs is None:
            raise ValueError(f"dataset of task {self.task!r} has no reference scores")
        return normalized_score(ret, refs)


def reference_pair(random_return: float | None, expert_return: float | None) -> tuple[float, float] | None:
    """``(random, expert)`` reference returns when both are known, else None."""
    if random_return is None or expert_return is None:
        return None
    return random_return, expert_return


def normalized_score(ret: float, refs: tuple[float, float]) -> float:
    """D4RL's normalised score of a return (Fu et al. 2020): 0 at the random reference, 100 at the
    expert's."""
    random_return, expert_return = refs
    return 100.0 * (ret - random_return) / (expert_return - random_return)


@dataclass
class Transitions:
    """Contiguous arrays of a dataset, one row per transition."""

    obs: np.ndarray  # (N, O) float32
    action: np.ndarray  # (N, A) float32
    reward: np.ndarray  # (N,) float32
    cost: np.ndarray  # (N,) float32
    next_obs: np.ndarray  # (N, O) float32
    terminated: np.ndarray  # (N,) bool
    truncated: np.ndarray  # (N,) bool
    episode_id: np.ndarray  # (N,) int64
    step: np.ndarray  # (N,) int32
    env_version: np.ndarray  # (N,) object (str)
    policy_hash: np.ndarray  # (N,) object (str)
    random_seed: np.ndarray  # (N,) int64
    timestamp: np.ndarray  # (N,) object (str)

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    @property
    def done(self) -> np.ndarray:
        """End of an episode, whether by termination or time limit."""
        return self.terminated | self.truncated

    @property
    def episode_end(self) -> np.ndarray:
        """The last recorded row of each episode: its end, or where its rows stop (the episode id changes)."""
        return self.done | np.r_[self.episode_id[1:] != self.episode_id[:-1], True]

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode, in episode order."""
        _, idx = np.unique(self.episode_id, return_inverse=True)
        return np.bincount(idx, weights=self.reward.astype(np.float64))

    def episode_costs(self, gamma: float = 1.0) -> np.ndarray:
        """Cost of each episode, in episode order, discounted by ``gamma`` from its first recorded step."""
        _, idx = np.unique(self.episode_id, return_inverse=True)
        first = np.full(idx.max(initial=-1) + 1, np.iinfo(np.int64).max)
        np.minimum.at(first, idx, self.step.astype(np.int64))
        return np.bincount(idx, weights=self.cost.astype(np.float64) * gamma ** (self.step - first[idx]))

    def select(self, mask_or_idx: np.ndarray) -> Transitions:
        return Transitions(**{k: v[mask_or_idx] for k, v in self.__dict__.items()})

    @staticmethod
    def concat(parts: list[Transitions]) -> Transitions:
        """Rows of whole-episode parts, in order; episode ids are renumbered 0.. so that no two parts share
        one."""
        ids, offset = [], 0
        for p in parts:
            _, inverse = np.unique(p.episode_id, return_inverse=True)
            ids.append(inverse.astype(np.int64) + offset)
            offset += int(inverse.max(initial=-1)) + 1
        keys = [k for k in parts[0].__dict__ if k != "episode_id"]
        return Transitions(
            **{k: np.concatenate([p.__dict__[k] for p in parts]) for k in keys},
            episode_id=np.concatenate(ids),
        )


def utc_now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def with_metadata(
    n: int, *, env_version: str, policy_hash: str, random_seed: int, timestamp: str | None = None
) -> dict[str, np.ndarray]:
    """Per-row metadata columns for ``n`` rows produced under one data version."""
    ts = timestamp or utc_now_iso()
    return {
        "env_version": np.full(n, env_version, dtype=object),
        "policy_hash": np.full(n, policy_hash, dtype=object),
        "random_seed": np.full(n, int(random_seed), dtype=np.int64),
        "timestamp": np.full(n, ts, dtype=object),
    }


def _vector_column(name: str, arr: np.ndarray) -> pa.FixedSizeListArray:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if arr.ndim != 2:
        raise DatasetError(f"column {name!r}: expected a 2-D array (rows, dim), got shape {arr.shape}")
    flat = pa.array(arr.reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, arr.shape[1])


def to_table(t: Transitions) -> pa.Table:
    n = int(np.asarray(t.obs).shape[0])
    cols: dict[str, pa.Array] = {}
    for name in VECTOR_COLUMNS:
        cols[name] = _vector_column(name, getattr(t, name))
    for name, typ in (*SCALAR_COLUMNS.items(), *METADATA_COLUMNS.items()):
        arr = np.asarray(getattr(t, name))
        if arr.shape != (n,):
            raise DatasetError(f"column {name!r}: expected shape ({n},), got {arr.shape}")
        cols[name] = pa.array(arr, type=typ)
    return pa.table(cols)


def write_dataset(path: str | Path, transitions: Transitions, info: DatasetInfo) -> Path:
    """Write atomically: build everything in a temporary sibling directory, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = to_table(transitions)
    n_eps = int(np.unique(transitions.episode_id).size)
    info = DatasetInfo(**{**asdict(info), "num_transitions": len(transitions), "num_episodes": n_eps})
    with staged_dir(path) as tmp:
        pq.write_table(table, tmp / TRANSITIONS_FILE, compression="zstd")
        (tmp / SIDECAR_FILE).write_text(json.dumps(asdict(info), indent=2) + "\n")
    return path


_SAME_IN_EVERY_PART = (
    "task",
    "env_id",
    "env_version",
    "obs_dim",
    "action_dim",
    "action_low",
    "action_high",
    "cost_budget",
)


def merge_datasets(paths: list[str | Path], out: str | Path) -> DatasetInfo:
    """Concatenate datasets of one task version into ``out`` (quality ``mixed``), as safe offline RL mixes
    behaviours of different costs. Episode ids are renumbered to stay distinct; every row keeps its own
    metadata (policy_hash, random_seed, timestamp). Parts must agree on the task, its version, shapes,
    bounds, budget and cost function; the reference returns span the parts' (lowest random, highest expert).
    """
    if len(paths) < 2:
        raise ValueError("merging needs at least two datasets")
    infos = [read_info(p) for p in paths]  # every part's sidecar is checked before any rows are read
    first = infos[0]
    for path, info in zip(paths[1:], infos[1:], strict=True):
        for name in _SAME_IN_EVERY_PART:
            if getattr(info, name) != getattr(first, name):
                raise DatasetError(
                    f"{path}: {name} is {getattr(info, name)!r}, but {paths[0]} has {getattr(first, name)!r}"
                )
        if info.extra.get("cost_fn") != first.extra.get("cost_fn"):
            raise DatasetError(
                f"{path}: cost labelled by {info.extra.get('cost_fn')!r}, but {paths[0]} by "
                f"{first.extra.get('cost_fn')!r} (arl data relabel one of them first)"
            )
    refs = {
        k: [getattr(i, k) for i in infos if getattr(i, k) is not None]
        for k in ("ref_random_return", "ref_expert_return")
    }
    info = replace(
        first,
        quality="mixed",
        source="arl data merge",
        ref_random_return=min(refs["ref_random_return"], default=None),
        ref_expert_return=max(refs["ref_expert_return"], default=None),
        ref_source=first.ref_source if all(i.ref_source == first.ref_source for i in infos) else "merged",
        extra={k: v for k, v in first.extra.items() if k in ("cost_fn", "max_episode_steps")}
        | {
            "merged_from": [
                {"path": str(p), "quality": i.quality, "num_transitions": i.num_transitions}
                for p, i in zip(paths, infos, strict=True)
            ]
        },
    )
    write_dataset(out, Transitions.concat([read_dataset(p)[0] for p in paths]), info)
    return read_info(out)


@contextmanager
def staged_dir(dst: Path) -> Iterator[Path]:
    """A temporary sibling of ``dst`` to build in; on success it replaces ``dst`` whole
    (:func:`_replace_dir`), on failure it is removed and ``dst`` is left as it was. Siblings left by a
    writer that was killed (its process is gone) are removed first."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.{os.getpid()}.", suffix=".tmp", dir=dst.parent))
    try:
        yield tmp
        _replace_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sweep_stale(dst: Path) -> None:
    """Remove the staging and swap-out siblings of ``dst`` whose writing process no longer exists."""
    for p in dst.parent.glob(f".{glob.escape(dst.name)}.*"):
        m = re.fullmatch(rf"\.{re.escape(dst.name)}\.(?:(\d+)\.[a-z0-9_]{{8}}\.tmp|old-(\d+))", p.name)
        if m and not _alive(int(m.group(1) or m.group(2))):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is swapped out first and removed only afterwards."""
    if not dst.exists():
        os.rename(src, dst)
        return
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    os.rename(dst, old)
    try:
        os.rename(src, dst)
    except BaseException:
        os.rename(old, dst)
        raise
    shutil.rmtree(old, ignore_errors=True)


_SIDECAR_INTS = ("obs_dim", "action_dim")


def _check_sidecar(info: DatasetInfo, sidecar: Path) -> DatasetInfo:
    """The sidecar's fields that the readers index by: text names, positive dimensions, one bound per
    action."""
    for name in ("task", "env_id", "env_version"):
        if not isinstance(getattr(info, name), str) or not getattr(info, name):
            raise DatasetError(f"{sidecar}: {name} must be a non-empty string, got {getattr(info, name)!r}")
    for name in _SIDECAR_INTS:
        value = getattr(info, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DatasetError(f"{sidecar}: {name} must be a positive integer, got {value!r}")
    for name in ("action_low", "action_high"):
        bounds = getattr(info, name)
        numbers = isinstance(bounds, list) and all(
            isinstance(b, int | float) and not isinstance(b, bool) for b in bounds
        )
        if not numbers or len(bounds) != info.action_dim:
            raise DatasetError(
                f"{sidecar}: {name} must be a list of {info.action_dim} numbers (action_dim), got {bounds!r}"
            )
    if (
        not isinstance(info.num_transitions, int)
        or isinstance(info.num_transitions, bool)
        or info.num_transitions < 0
    ):
        raise DatasetError(
            f"{sidecar}: num_transitions must be a non-negative integer, got {info.num_transitions!r}"
        )
    return info


def read_info(path: str | Path) -> DatasetInfo:
    """The sidecar of the dataset at ``path``; :class:`DatasetError` names the file and what is wrong with
    it."""
    path = Path(path)
    sidecar = path / SIDECAR_FILE
    if not sidecar.is_file():
        raise DatasetError(f"{path}: not a dataset directory (missing {SIDECAR_FILE})")
    try:
        raw = json.loads(sidecar.read_text())
    except (OSError, ValueError) as e:  # ValueError: JSON or UTF-8 decoding
        raise DatasetError(f"{sidecar}: malformed sidecar: {e}") from e
    if not isinstance(raw, dict):
        raise DatasetError(f"{sidecar}: malformed sidecar: expected a JSON object, got {type(raw).__name__}")
    try:
        info = DatasetInfo(**raw)
    except TypeError as e:
        raise DatasetError(f"{sidecar}: malformed sidecar: {e}") from e
    return _check_sidecar(info, sidecar)


def _require_rows(table: pa.Table, source: str) -> pa.Table:
    if table.num_rows == 0:
        raise DatasetError(f"{source}: the dataset has 0 rows")
    return table


def read_table(path: str | Path) -> pa.Table:
    """The transitions of the dataset at ``path`` as an Arrow table; a missing, unreadable or empty file
    is a :class:`DatasetError` that names the file and the cause."""
    path = Path(path)
    f = path / TRANSITIONS_FILE
    if not f.is_file():
        raise DatasetError(f"{path}: missing {TRANSITIONS_FILE}")
    # metadata strings repeat (one data version per collection run): keep them dictionary-encoded
    strings = [n for n, t in METADATA_COLUMNS.items() if t == pa.string()]
    try:
        table = pq.read_table(f, read_dictionary=strings)
    except (pa.ArrowException, OSError) as e:  # truncated, corrupt pages, failed decompression
        raise DatasetError(f"{f}: cannot read the Parquet file ({type(e).__name__}): {e}") from e
    return _require_rows(table, str(f))


def read_dataset(path: str | Path) -> tuple[Transitions, DatasetInfo]:
    """Read a dataset into contiguous arrays, checking schema and shapes against the sidecar."""
    path = Path(path)
    info = read_info(path)
    table = read_table(path)
    return table_to_transitions(table, info, source=str(path / TRANSITIONS_FILE)), info


def _check_widths(col: pa.Array, name: str, dim: int, source: str) -> None:
    """Every row of the list column ``col`` holds ``dim`` values (a wrong row would shift every later one)."""
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != dim)
    if wrong.size:
        rows = ", ".join(f"row {i} has {lengths[i]}" for i in wrong[:5])
        raise DatasetError(
            f"{source}: column {name!r} has {wrong.size} row(s) of the wrong width ({rows}); "
            f"expected dimension {dim} per row (from {SIDECAR_FILE})"
        )


def _vector(table: pa.Table, name: str, dim: int, source: str) -> np.ndarray:
    """The list column ``name`` as a contiguous ``(N, dim)`` float32 array, each row's width checked."""
    col = table.column(name).combine_chunks()
    typ = col.type
    if not (pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        raise DatasetError(f"{source}: column {name!r} must be a list of floats, got {typ}")
    if not (pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type)):
        raise DatasetError(f"{source}: column {name!r} must be a list of floats, got {typ}")
    if col.null_count:
        raise DatasetError(f"{source}: column {name!r} has {col.null_count} null row(s)")
    n = table.num_rows
    flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if flat.size != n * dim:
        raise DatasetError(
            f"{source}: column {name!r} has {flat.size} values for {n} rows; "
            f"expected dimension {dim} per row (from {SIDECAR_FILE})"
        )
    _check_widths(col, name, dim, source)
    return flat.reshape(n, dim)


def _scalar(table: pa.Table, name: str, typ: pa.DataType, source: str) -> np.ndarray:
    """The scalar column ``name`` as a numpy array of ``typ`` (strings as objects), without nulls."""
    col = table.column(name).combine_chunks()
    if col.null_count:
        raise DatasetError(f"{source}: column {name!r} has {col.null_count} null value(s)")
    if pa.types.is_dictionary(col.type) and typ == pa.string():
        # a handful of distinct strings: build them once, then index (no per-row str objects)
        values = np.asarray(col.dictionary.cast(pa.string()).to_pylist(), dtype=object)
        return values[col.indices.to_numpy(zero_copy_only=False)]
    try:
        col = col.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DatasetError(f"{source}: column {name!r} has type {col.type}, expected {typ}: {e}") from e
    return col.to_numpy(zero_copy_only=False)


def table_to_transitions(table: pa.Table, info: DatasetInfo, source: str = "<table>") -> Transitions:
    """The rows of ``table`` as :class:`Transitions`, after checking columns, types, nulls and each row's
    vector widths against the sidecar ``info``; anything wrong is a :class:`DatasetError` naming the
    column."""
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise DatasetError(f"{source}: missing column(s) {missing}")
    _require_rows(table, source)
    dims = {"obs": info.obs_dim, "next_obs": info.obs_dim, "action": info.action_dim}
    out = {name: _vector(table, name, dims[name], source) for name in VECTOR_COLUMNS}
    for name, typ in (*SCALAR_COLUMNS.items(), *METADATA_COLUMNS.items()):
        out[name] = _scalar(table, name, typ, source)
    return Transitions(**out)


def content_digest(path: str | Path) -> str:
    """sha256 over a dataset directory's files (relative path and contents, in sorted order): what it holds,
    wherever it lies."""
    import hashlib

    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()
