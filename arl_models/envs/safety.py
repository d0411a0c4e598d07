"""Safety costs for gymnasium environments.

A :class:`SafetyWrapper` computes a per-step ``cost`` (and a ``collision_risk``-style risk signal in
[0, 1] where the task defines one) with a task's cost function and puts both into ``info``. Optionally
it subtracts a penalty from the reward whenever the risk exceeds a threshold (threshold 0.8 and
penalty 10 by default, as in the seed's wrapper); constrained algorithms leave this off and learn
from the cost channel instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np


class StepCost(NamedTuple):
    cost: float
    """Constraint cost of the step (1.0 for a violation in the velocity tasks)."""
    risk: float | None = None
    """Risk signal in [0, 1]; ``None`` where the task defines none."""


CostFn = Callable[[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]], StepCost]
"""``cost_fn(obs, action, next_obs, info) -> StepCost`` for one (unbatched) step; the cost is >= 0
(a penalty: the cost critics floor their values at 0)."""


@dataclass(frozen=True)
class VelocityCost:
    """Safety-Gymnasium's velocity constraint: cost 1 when the forward velocity exceeds ``threshold``.

    The risk signal is the velocity as a fraction of the threshold, clipped to [0, 1]
    (Ray et al. 2019; Ji et al. 2023, Safety-Gymnasium velocity tasks).
    """

    threshold: float
    obs_index: int
    """Where the forward velocity sits in the observation (used by importers that have no info)."""
    info_key: str = "x_velocity"

    def __call__(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: dict) -> StepCost:
        v = float(info[self.info_key])
        return StepCost(
            cost=float(v > self.threshold), risk=float(np.clip(abs(v) / self.threshold, 0.0, 1.0))
        )

    def batch_cost(self, action: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        """Costs of many steps at once, from their actions ``(N, A)`` and next observations ``(N, O)``."""
        return (next_obs[:, self.obs_index] > self.threshold).astype(np.float32)


@dataclass(frozen=True)
class AngularSpeedCost:
    """Cost 1 when a pendulum's angular speed (``obs[2]``) exceeds ``threshold`` (rad/s).

    Not ``safe-pendulum``'s cost: a swing-up cannot avoid speed, so this limit barely separates a
    careful policy from a greedy one (see the registry).
    """

    threshold: float
    max_speed: float = 8.0

    def __call__(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: dict) -> StepCost:
        speed = abs(float(next_obs[2]))
        return StepCost(cost=float(speed > self.threshold), risk=float(min(speed / self.threshold, 1.0)))

    def batch_cost(self, action: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        return (np.abs(next_obs[:, 2]) > self.threshold).astype(np.float32)


@dataclass(frozen=True)
class ActuatorEffortCost:
    """Cost for commanded effort past ``threshold`` (in the environment's action units) in any actuator:
    a motor driven past its continuous rating, which it stands only in short bursts.

    With ``ramp`` unset the cost is 1 whenever the largest effort exceeds the threshold. With ``ramp``
    set it is the overload ``(effort - threshold) / ramp``, clipped to [0, 1]: zero up to the rating,
    1 at ``threshold + ramp`` and beyond. The graded form gives a learned cost critic a slope wherever a
    policy overloads, where the step gives it none past the threshold.
    The risk signal is the largest effort as a fraction of the threshold, clipped to [0, 1].
    """

    threshold: float
    ramp: float | None = None

    def __call__(self, obs: np.ndarray, action: np.ndarray, next_obs: np.ndarray, info: dict) -> StepCost:
        effort = float(np.max(np.abs(action)))
        cost = float(self.batch_cost(np.reshape(action, (1, -1)), np.reshape(next_obs, (1, -1)))[0])
        return StepCost(cost=cost, risk=float(min(effort / self.threshold, 1.0)))

    def batch_cost(self, action: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        effort = np.abs(action).max(axis=1)
        if self.ramp is None:
            return (effort > self.threshold).astype(np.float32)
        return np.clip((effort - self.threshold) / self.ramp, 0.0, 1.0).astype(np.float32)


class SafetyWrapper(gym.Wrapper):
    """Adds ``info["cost"]`` (and ``info["collision_risk"]``) from a cost function.

    With ``risk_penalty`` set, the reward is reduced by that amount on steps whose risk exceeds
    ``risk_threshold``; ``info["risk_penalized"]`` says when that happened.
    """

    def __init__(
        self,
        env: gym.Env,
        cost_fn: CostFn,
        risk_threshold: float = 0.8,
        risk_penalty: float | None = None,
    ):
        super().__init__(env)
        self.cost_fn = cost_fn
        self.risk_threshold = risk_threshold
        self.risk_penalty = risk_penalty
        self._last_obs: np.ndarray | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._last_obs = obs
        info["cost"] = 0.0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        sc = self.cost_fn(self._last_obs, np.asarray(action), obs, info)
        self._last_obs = obs
        info["cost"] = sc.cost
        penalized = False
        if sc.risk is not None:
            info["collision_risk"] = sc.risk
            if self.risk_penalty is not None and sc.risk > self.risk_threshold:
                reward = float(reward) - self.risk_penalty
                penalized = True
        info["risk_penalized"] = penalized
        return obs, reward, terminated, truncated, info
