"""Vectorised evaluation: return, normalised score, episode cost and the share of episodes over budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np

from arl_models.data.dataset import normalized_score
from arl_models.envs.registry import TaskSpec, get_task, make_env

EVAL_SEED = 12345
"""First episode seed of the stages' own evaluations (episode ``i`` starts from ``EVAL_SEED + i``)."""

ActFn = Callable[[np.ndarray], np.ndarray]
"""Maps a batch of observations ``(n, O)`` to environment actions ``(n, A)``."""


@dataclass(frozen=True)
class EvalResult:
    task: str
    env_version: str
    episodes: int
    mean_return: float
    std_return: float
    mean_cost: float
    over_budget_share: float
    cost_budget: float
    normalized_score: float | None
    returns: list[float]
    costs: list[float]

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {
            f"{prefix}return": self.mean_return,
            f"{prefix}return_std": self.std_return,
            f"{prefix}cost": self.mean_cost,
            f"{prefix}over_budget_share": self.over_budget_share,
        }
        if self.normalized_score is not None:
            out[f"{prefix}normalized_score"] = self.normalized_score
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def run_episodes(
    act: ActFn, task: str | TaskSpec, episodes: int = 10, seed: int = 0, num_envs: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``episodes`` episodes in a vector environment; returns per-episode (return, cost) arrays."""
    spec = get_task(task) if isinstance(task, str) else task
    n = num_envs or min(episodes, 16)
    envs = gym.vector.SyncVectorEnv([lambda: make_env(spec) for _ in range(n)])
    returns: list[float] = []
    costs: list[float] = []
    try:
        obs, _ = envs.reset(seed=seed)
        ep_ret, ep_cost = np.zeros(n), np.zeros(n)
        started = n  # episodes begun (each env runs one at a time)
        active = np.ones(n, dtype=bool)
        just_reset = np.zeros(n, dtype=bool)
        while active.any():
            obs, rew, term, trunc, info = envs.step(act(obs))
            valid = active & ~just_reset  # NEXT_STEP autoreset: this step only reset those envs
            ep_ret += np.where(valid, rew, 0.0)
            ep_cost += np.where(valid, info.get("cost", np.zeros(n)), 0.0)
            done = valid & (term | trunc)
            for i in np.flatnonzero(done):
                returns.append(float(ep_ret[i]))
                costs.append(float(ep_cost[i]))
                ep_ret[i] = ep_cost[i] = 0.0
                if started < episodes:
                    started += 1
                else:
                    active[i] = False
            just_reset = done
    finally:
        envs.close()
    return np.asarray(returns[:episodes]), np.asarray(costs[:episodes])


def evaluate(
    act: ActFn,
    task: str | TaskSpec,
    episodes: int = 10,
    seed: int = 0,
    cost_budget: float | None = None,
    ref_scores: tuple[float, float] | None = None,
) -> EvalResult:
    """Evaluate a policy; ``ref_scores`` = (random return, expert return) gives a normalised score."""
    spec = get_task(task) if isinstance(task, str) else task
    rets, costs = run_episodes(act, spec, episodes, seed)
    budget = spec.cost_budget if cost_budget is None else cost_budget
    norm = None
    if ref_scores is not None and ref_scores[1] != ref_scores[0]:
        norm = float(normalized_score(float(rets.mean()), ref_scores))
    return EvalResult(
        task=spec.name,
        env_version=spec.env_version,
        episodes=len(rets),
        mean_return=float(rets.mean()),
        std_return=float(rets.std()),
        mean_cost=float(costs.mean()),
        over_budget_share=float((costs > budget).mean()),
        cost_budget=float(budget),
        normalized_score=norm,
        returns=rets.tolist(),
        costs=costs.tolist(),
    )


@dataclass
class Evaluator:
    """Deterministic evaluation of a live policy on a task, as metrics (``{prefix}return``, ``cost``, ...),
    with the normalised score where the reference returns ``refs`` are known: what the stages log while
    they train. ``cost_budget`` defaults to the task's."""

    act: ActFn
    spec: TaskSpec
    episodes: int
    refs: tuple[float, float] | None = None
    cost_budget: float | None = None
    prefix: str = "eval/"
    seed: int = EVAL_SEED

    def __call__(self) -> dict[str, float]:
        res = evaluate(self.act, self.spec, self.episodes, self.seed, self.cost_budget, self.refs)
        return res.metrics(self.prefix)
