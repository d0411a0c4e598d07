"""Generating datasets locally, the D4RL way (Fu et al. 2020), on this project's simulator versions.

A behaviour run (:mod:`arl_models.data.behaviour`) trains the project's own SAC on the task, snapshotting
the policy at regular evaluations. From it:

- ``expert``: the best snapshot; ``medium``: the snapshot whose normalised score is nearest 33
  (about a third of the way from random to expert), both sampled stochastically;
- ``random``: uniform random actions;
- ``medium-replay``: the behaviour run's own replay, up to the moment the medium policy was taken;
- ``medium-expert``: half medium, half expert.

With ``cost_penalty`` k > 0 the behaviour SAC learns from ``reward - k * cost`` and its snapshots are
ranked by ``return - k * cost``, the way safe offline RL datasets (DSRL) come from cost-aware behaviour:
the data then hold episodes within the cost budget, which an unpenalised run on a velocity-limited task
never visits. The recorded rows keep the task's own reward; the penalty only steers the behaviour.

The reference scores (random and expert returns) are measured here and stored in the sidecar, never
copied from D4RL.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from arl_models.checkpoint import load_policy
from arl_models.data.behaviour import (
    RANDOM_POLICY_HASH,
    behaviour_config,
    dataset_info,
    default_behaviour_dir,
    env_record,
    train_behaviour,
)
from arl_models.data.dataset import DatasetInfo, Transitions, read_dataset, read_info, write_dataset
from arl_models.data.recorder import rollout
from arl_models.envs.registry import TaskSpec, get_task

QUALITIES = ("random", "medium", "expert", "medium-replay", "medium-expert")


def generate_dataset(
    task: str,
    quality: str,
    out: str | Path,
    *,
    transitions: int = 100_000,
    seed: int = 0,
    behaviour_steps: int | None = None,
    behaviour_dir: str | Path | None = None,
    cost_penalty: float = 0.0,
    progress: bool = True,
) -> DatasetInfo:
    """Generate one dataset of ``quality`` for ``task`` (``name`` or ``name@version``) into ``out``.

    ``cost_penalty`` k > 0 trains the behaviour on ``reward - k * cost`` (see the module's docstring).
    """
    if quality not in QUALITIES:
        raise ValueError(f"unknown quality {quality!r}; choose one of {', '.join(QUALITIES)}")
    spec = get_task(task)
    cfg = behaviour_config(spec.name, behaviour_steps, seed, cost_penalty)
    bdir = Path(behaviour_dir) if behaviour_dir else default_behaviour_dir(spec, cfg)
    if not (bdir / "behaviour.json").is_file():
        train_behaviour(spec, bdir, cfg, progress)
    refs = json.loads((bdir / "behaviour.json").read_text())
    if refs.get("cost_penalty", 0.0) != cfg.cost_penalty:
        raise ValueError(
            f"behaviour run {bdir} was trained with cost penalty {refs.get('cost_penalty', 0.0):g}, "
            f"not {cfg.cost_penalty:g}; pass its own penalty or another --behaviour-dir"
        )
    env_rec = env_record(spec)
    info = dataset_info(
        spec,
        env_rec,
        quality,
        refs["random_return"],
        refs["expert_return"],
        behaviour_dir=str(bdir),
        behaviour_cost_penalty=cfg.cost_penalty,
    )
    data = _collect(quality, spec, bdir, refs, env_rec, transitions, seed, progress)
    write_dataset(out, data, info)
    return read_info(out)


def _collect(quality, spec, bdir, refs, env_rec, n, seed, progress) -> Transitions:
    if quality == "medium-replay":
        t, _ = read_dataset(bdir / "replay")
        last_ep = t.episode_id[min(refs["medium_step"], len(t)) - 1]
        return t.select(t.episode_id <= last_ep)
    if quality == "random":
        rng = np.random.default_rng(seed)
        low, high = np.asarray(env_rec["action_low"]), np.asarray(env_rec["action_high"])
        return rollout(
            lambda o: rng.uniform(low, high).astype(np.float32),
            spec,
            n,
            seed,
            RANDOM_POLICY_HASH,
            progress,
            "random",
        )
    if quality in ("medium", "expert"):
        return _policy_rollout(bdir / quality, spec, n, seed, progress)
    medium = _policy_rollout(bdir / "medium", spec, n // 2, seed, progress)
    expert = _policy_rollout(bdir / "expert", spec, n - n // 2, seed + 1, progress)
    return Transitions.concat([medium, expert])


def _policy_rollout(pdir: Path, spec: TaskSpec, n: int, seed: int, progress: bool) -> Transitions:
    policy = load_policy(pdir)
    torch.manual_seed(seed)
    return rollout(
        lambda o: policy.act(o, deterministic=False),
        spec,
        n,
        seed,
        policy.record["policy_hash"],
        progress,
        pdir.name,
    )
