"""Rounds of whole episodes: the counters a checkpoint carries, one round's episodes and updates, and
the multiplier's update when a round ends (shared by the synchronous and asynchronous loops)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from arl_models.algos.calql import CalQL
from arl_models.online.config import FinetuneConfig
from arl_models.online.writer import OnlineWriter
from arl_models.replay import ActionScaler

Update = Callable[[], dict[str, float] | None]
"""One learner update: its metrics, or None when it cannot be done yet."""


@dataclass
class OnlineState:
    """Counters that a checkpoint carries besides the algorithm and the replay."""

    env_steps: int = 0
    episodes: int = 0
    rounds: int = 0
    updates: int = 0
    cumulative_cost: float = 0.0
    violations: int = 0
    returns: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def tensor(self) -> torch.Tensor:
        counts = [
            self.env_steps,
            self.episodes,
            self.rounds,
            self.updates,
            self.cumulative_cost,
            self.violations,
        ]
        return torch.tensor(counts, dtype=torch.float64)

    def load(self, t: torch.Tensor) -> None:
        v = t.tolist()
        self.env_steps, self.episodes, self.rounds, self.updates = (int(x) for x in v[:4])
        self.cumulative_cost, self.violations = float(v[4]), int(v[5])


class Round:
    """One round: whole episodes from every worker, with interleaved gradient updates."""

    def __init__(self, algo: CalQL, cfg: FinetuneConfig, scaler: ActionScaler, writer: OnlineWriter):
        self.algo, self.cfg, self.scaler, self.writer = algo, cfg, scaler, writer
        self.metrics: dict[str, float] = {}
        self.n_updates = 0
        self.episodes: list[tuple[float, float, int]] = []

    def run(self, envs: gym.vector.VectorEnv, seed: int, update: Update) -> None:
        """Step ``envs`` until the round's episodes are in, writing each step and doing ``utd`` updates
        per step."""
        n = envs.num_envs
        target = self.cfg.episodes_per_round or n
        obs, _ = envs.reset(seed=[seed + i for i in range(n)])  # type: ignore[arg-type]  # one seed per env: typed int only
        ret, cost, length = np.zeros(n), np.zeros(n), np.zeros(n, int)
        started, active, just_reset = min(n, target), np.arange(n) < target, np.zeros(n, bool)
        budget = 0.0
        while active.any():
            act = self.algo.act(obs, deterministic=False)  # (n, A) in [-1, 1]: one batched call
            next_obs, rew, term, trunc, info = envs.step(self.scaler.unnormalize(act))
            c = np.asarray(info.get("cost", np.zeros(n)), dtype=np.float64)
            valid = active & ~just_reset  # NEXT_STEP autoreset: this step only reset those workers
            done = valid & (term | trunc)
            live = np.flatnonzero(valid)
            if live.size:
                numbers = self.writer.add(
                    {
                        "obs": obs[live],
                        "act": act[live],
                        "rew": rew[live],
                        "cost": c[live],
                        "next_obs": next_obs[live],
                        "done": term[live].astype(np.float32),
                    }
                )
                for j, i in enumerate(live):
                    self.writer.extend(i, numbers[j : j + 1], rew[i : i + 1], done[i : i + 1])
            ret += np.where(valid, rew, 0.0)
            cost += np.where(valid, c, 0.0)
            length += valid
            for i in np.flatnonzero(done):
                self.episodes.append((float(ret[i]), float(cost[i]), int(length[i])))
                ret[i], cost[i], length[i] = 0.0, 0.0, 0
                if started < target:
                    started += 1
                else:
                    active[i] = False
            just_reset = done
            obs = next_obs
            budget += self.cfg.utd * int(valid.sum())
            while budget >= 1.0:
                budget -= 1.0
                m = update()
                if m is None:
                    budget = 0.0
                    break
                self.add(m)

    def add(self, m: dict[str, float]) -> None:
        """Count one update and sum its metrics into the round's."""
        self.n_updates += 1
        for k, v in m.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v

    def mean_metrics(self) -> dict[str, float]:
        return {k: v / max(self.n_updates, 1) for k, v in self.metrics.items()}


def after_round(
    algo: CalQL,
    state: OnlineState,
    rnd: Round,
    budget: float,
    out: Path,
) -> dict[str, float]:
    """Count the round's episodes and return the round's metrics (the multiplier is updated once the
    round's evaluation, if any, is in: :func:`steer`)."""
    rets = np.array([e[0] for e in rnd.episodes])
    costs = np.array([e[1] for e in rnd.episodes])
    with (out / "episodes.jsonl").open("a") as f:
        for r, c, length in rnd.episodes:
            state.episodes += 1
            state.env_steps += length
            state.cumulative_cost += c
            state.violations += int(c > budget)
            f.write(
                json.dumps(
                    {
                        "episode": state.episodes,
                        "env_steps": state.env_steps,
                        "return": r,
                        "cost": c,
                        "cumulative_cost": state.cumulative_cost,
                        "multiplier": algo.lagrangian.value,
                    }
                )
                + "\n"
            )
    state.rounds += 1
    state.updates += rnd.n_updates
    m = {f"online/{k}": v for k, v in rnd.mean_metrics().items()}
    return m | {
        "online/episode_return": float(rets.mean()),
        "online/episode_cost": float(costs.mean()),
        "online/cumulative_cost": state.cumulative_cost,
        "online/violating_episodes": float(state.violations),
        "online/episodes": float(state.episodes),
        "online/updates": float(state.updates),
        "online/online_buffer": float(len(rnd.writer.online)),
    }


def measured_cost(cfg: FinetuneConfig, metrics: dict[str, float]) -> float:
    """The episode cost the multiplier steers after a round (``cfg.cost_signal``): the deterministic
    evaluation's mean cost where ``metrics`` hold one and the signal is ``evaluation``, else the
    training episodes' mean cost."""
    if cfg.cost_signal == "evaluation" and "eval/cost" in metrics:
        return metrics["eval/cost"]
    return metrics["online/episode_cost"]


def steer(algo: CalQL, cfg: FinetuneConfig, metrics: dict[str, float], budget: float) -> None:
    """Update the multiplier from the round's measured cost (relative to the budget, so that one set of
    gains fits every task) and record its value in ``metrics``."""
    if cfg.constrained:
        algo.lagrangian.update(measured_cost(cfg, metrics) / budget, 1.0 - cfg.cost_margin)
    metrics["online/lagrange_multiplier"] = algo.lagrangian.value
