"""The task registry: a task is a gymnasium environment, a cost function, a budget and a version.

Tasks are named ``safe-hopper`` or, for a specific dynamics variant, ``safe-hopper@1.1.0``. The
``env_version`` is semantic: a variant with changed dynamics (mass, friction, actuator strength)
bumps the minor version; the base task is ``1.0.0``. The ``2.x`` line changes the observation (a
breaking change, hence the major version): the agent also sees the plant's configuration, the
offsets of its dynamics multipliers from nominal, so that versions which need opposite behaviour can
be served by one policy. Any gymnasium id can be used as a task with a user-supplied cost function
through :func:`register_task`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from arl_models.envs.safety import ActuatorEffortCost, CostFn, SafetyWrapper, VelocityCost

DEFAULT_COST_BUDGET = 25.0


@dataclass(frozen=True)
class Dynamics:
    """Multipliers applied to the simulator after construction (1.0 leaves it unchanged; a negative
    ``actuator`` reverses the actuators, as a motor wired the wrong way round does)."""

    mass: float = 1.0
    friction: float = 1.0
    actuator: float = 1.0

    def is_default(self) -> bool:
        return self == Dynamics()

    def offsets(self) -> np.ndarray:
        """``(mass, friction, actuator) - 1``: what an agent of a ``2.x`` task sees, 0 at nominal."""
        return np.array([self.mass - 1.0, self.friction - 1.0, self.actuator - 1.0], dtype=np.float32)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    env_id: str
    cost_fn: CostFn
    env_version: str = "1.0.0"
    cost_budget: float = DEFAULT_COST_BUDGET
    """Budget on the undiscounted cost of one episode."""
    dynamics: Dynamics = Dynamics()
    observe_dynamics: bool = False
    """Append :meth:`Dynamics.offsets` to every observation (the ``2.x`` versions)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}@{self.env_version}"

    @property
    def context_dim(self) -> int:
        """Entries at the end of each observation that describe the plant (0 unless it is observed)."""
        return len(self.dynamics.offsets()) if self.observe_dynamics else 0


def context_dim_of(task: str, env_version: str | None = None) -> int:
    """:attr:`TaskSpec.context_dim` of a registered task; 0 for one this registry does not know."""
    try:
        return get_task(task, env_version).context_dim
    except KeyError:
        return 0


_REGISTRY: dict[str, dict[str, TaskSpec]] = {}


def register_task(spec: TaskSpec, *, overwrite: bool = False) -> TaskSpec:
    versions = _REGISTRY.setdefault(spec.name, {})
    if spec.env_version in versions and not overwrite:
        raise ValueError(f"task {spec.key} is already registered")
    versions[spec.env_version] = spec
    return spec


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def task_versions(name: str) -> list[str]:
    return sorted(_REGISTRY[name], key=lambda v: tuple(int(p) for p in v.split(".")))


def get_task(task: str, env_version: str | None = None) -> TaskSpec:
    """Look up ``name`` or ``name@version``; without a version, the base version ``1.0.0``."""
    name, _, at_version = task.partition("@")
    version = env_version or at_version or "1.0.0"
    if name not in _REGISTRY:
        raise KeyError(f"unknown task {name!r}; registered: {', '.join(task_names())}")
    if version not in _REGISTRY[name]:
        raise KeyError(f"task {name!r} has no env_version {version!r}; known: {task_versions(name)}")
    return _REGISTRY[name][version]


def _apply_dynamics(env: gym.Env, d: Dynamics) -> gym.Env:
    base: Any = env.unwrapped  # MuJoCo and classic-control environments expose different attributes
    if d.is_default():
        return env
    model = getattr(base, "model", None)
    if model is not None:  # MuJoCo: a negative gear reverses the actuator
        model.body_mass[:] = model.body_mass * d.mass
        model.geom_friction[:, 0] = model.geom_friction[:, 0] * d.friction
        model.actuator_gear[:, 0] = model.actuator_gear[:, 0] * d.actuator
    elif hasattr(base, "max_torque"):  # classic-control Pendulum: strength is the torque limit
        if d.friction != 1.0:
            raise ValueError("Pendulum has no friction to scale")
        base.m = base.m * d.mass
        base.max_torque = base.max_torque * abs(d.actuator)
        if d.actuator < 0:  # the pendulum receives minus the command
            env = gym.wrappers.TransformAction(env, np.negative, env.action_space)
    else:
        raise ValueError(f"cannot change the dynamics of {env.spec.id if env.spec else base}")
    return env


def _observe_dynamics(env: gym.Env, d: Dynamics) -> gym.Env:
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise TypeError("observing the dynamics needs a flat Box observation")
    extra = d.offsets()
    low = np.concatenate([space.low, np.full(extra.shape, -np.inf, np.float32)]).astype(np.float32)
    high = np.concatenate([space.high, np.full(extra.shape, np.inf, np.float32)]).astype(np.float32)
    box = gym.spaces.Box(low, high, dtype=np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda o: np.concatenate([o, extra]).astype(np.float32), box
    )


def make_env(
    task: str | TaskSpec,
    *,
    risk_penalty: float | None = None,
    risk_threshold: float = 0.8,
    **gym_kwargs: Any,
) -> gym.Env:
    """Create the task's environment with its dynamics and a :class:`SafetyWrapper`."""
    spec = get_task(task) if isinstance(task, str) else task
    env = _apply_dynamics(gym.make(spec.env_id, **{**spec.env_kwargs, **gym_kwargs}), spec.dynamics)
    if spec.observe_dynamics:
        env = _observe_dynamics(env, spec.dynamics)
    return SafetyWrapper(env, spec.cost_fn, risk_threshold=risk_threshold, risk_penalty=risk_penalty)


def env_dims(task: str | TaskSpec) -> tuple[int, int, np.ndarray, np.ndarray, int]:
    """``(obs_dim, action_dim, action_low, action_high, max_episode_steps)`` of a task."""
    env = make_env(task)
    try:
        if not isinstance(env.action_space, gym.spaces.Box) or env.observation_space.shape is None:
            raise TypeError(
                f"{env.spec.id if env.spec else env}: continuous (Box) actions and observations needed"
            )
        low = np.asarray(env.action_space.low, dtype=np.float32)
        high = np.asarray(env.action_space.high, dtype=np.float32)
        horizon = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 1000
        return env.observation_space.shape[0], env.action_space.shape[0], low, high, horizon
    finally:
        env.close()


def _register_builtin() -> None:
    # Velocity thresholds are Safety-Gymnasium's (SafetyHopperVelocity, SafetyHalfCheetahVelocity,
    # SafetyWalker2dVelocity); the index is the x velocity's in the observation (qpos[1:], then qvel).
    builtin: list[tuple[str, str, CostFn, str]] = [
        (
            "safe-pendulum",
            "Pendulum-v1",
            ActuatorEffortCost(threshold=1.0, ramp=1.0),
            "Pendulum swing-up; cost: torque past 1 N m, in N m (0 to 1 a step)",
        ),
        (
            "safe-hopper",
            "Hopper-v5",
            VelocityCost(threshold=0.7402, obs_index=5),
            "Hopper; cost when forward velocity > 0.7402 m/s",
        ),
        (
            "safe-halfcheetah",
            "HalfCheetah-v5",
            VelocityCost(threshold=3.2096, obs_index=8),
            "HalfCheetah; cost when forward velocity > 3.2096 m/s",
        ),
        (
            "safe-walker2d",
            "Walker2d-v5",
            VelocityCost(threshold=2.3415, obs_index=8),
            "Walker2d; cost when forward velocity > 2.3415 m/s",
        ),
    ]
    # Dynamics variants for continual learning: each changes what the best policy does.
    variants = {
        "1.1.0": Dynamics(mass=1.5),
        "1.2.0": Dynamics(actuator=0.6),
    }
    mujoco_extra = {"1.3.0": Dynamics(friction=0.4)}
    # The observed line: 1.x's variants move the best policy too little to be forgotten (naive
    # sequential training gains on the old versions: benchmarks/README.md, "Continual learning"),
    # and a version that needs the opposite action cannot share a policy that does not know which
    # plant it drives. So 2.x shows the agent the plant's configuration, and 2.1.0 reverses it.
    observed = {
        "2.0.0": Dynamics(),
        "2.1.0": Dynamics(actuator=-1.0),
        "2.2.0": Dynamics(mass=1.5),
    }
    # Pendulum's episodes are 200 steps and its cost is effort, not speed (every swing-up passes about
    # 4.7 rad/s, whatever the policy; within a torque limit it can pump up more slowly): the overload past
    # 1 N m, graded (1 a step at the full 2 N m) so that the cost critic has a slope past the limit. Its
    # budget of 10 is below what the unconstrained expert pays; the velocity tasks keep Safety-Gymnasium's
    # 25.
    budgets = {"safe-pendulum": 10.0}
    for name, env_id, cost_fn, desc in builtin:
        budget = budgets.get(name, DEFAULT_COST_BUDGET)
        register_task(TaskSpec(name, env_id, cost_fn, cost_budget=budget, description=desc))
        extra = mujoco_extra if env_id != "Pendulum-v1" else {}
        for version, dyn in {**variants, **extra}.items():
            register_task(TaskSpec(name, env_id, cost_fn, version, budget, dyn, description=f"{desc}; {dyn}"))
        for version, dyn in observed.items():
            register_task(
                TaskSpec(
                    name,
                    env_id,
                    cost_fn,
                    version,
                    budget,
                    dyn,
                    observe_dynamics=True,
                    description=f"{desc}; {dyn}, observed as the last 3 observation entries",
                )
            )


_register_builtin()
