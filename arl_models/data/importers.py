"""Importers for data users already have: Minari dataset directories and D4RL-style HDF5 files, and
:func:`relabel_costs` for a dataset of the project's own whose cost column predates its task's cost.

Both produce the project's format (:mod:`arl_models.data.dataset`). Where the source has no cost
signal, the task's cost function computes it from the observations (vectorised). Imported rows get
the data-version metadata too: ``policy_hash`` is the source's own when it records one, otherwise the
SHA-256 of the actions (an identifier of the unknown behaviour policy's data); ``random_seed`` and
``env_version`` come from the caller or the task. The reference returns are the caller's
(``ref_scores``) or else the task's (:func:`arl_models.data.references.resolve_references`); the sidecar
records them, their ``ref_source`` and, in ``extra.references``, where they come from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np

from arl_models.data.dataset import (
    DatasetError,
    DatasetInfo,
    Transitions,
    read_dataset,
    read_info,
    with_metadata,
    write_dataset,
)
from arl_models.data.references import given_references, resolve_references
from arl_models.envs.registry import TaskSpec, env_dims, get_task

D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")


def _costs(
    spec: TaskSpec, action: np.ndarray, next_obs: np.ndarray, given: np.ndarray | None, source: str
) -> np.ndarray:
    if given is not None:
        return np.asarray(given, np.float32)
    batch_cost = getattr(spec.cost_fn, "batch_cost", None)
    if batch_cost is None:
        raise DatasetError(
            f"{source}: no cost column and task {spec.name!r} cannot compute costs from its transitions"
        )
    return batch_cost(action, next_obs)


def _info(
    spec: TaskSpec, quality: str, n_source: str, costs_computed: bool, ref_scores: tuple[float, float] | None
) -> DatasetInfo:
    obs_dim, act_dim, low, high, horizon = env_dims(spec)
    refs = (
        given_references(ref_scores)
        if ref_scores is not None
        else resolve_references(spec.name, spec.env_version)
    )
    return DatasetInfo(
        task=spec.name,
        env_id=spec.env_id,
        env_version=spec.env_version,
        obs_dim=obs_dim,
        action_dim=act_dim,
        action_low=low.tolist(),
        action_high=high.tolist(),
        quality=quality,
        cost_budget=spec.cost_budget,
        ref_random_return=refs.random_return if refs else None,
        ref_expert_return=refs.expert_return if refs else None,
        ref_source=refs.source if refs else None,
        source=n_source,
        extra={
            "max_episode_steps": horizon,
            "cost_fn": repr(spec.cost_fn) if costs_computed else "given by the source",
            "references": refs.detail if refs else f"none known for {spec.key}",
        },
    )


def _check_dims(spec: TaskSpec, obs: np.ndarray, act: np.ndarray, source: str) -> None:
    obs_dim, act_dim, *_ = env_dims(spec)
    if obs.ndim != 2 or obs.shape[1] != obs_dim:
        raise DatasetError(
            f"{source}: observations have shape {obs.shape}; task {spec.key} needs (N, {obs_dim})"
        )
    if act.ndim != 2 or act.shape[1] != act_dim:
        raise DatasetError(f"{source}: actions have shape {act.shape}; task {spec.key} needs (N, {act_dim})")


@contextmanager
def _hdf5(path: str | Path) -> Iterator[h5py.File]:
    """``path`` open for reading; an unreadable file or a missing group is a :class:`DatasetError` naming
    it."""
    try:
        with h5py.File(path, "r") as f:
            yield f
    except (OSError, KeyError) as e:  # not HDF5, truncated, corrupt; a dataset absent from an episode group
        raise DatasetError(f"{path}: cannot read the HDF5 file ({type(e).__name__}): {e}") from e


def _episode_steps(episode_id: np.ndarray) -> np.ndarray:
    """Step index within each (contiguous) episode, vectorised."""
    starts = np.r_[0, np.flatnonzero(np.diff(episode_id)) + 1]
    lengths = np.diff(np.r_[starts, len(episode_id)])
    return (np.arange(len(episode_id)) - np.repeat(starts, lengths)).astype(np.int32)


def import_d4rl(
    path: str | Path,
    task: str,
    out: str | Path,
    *,
    quality: str = "imported",
    seed: int = 0,
    policy_hash: str | None = None,
    ref_scores: tuple[float, float] | None = None,
) -> DatasetInfo:
    """A D4RL-style HDF5 file (``observations, actions, rewards, terminals, timeouts``
    [, ``next_observations``]); ``ref_scores`` = (random, expert) returns, the task's references when not
    given."""
    spec = get_task(task)
    if ref_scores is not None:
        given_references(ref_scores)  # a bad pair fails before any reading
    src = str(path)
    with _hdf5(path) as f:
        missing = [k for k in D4RL_KEYS if k not in f]
        if missing:
            raise DatasetError(f"{src}: missing dataset(s) {missing} (a D4RL file has {list(D4RL_KEYS)})")
        obs = f["observations"][:].astype(np.float32)
        act = f["actions"][:].astype(np.float32)
        rew = f["rewards"][:].astype(np.float32).reshape(-1)
        term = f["terminals"][:].astype(bool).reshape(-1)
        tout = f["timeouts"][:].astype(bool).reshape(-1)
        nxt = f["next_observations"][:].astype(np.float32) if "next_observations" in f else None
        cost = f["infos/cost"][:] if "infos/cost" in f else (f["costs"][:] if "costs" in f else None)
    _check_dims(spec, obs, act, src)
    n = len(obs)
    if n == 0:
        raise DatasetError(f"{src}: the file holds 0 transitions")
    for name, arr in (("actions", act), ("rewards", rew), ("terminals", term), ("timeouts", tout)):
        if len(arr) != n:
            raise DatasetError(f"{src}: {name} has {len(arr)} rows, observations has {n}")
    done = term | tout
    episode_id = np.r_[0, np.cumsum(done[:-1])].astype(np.int64)
    if nxt is None:
        # As d4rl.qlearning_dataset: next_obs is the following row; a step whose episode ends without a
        # successor in the file (timeouts, the file's last row) has no next observation and is dropped.
        nxt = np.r_[obs[1:], obs[-1:]]
        keep = ~tout
        keep[-1] = bool(term[-1])
        # the step before a timeout becomes the truncated end of its episode
        trunc = np.r_[tout[1:], False] & keep
        if not keep[-1] and n > 1 and not done[-2]:
            trunc[-2] = True  # the file ends mid-episode: its last kept step ends the episode
    else:
        keep = np.ones(n, bool)
        trunc = tout
    sel = keep
    cost_arr = _costs(spec, act, nxt, None if cost is None else np.asarray(cost).reshape(-1), src)
    episode_id = episode_id[sel]
    ph = policy_hash or hashlib.sha256(act.tobytes()).hexdigest()
    t = Transitions(
        obs=obs[sel],
        action=act[sel],
        reward=rew[sel],
        cost=cost_arr[sel],
        next_obs=nxt[sel],
        terminated=term[sel],
        truncated=trunc[sel],
        episode_id=episode_id,
        step=_episode_steps(episode_id),
        **with_metadata(int(sel.sum()), env_version=spec.env_version, policy_hash=ph, random_seed=seed),
    )
    info = _info(spec, quality, f"d4rl:{Path(path).name}", costs_computed=cost is None, ref_scores=ref_scores)
    write_dataset(out, t, info)
    return read_info(out)


def import_minari(
    path: str | Path,
    task: str,
    out: str | Path,
    *,
    quality: str = "imported",
    seed: int = 0,
    policy_hash: str | None = None,
    ref_scores: tuple[float, float] | None = None,
) -> DatasetInfo:
    """A Minari dataset directory (``data/main_data.hdf5`` with one group per episode); ``ref_scores`` as
    :func:`import_d4rl`'s."""
    spec = get_task(task)
    if ref_scores is not None:
        given_references(ref_scores)
    path = Path(path)
    h5 = path / "data" / "main_data.hdf5"
    if not h5.is_file():
        h5 = path if path.suffix in (".hdf5", ".h5") else h5
    if not h5.is_file():
        raise DatasetError(f"{path}: not a Minari dataset directory (no data/main_data.hdf5)")
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("obs", "next_obs", "act", "rew", "cost", "term", "trunc", "ep")
    }
    with _hdf5(h5) as f:
        episodes = sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_")[1]))
        if not episodes:
            raise DatasetError(f"{h5}: no episode_* groups")
        for i, name in enumerate(episodes):
            g = f[name]
            o = g["observations"][:].astype(np.float32)
            a = g["actions"][:].astype(np.float32)
            steps = len(a)
            if len(o) != steps + 1:
                raise DatasetError(
                    f"{h5}:{name}: observations has {len(o)} rows, expected actions+1 = {steps + 1}"
                )
            parts["obs"].append(o[:-1])
            parts["next_obs"].append(o[1:])
            parts["act"].append(a)
            parts["rew"].append(g["rewards"][:].astype(np.float32))
            parts["term"].append(g["terminations"][:].astype(bool))
            parts["trunc"].append(g["truncations"][:].astype(bool))
            parts["cost"].append(
                g["infos/cost"][:].astype(np.float32)
                if "infos/cost" in g
                else np.full(steps, np.nan, np.float32)
            )
            parts["ep"].append(np.full(steps, i, np.int64))
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    _check_dims(spec, cat["obs"], cat["act"], str(h5))
    given = None if np.isnan(cat["cost"]).any() else cat["cost"]
    n = len(cat["rew"])
    if n == 0:
        raise DatasetError(f"{h5}: the episodes hold 0 transitions")
    ph = policy_hash or hashlib.sha256(cat["act"].tobytes()).hexdigest()
    t = Transitions(
        obs=cat["obs"],
        action=cat["act"],
        reward=cat["rew"],
        cost=_costs(spec, cat["act"], cat["next_obs"], given, str(h5)),
        next_obs=cat["next_obs"],
        terminated=cat["term"],
        truncated=cat["trunc"],
        episode_id=cat["ep"],
        step=_episode_steps(cat["ep"]),
        **with_metadata(n, env_version=spec.env_version, policy_hash=ph, random_seed=seed),
    )
    info = _info(spec, quality, f"minari:{path.name}", costs_computed=given is None, ref_scores=ref_scores)
    write_dataset(out, t, info)
    return read_info(out)


def relabel_costs(src: str | Path, out: str | Path) -> DatasetInfo:
    """Write ``src`` to ``out`` with its cost column recomputed by its task's current cost function.

    Everything else (rows, version metadata, timestamps) is kept; ``extra.cost_fn`` records the new
    labelling and ``extra.relabelled_from`` the old one. ``out`` is written atomically.
    """
    t, info = read_dataset(src)
    spec = get_task(info.task, info.env_version)
    if getattr(spec.cost_fn, "batch_cost", None) is None:
        raise DatasetError(f"{src}: task {spec.key} cannot compute costs from stored transitions")
    old = info.extra.get("cost_fn", "unrecorded")
    extra = info.extra | {"cost_fn": repr(spec.cost_fn), "relabelled_from": old}
    write_dataset(
        out, replace(t, cost=_costs(spec, t.action, t.next_obs, None, str(src))), replace(info, extra=extra)
    )
    return read_info(out)
