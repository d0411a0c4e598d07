"""The behaviour run behind generated datasets: the project's SAC trained online on a task.

It snapshots the policy at regular evaluations; :mod:`arl_models.data.generate` takes the ``expert``
(best) and ``medium`` snapshots and the run's replay from it. A run is cached by task, version, seed,
steps and cost penalty, so generating several qualities trains SAC once. A run writes a checkpoint every
tenth of its steps (SAC with its optimisers, the replay, the recorded rows, the snapshots, the random
streams) and an interrupted run resumes from it; the episode cut by the interruption ends truncated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from arl_models.algos.sac import SAC, SACConfig
from arl_models.checkpoint import (
    has_train_state,
    load_train_state,
    load_weights,
    save_checkpoint,
    save_policy,
    saved_record,
)
from arl_models.data.dataset import DatasetInfo, write_dataset
from arl_models.data.recorder import COLUMNS, TransitionRecorder, policy_hash
from arl_models.envs.registry import TaskSpec, env_dims, make_env
from arl_models.evaluate import evaluate
from arl_models.nets import TanhGaussianActor
from arl_models.replay import ActionScaler, ReplayBuffer

RANDOM_POLICY_HASH = hashlib.sha256(b"uniform-random-policy").hexdigest()
RESUME = ".resume"
"""The folder, inside a behaviour run's directory, that holds its checkpoint until the run completes."""


@dataclass(frozen=True)
class BehaviourConfig:
    sac: SACConfig
    steps: int
    """Environment steps of the behaviour SAC run (one gradient step each)."""
    learning_starts: int = 1000
    eval_every: int = 1000
    eval_episodes: int = 5
    cost_penalty: float = 0.0
    """k in the behaviour's objective ``reward - k * cost`` (0: the task's reward alone)."""

    def objective(self, reward: float, cost: float) -> float:
        """What the behaviour learns and its snapshots are ranked by, per step or per episode."""
        return reward - self.cost_penalty * cost


# The behaviour run of each task: SAC's size, its steps, and evaluations (snapshots) dense enough that one
# falls in the climb from random, where ``medium`` is taken. The MuJoCo locomotion tasks share one.
_LOCOMOTION = BehaviourConfig(
    SACConfig(learn_cost=False), steps=300_000, learning_starts=10_000, eval_every=2_000
)
BEHAVIOUR: dict[str, BehaviourConfig] = {
    "safe-pendulum": BehaviourConfig(
        SACConfig(hidden=(64, 64), learn_cost=False), steps=12_000, eval_every=500
    ),
    **dict.fromkeys(("safe-hopper", "safe-halfcheetah", "safe-walker2d"), _LOCOMOTION),
}


def behaviour_config(
    task: str, steps: int | None = None, seed: int = 0, cost_penalty: float = 0.0
) -> BehaviourConfig:
    if cost_penalty < 0:
        raise ValueError(f"cost_penalty must be >= 0, got {cost_penalty}")
    name = task.partition("@")[0]
    base = BEHAVIOUR.get(
        name,
        BehaviourConfig(SACConfig(learn_cost=False), steps=100_000, learning_starts=5_000, eval_every=2_000),
    )
    return replace(
        base, sac=replace(base.sac, seed=seed), steps=steps or base.steps, cost_penalty=float(cost_penalty)
    )


def default_behaviour_dir(spec: TaskSpec, cfg: BehaviourConfig) -> Path:
    # the cost function and dynamics are part of the key: a changed threshold invalidates the replay's costs
    tag = hashlib.sha256(f"{spec.cost_fn!r}|{spec.dynamics!r}|{cfg!r}".encode()).hexdigest()[:10]
    penalty = f"-penalty{cfg.cost_penalty:g}" if cfg.cost_penalty else ""  # readable; the tag covers it too
    return Path.home() / ".cache" / "arl" / "behaviour" / f"{spec.key}-seed{cfg.sac.seed}{penalty}-{tag}"


def env_record(spec: TaskSpec) -> dict[str, Any]:
    obs_dim, act_dim, low, high, horizon = env_dims(spec)
    return {
        "task": spec.name,
        "env_id": spec.env_id,
        "env_version": spec.env_version,
        "obs_dim": obs_dim,
        "action_dim": act_dim,
        "action_low": low.tolist(),
        "action_high": high.tolist(),
        "cost_budget": spec.cost_budget,
        "max_episode_steps": horizon,
    }


def dataset_info(
    spec: TaskSpec, env_rec: dict, quality: str, random_return: float, expert_return: float, **extra
) -> DatasetInfo:
    return DatasetInfo(
        task=spec.name,
        env_id=spec.env_id,
        env_version=spec.env_version,
        obs_dim=env_rec["obs_dim"],
        action_dim=env_rec["action_dim"],
        action_low=env_rec["action_low"],
        action_high=env_rec["action_high"],
        quality=quality,
        ref_random_return=float(random_return),
        ref_expert_return=float(expert_return),
        cost_budget=spec.cost_budget,
        source="arl data generate",
        extra={"max_episode_steps": env_rec["max_episode_steps"], "cost_fn": repr(spec.cost_fn), **extra},
    )


@dataclass
class _Run:
    """Everything a behaviour run carries from one step to the next, and what its checkpoint holds."""

    sac: SAC
    buffer: ReplayBuffer
    rec: TransitionRecorder
    rng: np.random.Generator
    random_eval: tuple[float, float]
    """The uniform-random policy's mean return and cost."""
    snapshots: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    policy: str = RANDOM_POLICY_HASH
    """The hash of the policy acting now (recorded on every row)."""
    t: int = 0
    """Environment steps done."""


def train_behaviour(
    spec: TaskSpec, out: Path, cfg: BehaviourConfig, progress: bool = True, stop_after: int | None = None
) -> Path | None:
    """Train SAC online; save expert and medium actors, the replay, and the reference returns in ``out``.

    A checkpoint in ``out`` of the same settings resumes. ``stop_after`` ends the call after that many
    environment steps in all, with a checkpoint, and returns None (as an interruption would).
    """
    env_rec = env_record(spec)
    scaler = ActionScaler.of(env_rec["action_low"], env_rec["action_high"])
    run = (
        _resume(out / RESUME, cfg, env_rec)
        if has_train_state(out / RESUME)
        else _start(spec, cfg, env_rec, scaler)
    )
    stop = min(cfg.steps, stop_after or cfg.steps)
    doing = f"resuming at step {run.t:,} of" if run.t else "training"
    print(
        f"{doing} the behaviour SAC of {spec.key}: {cfg.steps:,} environment steps, one gradient step each "
        f"after {cfg.learning_starts:,}; cached in {out}, so other qualities reuse it",
        flush=True,
    )
    env = make_env(spec)
    env.action_space.seed(cfg.sac.seed + run.t)
    obs, _ = env.reset(seed=cfg.sac.seed + run.t)
    start, first, tenth = time.perf_counter(), run.t, max(cfg.steps // 10, 1)
    steps = range(run.t + 1, stop + 1)
    desc = f"behaviour SAC {spec.key}"
    for t in tqdm(steps, desc, total=stop, initial=run.t, disable=not progress, unit="step"):
        obs = _step(run, env, obs, t, cfg, scaler, spec)
        if t % tenth == 0 and t < cfg.steps:
            if not progress:
                _report_progress(t - first, cfg.steps - first, time.perf_counter() - start)
            _save_run(out / RESUME, run, cfg)
    env.close()
    if stop < cfg.steps:
        _save_run(out / RESUME, run, cfg)
        return None
    path = _save_behaviour(out, spec, env_rec, run, cfg)
    shutil.rmtree(out / RESUME, ignore_errors=True)
    return path


def _start(spec: TaskSpec, cfg: BehaviourConfig, env_rec: dict[str, Any], scaler: ActionScaler) -> _Run:
    rng = np.random.default_rng(cfg.sac.seed)
    act_dim = env_rec["action_dim"]
    random = evaluate(
        lambda o: scaler.unnormalize(rng.uniform(-1, 1, (len(o), act_dim))), spec, 10, seed=cfg.sac.seed + 1
    )
    return _Run(
        sac=SAC(env_rec["obs_dim"], act_dim, cfg.sac),
        buffer=ReplayBuffer(cfg.steps, env_rec["obs_dim"], act_dim),
        rec=TransitionRecorder(),
        rng=rng,
        random_eval=(random.mean_return, random.mean_cost),
    )


def _step(
    run: _Run,
    env: gym.Env,
    obs: np.ndarray,
    t: int,
    cfg: BehaviourConfig,
    scaler: ActionScaler,
    spec: TaskSpec,
) -> np.ndarray:
    """One environment step, its gradient step and, every ``eval_every``, a snapshot; the next observation."""
    if t <= cfg.learning_starts:
        a_n = np.asarray(run.rng.uniform(-1.0, 1.0, scaler.low.shape[-1]), dtype=np.float32)
    else:
        a_n = run.sac.act(obs[None], deterministic=False)[0]
    a = scaler.unnormalize(a_n)
    next_obs, r, term, trunc, info = env.step(a)
    run.rec.add(obs, a, r, info["cost"], next_obs, term, trunc, policy=run.policy)
    run.buffer.add(
        obs=obs[None],
        act=a_n[None],
        rew=np.array([cfg.objective(float(r), info["cost"])]),
        cost=np.array([info["cost"]]),
        next_obs=next_obs[None],
        done=np.array([float(term)]),
    )
    run.t = t
    if t > cfg.learning_starts:
        run.sac.update(run.buffer.sample(cfg.sac.batch_size))
    if t % cfg.eval_every == 0 and t > cfg.learning_starts:
        res = evaluate(
            lambda o: scaler.unnormalize(run.sac.act(o)), spec, cfg.eval_episodes, seed=cfg.sac.seed + 2
        )
        state = {k: v.clone() for k, v in run.sac.actor.state_dict().items()}
        run.policy = policy_hash(state)
        run.snapshots.append(
            {
                "step": t,
                "return": res.mean_return,
                "cost": res.mean_cost,
                "state": state,
                "hash": run.policy,
                "objective": cfg.objective(res.mean_return, res.mean_cost),
            }
        )
    return env.reset()[0] if (term or trunc) else next_obs


def _save_run(where: Path, run: _Run, cfg: BehaviourConfig) -> None:
    hashes = sorted(set(run.rec.policy_hashes))
    index = {h: i for i, h in enumerate(hashes)}
    rows = {f"rec.{k}": torch.as_tensor(v) for k, v in run.rec.columns().items()}
    rows["rec.policy"] = torch.as_tensor([index[h] for h in run.rec.policy_hashes], dtype=torch.int32)
    snaps = {f"snap.{i}.{k}": v for i, s in enumerate(run.snapshots) for k, v in s["state"].items()}
    record = {
        "behaviour": repr(cfg),
        "t": run.t,
        "policy": run.policy,
        "rng": run.rng.bit_generator.state,
        "random_eval": list(run.random_eval),
        "recorder": {"episode_id": run.rec.episode_id, "t": run.rec.t, "hashes": hashes},
        "snapshots": [{k: v for k, v in s.items() if k != "state"} for s in run.snapshots],
    }
    save_checkpoint(where, run.sac, record, extra_tensors=run.buffer.state_dict() | rows | snaps)


def _resume(where: Path, cfg: BehaviourConfig, env_rec: dict[str, Any]) -> _Run:
    record = saved_record(where)
    if record.get("behaviour") != repr(cfg):
        raise ValueError(
            f"{where} holds the checkpoint of a behaviour run with other settings; delete it or pass another "
            f"--behaviour-dir (saved: {record.get('behaviour')}; asked: {cfg!r})"
        )
    sac = SAC(env_rec["obs_dim"], env_rec["action_dim"], cfg.sac)
    tensors = load_train_state(where, sac)
    buffer = ReplayBuffer(cfg.steps, env_rec["obs_dim"], env_rec["action_dim"])
    buffer.load_state_dict(tensors)
    hashes, saved = record["recorder"]["hashes"], record["recorder"]
    rec = TransitionRecorder.restore(
        {k: tensors[f"rec.{k}"].numpy() for k in COLUMNS},
        [hashes[i] for i in tensors["rec.policy"].tolist()],
        saved["episode_id"],
        saved["t"],
    )
    rec.end_episode()  # the interrupted episode ends here; the run goes on from a fresh reset
    rng = np.random.default_rng()
    rng.bit_generator.state = record["rng"]
    snapshots = [
        s | {"state": {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"snap.{i}.")}}
        for i, s in enumerate(record["snapshots"])
    ]
    return _Run(sac, buffer, rec, rng, tuple(record["random_eval"]), snapshots, record["policy"], record["t"])


def _report_progress(done: int, total: int, elapsed: float) -> None:
    left = elapsed / done * (total - done)
    print(
        f"behaviour SAC: {done:,}/{total:,} steps in {elapsed / 60:.1f} min, about {left / 60:.1f} min left",
        flush=True,
    )


def _save_behaviour(out: Path, spec: TaskSpec, env_rec: dict, run: _Run, cfg: BehaviourConfig) -> Path:
    snapshots = run.snapshots
    if not snapshots:
        raise ValueError(
            f"behaviour run of {spec.key} made no evaluations: steps must exceed learning_starts + eval_every"
        )
    # ranked by the objective the behaviour learns (the return itself when there is no cost penalty)
    random_return, random_objective = run.random_eval[0], cfg.objective(*run.random_eval)
    expert = max(snapshots, key=lambda s: s["objective"])
    span = expert["objective"] - random_objective
    scores = [100.0 * (s["objective"] - random_objective) / span for s in snapshots]
    medium_candidates = [i for i, s in enumerate(snapshots) if s["step"] <= expert["step"]]
    medium = snapshots[min(medium_candidates, key=lambda i: abs(scores[i] - 33.0))]
    out.mkdir(parents=True, exist_ok=True)
    actor_rec = {"algo": "sac", "config": dataclasses.asdict(cfg.sac), "env": env_rec}
    for name, snap in (("expert", expert), ("medium", medium)):
        actor = TanhGaussianActor(
            env_rec["obs_dim"], env_rec["action_dim"], cfg.sac.hidden, cfg.sac.context_dim
        )
        load_weights(actor, snap["state"], "", out)
        save_policy(
            out / name, actor, actor_rec | {"snapshot_step": snap["step"], "policy_hash": snap["hash"]}
        )
    t = run.rec.to_transitions(spec.env_version, cfg.sac.seed)
    info = dataset_info(spec, env_rec, "replay", random_return, expert["return"])
    write_dataset(out / "replay", t, info)
    refs = {
        "random_return": random_return,
        "expert_return": expert["return"],
        "expert_step": expert["step"],
        "medium_step": medium["step"],
        "medium_return": medium["return"],
        "cost_penalty": cfg.cost_penalty,
        "curve": [
            {"step": s["step"], "return": s["return"], "cost": s["cost"], "objective": s["objective"]}
            for s in snapshots
        ],
    }
    (out / "behaviour.json").write_text(json.dumps(refs, indent=2) + "\n")
    return out
