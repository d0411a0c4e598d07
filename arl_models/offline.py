"""The offline stages as plain functions: dataset in, checkpoint directory and metrics record out.

These are what the ``arl train`` command and the pipeline's Prefect tasks call.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from arl_models.algos.bc import BC, BCConfig
from arl_models.algos.calql import mc_returns
from arl_models.algos.constrained import fit_cost_to_go
from arl_models.algos.cql import CQL
from arl_models.algos.iql import IQL
from arl_models.algos.rebrac import ReBRAC
from arl_models.algos.td3bc import TD3BC
from arl_models.checkpoint import config_record, load_policy, record_references
from arl_models.data.dataset import DatasetInfo, Transitions, content_digest, read_dataset, read_info
from arl_models.envs.registry import context_dim_of, get_task
from arl_models.evaluate import EVAL_SEED, EvalResult, Evaluator, evaluate
from arl_models.metrics import MetricSink
from arl_models.nets import standardize_inputs
from arl_models.presets import DEFAULT_PRESET, get_preset
from arl_models.prioritized import PERConfig, PrioritizedReplay
from arl_models.replay import ActionScaler, ReplayBuffer
from arl_models.train import fit
from arl_models.warm_start import actor_from

OFFLINE_CLASSES: dict[str, type] = {"cql": CQL, "td3bc": TD3BC, "iql": IQL, "rebrac": ReBRAC}
"""Stage 2's algorithms by name (``presets.OFFLINE_ALGOS``)."""


def env_record(info: DatasetInfo) -> dict[str, Any]:
    return {
        "task": info.task,
        "env_id": info.env_id,
        "env_version": info.env_version,
        "obs_dim": info.obs_dim,
        "action_dim": info.action_dim,
        "action_low": list(info.action_low),
        "action_high": list(info.action_high),
        "cost_budget": info.cost_budget,
        "ref_random_return": info.ref_random_return,
        "ref_expert_return": info.ref_expert_return,
    }


def dataset_record(path: str | Path, info: DatasetInfo) -> dict[str, Any]:
    return {
        "path": str(path),
        "quality": info.quality,
        "num_transitions": info.num_transitions,
        "digest": content_digest(path),
    }


def evaluate_checkpoint(
    policy_dir: str | Path,
    task: str | None = None,
    episodes: int = 10,
    seed: int = EVAL_SEED,
    ref_scores: tuple[float, float] | None = None,
) -> EvalResult:
    """Evaluate a checkpoint on its own task (or ``task``), with the reference scores it was trained with
    (or ``ref_scores``: another policy's, to score both on one scale)."""
    policy = load_policy(policy_dir)
    env = policy.record["env"]
    spec = get_task(task) if task else get_task(env["task"], env["env_version"])
    refs = ref_scores or record_references(policy.record)
    return evaluate(policy.act, spec, episodes=episodes, seed=seed, ref_scores=refs)


def live_eval(
    algo: Any, scaler: ActionScaler, info: DatasetInfo, episodes: int, prefix: str = "eval/"
) -> Evaluator | None:
    """The evaluation of the live policy on the dataset's task, with the dataset's references, or ``None``
    for an unregistered environment."""
    try:
        spec = get_task(info.task, info.env_version)
    except KeyError:
        return None
    return Evaluator(
        lambda o: scaler.unnormalize(algo.act(o)), spec, episodes, info.references, prefix=prefix
    )


def _run(
    algo: Any,
    data: str | Path,
    out: str | Path,
    steps: int,
    sink: MetricSink | None,
    progress: bool,
    preset_name: str,
    t: Any,
    info: DatasetInfo,
    extra: dict[str, Any] | None = None,
    eval_episodes: int | None = None,
    prioritized: PERConfig | None = None,
    restart: bool = False,
) -> dict[str, float]:
    preset = get_preset(preset_name)
    out = Path(out)
    scaler = ActionScaler.of(info.action_low, info.action_high)
    buffer = ReplayBuffer.from_transitions(t, scaler, next_actions=getattr(algo, "next_actions", False))
    batch_size = algo.cfg.batch_size
    entries = {"preset": preset_name, **(extra or {})}
    if prioritized is not None:
        entries["prioritized"] = asdict(prioritized)
    record = config_record(algo, env_record(info), dataset_record(data, info), entries)
    per = None if prioritized is None else PrioritizedReplay.from_buffer(buffer, prioritized)
    episodes = preset.eval_episodes if eval_episodes is None else eval_episodes
    evaluate_fn = live_eval(algo, scaler, info, episodes) if episodes > 0 else None
    final = fit(
        algo,
        lambda: buffer.sample(batch_size),
        steps,
        out,
        record,
        sink=sink,
        log_every=preset.log_every,
        save_every=preset.save_every,
        evaluate=evaluate_fn,
        eval_every=preset.eval_every if evaluate_fn else 0,
        progress=progress,
        desc=f"{algo.name} {info.task}",
        prioritized=per,
        restart=restart,
    )
    return final


def train_bc(
    data: str | Path,
    out: str | Path,
    *,
    preset: str = DEFAULT_PRESET,
    seed: int = 0,
    steps: int | None = None,
    config: BCConfig | None = None,
    sink: MetricSink | None = None,
    progress: bool = True,
    eval_episodes: int | None = None,
    context_dim: int | None = None,
    restart: bool = False,
) -> dict[str, float]:
    """Stage 1: behaviour cloning on a dataset; writes a checkpoint to ``out``.

    ``context_dim``: observation entries that condition the actor (:func:`conditioning`). A checkpoint in
    ``out`` of the same settings and data is resumed, one of others refused; ``restart`` discards it."""
    p = get_preset(preset)
    t, info = read_dataset(data)
    cfg = replace(config or p.bc, seed=seed, context_dim=conditioning(info, context_dim))
    algo = bc_learner(cfg, info, t)
    return _run(
        algo,
        data,
        out,
        steps or p.bc_steps,
        sink,
        progress,
        preset,
        t,
        info,
        eval_episodes=eval_episodes,
        restart=restart,
    )


def bc_learner(cfg: BCConfig, info: DatasetInfo, t: Transitions) -> BC:
    """A BC learner for ``info``'s shapes, its input standardised on ``t`` (``normalize_obs``)."""
    return standardized(BC(info.obs_dim, info.action_dim, cfg), t)


def standardized(algo: Any, t: Transitions) -> Any:
    """``algo`` with every network's input standardised on ``t``'s observations where its config asks
    (``normalize_obs``)."""
    if algo.cfg.normalize_obs:
        standardize_inputs(algo.networks().values(), t.obs, algo.cfg.context_dim)
    return algo


def conditioning(info: DatasetInfo, context_dim: int | None) -> int:
    """How many trailing observation entries condition the networks (FiLM, ``nets.py``): ``context_dim``
    if given, else what the dataset's task shows of its plant (3 on the ``2.x`` versions, 0 elsewhere)."""
    return context_dim_of(info.task, info.env_version) if context_dim is None else context_dim


def cql_cost_limit(
    info: DatasetInfo, gamma: float, horizon: int | None = None, data: Transitions | None = None
) -> float | None:
    """The episode cost budget as a limit on the discounted cost value ``Q_c(s0, pi(s0))`` of an
    episode's start: the budget spread evenly over the episode's ``T`` steps, discounted,
    ``budget / T * (1 - gamma^T) / (1 - gamma)`` (the threshold of OSRL's Lagrangian baselines).

    ``Q_c`` is discounted and the budget is not, so holding ``Q_c(s0)`` to the budget itself admits
    about ``T (1 - gamma)`` budgets an episode when the cost is spread (safe-hopper: 1,000 steps at
    gamma 0.99, a limit of 2.5 for a budget of 25, not 25). ``T`` is the dataset's recorded episode
    length (``max_episode_steps``), else 1,000. Without episode starts the same value bounds ``Q_c``
    of the batch's states, whose remaining horizons are shorter.

    With ``data``, the limit is raised to the mean discounted cost that the data's own episodes within
    the budget pay from their starts, where that is higher: the even spread is the strictest timing, and
    a behaviour that meets the budget by paying early (a Hopper that sets off fast and falls by step 350:
    25 an episode at most, 6 discounted) would otherwise be infeasible, so the multiplier winds up and
    the policy learns to fall at once. Where no episode meets the budget, the limit is what the data's
    episodes pay on average (:class:`InfeasibleBudgetWarning`).
    """
    if info.cost_budget is None:
        return None
    t = horizon or int(info.extra.get("max_episode_steps", 1000))
    uniform = info.cost_budget / t * (1.0 - gamma**t) / (1.0 - gamma)
    if data is None:
        return uniform
    discounted, costs = data.episode_costs(gamma), data.episode_costs()
    within = discounted[costs <= info.cost_budget]
    if within.size:
        return max(uniform, float(within.mean()))
    # No episode of the data meets the budget, so the data cannot show what the budget allows: hold the policy
    # to what the data's behaviour pays, so that it improves its return without paying more. The cheapest
    # episodes are no target: on a log of failing and flailing they are the worst (the demo Pendulum data's
    # cheapest returns less than random actions), and a policy held to them learns to fail.
    paid = float(discounted.mean())
    warnings.warn(
        f"no episode of the dataset meets the cost budget {info.cost_budget:g} (the cheapest pays "
        f"{costs.min():.1f}): the constraint holds the policy to what the data's episodes pay on average "
        f"instead (discounted cost {paid:.2f} from their starts)",
        InfeasibleBudgetWarning,
        stacklevel=2,
    )
    return max(uniform, paid)


class InfeasibleBudgetWarning(UserWarning):
    """The data's own episodes cannot meet the cost budget the constrained stage was asked to hold."""


def held_to_budget(
    cls: type[Any], cfg: Any, info: DatasetInfo, t: Transitions, constrained: bool, calibrate: bool = True
) -> Any:
    """An offline algorithm for ``info``'s shapes, its inputs standardised on ``t`` (:func:`standardized`),
    its cost critic started at the data's cost-to-go with ``calibrate``
    (:func:`~arl_models.algos.constrained.fit_cost_to_go`; a learner about to load trained weights skips it);
    with ``constrained`` its actor is held to the dataset's episode cost budget on the data's episode starts,
    where ``Q_c(s0, pi(s0))`` is the expected (discounted) episode cost, against :func:`cql_cost_limit`
    unless ``cfg`` sets a limit of its own."""
    if constrained and cfg.cost_q_limit is None and info.cost_budget is not None:
        cfg = replace(cfg, cost_q_limit=cql_cost_limit(info, cfg.gamma, data=t))
    algo = standardized(cls(info.obs_dim, info.action_dim, cfg), t)
    nets = algo.networks()
    if calibrate and "cost_critic" in nets:
        act = ActionScaler.of(info.action_low, info.action_high).normalize(t.action)
        cost_to_go = torch.as_tensor(mc_returns(t.cost, t.episode_end, cfg.gamma))
        fit_cost_to_go(nets, torch.tensor(t.obs), torch.tensor(act), cost_to_go, seed=cfg.seed)
    starts = t.obs[t.step == 0]
    if constrained and len(starts):
        algo.constraint_obs = torch.as_tensor(starts, dtype=torch.float32)
    return algo


def train_offline_algo(
    algo: str,
    data: str | Path,
    out: str | Path,
    *,
    preset: str = DEFAULT_PRESET,
    seed: int = 0,
    steps: int | None = None,
    init_actor: str | Path | None = None,
    constrained: bool = True,
    config: Any = None,
    sink: MetricSink | None = None,
    progress: bool = True,
    eval_episodes: int | None = None,
    prioritized: PERConfig | None = None,
    context_dim: int | None = None,
    restart: bool = False,
) -> dict[str, float]:
    """Stage 2: offline RL (``cql``, ``td3bc``, ``iql`` or ``rebrac``) with a cost critic, optionally from a
    BC actor.

    With ``constrained`` the actor is held to the dataset's episode cost budget through a Lagrange
    multiplier on ``Q_c``. With ``prioritized`` (CQL only) batches are
    drawn by TD-error priority (``prioritized.py``) with IS-weighted critic losses. ``context_dim``:
    observation entries that condition actor and critics (:func:`conditioning`); a BC start must match.
    """
    p = get_preset(preset)
    if algo not in OFFLINE_CLASSES:
        raise ValueError(f"unknown offline algorithm {algo!r}; known: {', '.join(OFFLINE_CLASSES)}")
    cls = OFFLINE_CLASSES[algo]
    if prioritized is not None and algo != "cql":
        raise ValueError(f"prioritized replay is implemented for cql, not {algo}")
    t, info = read_dataset(data)
    cfg = replace(config or p.offline_config(algo), seed=seed, context_dim=conditioning(info, context_dim))
    learner = held_to_budget(cls, cfg, info, t, constrained)
    extra: dict[str, Any] = {}
    if init_actor is not None:
        extra["init_actor"] = actor_from(learner, init_actor)
    return _run(
        learner,
        data,
        out,
        steps or p.offline_steps_of(algo),
        sink,
        progress,
        preset,
        t,
        info,
        extra,
        eval_episodes,
        prioritized,
        restart,
    )


def train_cql(data: str | Path, out: str | Path, **kw: Any) -> dict[str, float]:
    """Stage 2 with CQL (:func:`train_offline_algo`)."""
    return train_offline_algo("cql", data, out, **kw)


def train_offline(
    data: str | Path,
    out: str | Path,
    *,
    preset: str = DEFAULT_PRESET,
    seed: int = 0,
    algo: str | None = None,
    bc_steps: int | None = None,
    steps: int | None = None,
    constrained: bool = True,
    sink: MetricSink | None = None,
    progress: bool = True,
    eval_episodes: int | None = None,
    restart: bool = False,
) -> dict[str, dict[str, float]]:
    """The pipeline's stages 1-2 at their defaults: BC into ``out/bc``, then stage 2's algorithm (``algo``,
    default the preset's for the data's task) from it into ``out/<algo>``; returns both final records by
    stage."""
    algo = algo or get_preset(preset).stage2_algo(read_info(data).task)
    out = Path(out)
    common: dict[str, Any] = {
        "preset": preset,
        "seed": seed,
        "sink": sink,
        "progress": progress,
        "eval_episodes": eval_episodes,
        "restart": restart,
    }
    bc = train_bc(data, out / "bc", steps=bc_steps, **common)
    stage2 = train_offline_algo(
        algo, data, out / algo, steps=steps, init_actor=out / "bc", constrained=constrained, **common
    )
    return {"bc": bc, algo: stage2}
