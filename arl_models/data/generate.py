"""Generating datasets locally, the D4RL way (Fu et al. 2020), on this project's simulator versions.

A behaviour run trains the project's own SAC on the task, snapshotting the policy at regular
evaluations. From it:

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
copied from D4RL. A behaviour run is cached by task, version, seed, steps and penalty, so generating several
qualities trains SAC once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from arl_models.algos.sac import SAC, SACConfig
from arl_models.checkpoint import load_policy, save_policy
from arl_models.data.dataset import DatasetInfo, Transitions, read_dataset, read_info, write_dataset
from arl_models.data.recorder import TransitionRecorder, policy_hash, rollout
from arl_models.envs.registry import TaskSpec, env_dims, get_task, make_env
from arl_models.evaluate import evaluate
from arl_models.nets import TanhGaussianActor
from arl_models.replay import ActionScaler, ReplayBuffer

QUALITIES = ("random", "medium", "expert", "medium-replay", "medium-expert")
RANDOM_POLICY_HASH = hashlib.sha256(b"uniform-random-policy").hexdigest()


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
# falls in the climb from random, where ``medium`` is taken.
BEHAVIOUR: dict[str, BehaviourConfig] = {
    "safe-pendulum": BehaviourConfig(
        SACConfig(hidden=(64, 64), learn_cost=False), steps=12_000, eval_every=500
    ),
    "safe-hopper": BehaviourConfig(
        SACConfig(learn_cost=False), steps=300_000, learning_starts=10_000, eval_every=2_000
    ),
    "safe-halfcheetah": BehaviourConfig(
        SACConfig(learn_cost=False), steps=300_000, learning_starts=10_000, eval_every=2_000
    ),
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


def _env_record(spec: TaskSpec) -> dict[str, Any]:
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


def train_behaviour(spec: TaskSpec, out: Path, cfg: BehaviourConfig, progress: bool = True) -> Path:
    """Train SAC online; save expert and medium actors, the replay, and the reference returns."""
    env_rec = _env_record(spec)
    scaler = ActionScaler.of(env_rec["action_low"], env_rec["action_high"])
    sac = SAC(env_rec["obs_dim"], env_rec["action_dim"], cfg.sac)
    buffer = ReplayBuffer(cfg.steps, env_rec["obs_dim"], env_rec["action_dim"])
    rec = TransitionRecorder()
    env = make_env(spec)
    seed = cfg.sac.seed
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    snapshots: list[dict[str, Any]] = []
    random_eval = evaluate(
        lambda o: scaler.unnormalize(rng.uniform(-1, 1, (len(o), env_rec["action_dim"]))),
        spec,
        10,
        seed=seed + 1,
    )
    current_hash = RANDOM_POLICY_HASH
    print(
        f"training the behaviour SAC of {spec.key} first: {cfg.steps:,} environment steps, one gradient "
        f"step each after {cfg.learning_starts:,}; cached in {out}, so other qualities reuse it",
        flush=True,
    )
    start, tenth = time.perf_counter(), max(cfg.steps // 10, 1)
    for t in tqdm(
        range(1, cfg.steps + 1), desc=f"behaviour SAC {spec.key}", disable=not progress, unit="step"
    ):
        if not progress and t % tenth == 0:
            _report_progress(t, cfg.steps, time.perf_counter() - start)
        if t <= cfg.learning_starts:
            a_n = rng.uniform(-1.0, 1.0, env_rec["action_dim"]).astype(np.float32)
        else:
            a_n = sac.act(obs[None], deterministic=False)[0]
        a = scaler.unnormalize(a_n)
        next_obs, r, term, trunc, info = env.step(a)
        rec.add(obs, a, r, info["cost"], next_obs, term, trunc, policy=current_hash)
        buffer.add(
            obs=obs[None],
            act=a_n[None],
            rew=np.array([cfg.objective(float(r), info["cost"])]),
            cost=np.array([info["cost"]]),
            next_obs=next_obs[None],
            done=np.array([float(term)]),
        )
        obs = env.reset()[0] if (term or trunc) else next_obs
        if t > cfg.learning_starts:
            sac.update(buffer.sample(cfg.sac.batch_size))
        if t % cfg.eval_every == 0 and t > cfg.learning_starts:
            res = evaluate(lambda o: scaler.unnormalize(sac.act(o)), spec, cfg.eval_episodes, seed=seed + 2)
            state = {k: v.clone() for k, v in sac.actor.state_dict().items()}
            current_hash = policy_hash(state)
            snapshots.append(
                {
                    "step": t,
                    "return": res.mean_return,
                    "cost": res.mean_cost,
                    "state": state,
                    "hash": current_hash,
                    "objective": cfg.objective(res.mean_return, res.mean_cost),
                }
            )
    env.close()
    return _save_behaviour(out, spec, env_rec, rec, snapshots, random_eval, cfg)


def _report_progress(done: int, total: int, elapsed: float) -> None:
    left = elapsed / done * (total - done)
    print(
        f"behaviour SAC: {done:,}/{total:,} steps in {elapsed / 60:.1f} min, about {left / 60:.1f} min left",
        flush=True,
    )


def _save_behaviour(out, spec, env_rec, rec, snapshots, random_eval, cfg) -> Path:
    if not snapshots:
        raise ValueError(
            f"behaviour run of {spec.key} made no evaluations: steps must exceed learning_starts + eval_every"
        )
    # ranked by the objective the behaviour learns (the return itself when there is no cost penalty)
    random_return, random_objective = (
        random_eval.mean_return,
        cfg.objective(random_eval.mean_return, random_eval.mean_cost),
    )
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
        actor.load_state_dict(snap["state"])
        save_policy(
            out / name, actor, actor_rec | {"snapshot_step": snap["step"], "policy_hash": snap["hash"]}
        )
    t = rec.to_transitions(spec.env_version, cfg.sac.seed)
    write_dataset(out / "replay", t, _info(spec, env_rec, "replay", random_return, expert["return"]))
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


def _info(
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


def default_behaviour_dir(spec: TaskSpec, cfg: BehaviourConfig) -> Path:
    # the cost function and dynamics are part of the key: a changed threshold invalidates the replay's costs
    tag = hashlib.sha256(f"{spec.cost_fn!r}|{spec.dynamics!r}|{cfg!r}".encode()).hexdigest()[:10]
    penalty = f"-penalty{cfg.cost_penalty:g}" if cfg.cost_penalty else ""  # readable; the tag covers it too
    return Path.home() / ".cache" / "arl" / "behaviour" / f"{spec.key}-seed{cfg.sac.seed}{penalty}-{tag}"


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
    env_rec = _env_record(spec)
    info = _info(
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
