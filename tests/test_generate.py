"""The behaviour run's cost penalty: it steers the behaviour, never the rows it records."""

import json

import numpy as np
import pytest

from arl_models.data.behaviour import behaviour_config, default_behaviour_dir
from arl_models.data.dataset import read_dataset
from arl_models.data.generate import generate_dataset
from arl_models.envs.registry import get_task


def _pendulum_reward(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Gymnasium Pendulum-v1's reward from the observation before the step and the torque."""
    theta = np.arctan2(obs[:, 1], obs[:, 0])
    torque = np.clip(action[:, 0], -2.0, 2.0)
    return -(theta**2 + 0.1 * obs[:, 2] ** 2 + 0.001 * torque**2)


def test_a_penalised_behaviour_records_the_task_reward_and_its_own_objective(tmp_path):
    bdir = tmp_path / "behaviour"
    info = generate_dataset(
        "safe-pendulum",
        "medium-replay",
        tmp_path / "data",
        seed=0,
        behaviour_steps=2_000,
        behaviour_dir=bdir,
        cost_penalty=2.0,
        progress=False,
    )
    assert info.extra["behaviour_cost_penalty"] == 2.0
    refs = json.loads((bdir / "behaviour.json").read_text())
    assert refs["cost_penalty"] == 2.0
    for point in refs["curve"]:
        assert point["objective"] == pytest.approx(point["return"] - 2.0 * point["cost"])

    rows, _ = read_dataset(tmp_path / "data")
    assert (rows.cost > 0).mean() > 0.05  # the rows a penalised reward would differ on are there
    np.testing.assert_allclose(rows.reward, _pendulum_reward(rows.obs, rows.action), rtol=1e-4, atol=1e-4)

    with pytest.raises(ValueError, match="cost penalty 2"):
        generate_dataset(
            "safe-pendulum",
            "medium",
            tmp_path / "other",
            behaviour_steps=2_000,
            behaviour_dir=bdir,
            progress=False,
        )
    assert not (tmp_path / "other").exists()


def test_the_penalty_enters_the_cache_key_and_must_not_be_negative():
    spec = get_task("safe-hopper")
    plain = default_behaviour_dir(spec, behaviour_config("safe-hopper"))
    penalised = default_behaviour_dir(spec, behaviour_config("safe-hopper", cost_penalty=4))
    assert "penalty" not in plain.name and "penalty4" in penalised.name
    assert plain.name.rsplit("-", 1)[1] != penalised.name.rsplit("-", 1)[1]
    with pytest.raises(ValueError, match="cost_penalty must be >= 0"):
        behaviour_config("safe-hopper", cost_penalty=-1)
