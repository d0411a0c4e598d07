"""Tasks: gymnasium environments with a safety cost, a cost budget and a semantic env_version."""

from arl_models.envs.registry import (
    DEFAULT_COST_BUDGET,
    Dynamics,
    TaskSpec,
    env_dims,
    get_task,
    make_env,
    register_task,
    task_names,
    task_versions,
)
from arl_models.envs.safety import (
    ActuatorEffortCost,
    AngularSpeedCost,
    CostFn,
    SafetyWrapper,
    StepCost,
    VelocityCost,
)

__all__ = [
    "DEFAULT_COST_BUDGET",
    "ActuatorEffortCost",
    "AngularSpeedCost",
    "CostFn",
    "Dynamics",
    "SafetyWrapper",
    "StepCost",
    "TaskSpec",
    "VelocityCost",
    "env_dims",
    "get_task",
    "make_env",
    "register_task",
    "task_names",
    "task_versions",
]
