import gymnasium as gym
import numpy as np
import pytest

from arl_models.envs import (
    DEFAULT_COST_BUDGET,
    ActuatorEffortCost,
    SafetyWrapper,
    StepCost,
    TaskSpec,
    get_task,
    make_env,
    register_task,
    task_names,
    task_versions,
)


def test_builtin_tasks_and_budgets():
    assert {"safe-pendulum", "safe-hopper", "safe-halfcheetah"} <= set(task_names())
    assert get_task("safe-hopper").cost_budget == DEFAULT_COST_BUDGET == 25.0
    assert get_task("safe-halfcheetah").cost_budget == 25.0


@pytest.mark.parametrize("name", ["safe-pendulum", "safe-hopper", "safe-halfcheetah"])
def test_every_builtin_task_has_at_least_two_dynamics_variants(name):
    versions = task_versions(name)
    assert versions[0] == "1.0.0" and len(versions) >= 3
    base = get_task(name)
    for v in versions[1:]:
        spec = get_task(name, v)
        assert not spec.dynamics.is_default() or spec.observe_dynamics  # 2.0.0: nominal, observed
        assert get_task(f"{name}@{v}").env_version == v != base.env_version
    assert [v for v in versions if get_task(name, v).observe_dynamics] == ["2.0.0", "2.1.0", "2.2.0"]


def test_unknown_task_and_version_are_named():
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(KeyError, match="has no env_version '9.9.9'"):
        get_task("safe-hopper@9.9.9")


def _speed_trace(task, actions):
    env = make_env(task)
    obs, info = env.reset(seed=0)
    assert info["cost"] == 0.0
    out = []
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        out.append((info["x_velocity"], info["cost"], info["collision_risk"]))
        if term or trunc:
            break
    return np.array(out)


def test_velocity_cost_is_one_exactly_above_threshold():
    thr = get_task("safe-halfcheetah").cost_fn.threshold
    env = make_env("safe-halfcheetah")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(200):
        *_, info = env.step(rng.uniform(-1, 1, 6))
        seen.append((info["x_velocity"], info["cost"], info["collision_risk"]))
    v, c, risk = np.array(seen).T
    np.testing.assert_array_equal(c, (v > thr).astype(float))
    assert np.all((risk >= 0) & (risk <= 1))


def test_velocity_cost_from_observation_agrees_with_info():
    """Importers compute costs from next_obs (MuJoCo's instantaneous qvel), the wrapper from the
    finite-difference velocity in info: the two must agree on (almost) every step."""
    for name in ("safe-hopper", "safe-halfcheetah"):
        spec = get_task(name)
        env = make_env(spec)
        obs, _ = env.reset(seed=1)
        from_obs, from_info = [], []
        for _ in range(300):
            action = env.action_space.sample()
            obs, _, term, trunc, info = env.step(action)
            from_obs.append(spec.cost_fn.batch_cost(action[None], obs[None])[0])
            from_info.append(info["cost"])
            if term or trunc:
                obs, _ = env.reset()
        assert np.mean(np.array(from_obs) == np.array(from_info)) >= 0.97


def test_risk_penalty_is_optional_and_configurable():
    env = gym.make("Pendulum-v1")
    plain = SafetyWrapper(env, lambda o, a, n, i: StepCost(0.0, 0.9))
    penal = SafetyWrapper(
        gym.make("Pendulum-v1"), lambda o, a, n, i: StepCost(0.0, 0.9), risk_threshold=0.8, risk_penalty=10.0
    )
    plain.reset(seed=0)
    penal.reset(seed=0)
    _, r0, *_, i0 = plain.step(np.zeros(1))
    _, r1, *_, i1 = penal.step(np.zeros(1))
    assert r1 == pytest.approx(r0 - 10.0) and i1["risk_penalized"] and not i0["risk_penalized"]


def test_any_gym_env_with_a_user_cost_function():
    spec = register_task(
        TaskSpec(
            "test-mountaincar",
            "MountainCarContinuous-v0",
            lambda o, a, n, i: StepCost(float(abs(a[0]) > 0.5)),
        ),
        overwrite=True,
    )
    env = make_env(spec.name)
    env.reset(seed=0)
    *_, info = env.step(np.array([0.9], np.float32))
    assert info["cost"] == 1.0 and "collision_risk" not in info


def test_dynamics_variants_change_the_simulator():
    base = make_env("safe-hopper").unwrapped.model
    heavy = make_env("safe-hopper@1.1.0").unwrapped.model
    weak = make_env("safe-hopper@1.2.0").unwrapped.model
    slippery = make_env("safe-hopper@1.3.0").unwrapped.model
    np.testing.assert_allclose(heavy.body_mass, base.body_mass * 1.5)
    np.testing.assert_allclose(weak.actuator_gear[:, 0], base.actuator_gear[:, 0] * 0.6)
    np.testing.assert_allclose(slippery.geom_friction[:, 0], base.geom_friction[:, 0] * 0.4)
    pend = make_env("safe-pendulum@1.2.0").unwrapped
    assert pend.max_torque == pytest.approx(2.0 * 0.6)


def test_observed_versions_append_the_dynamics_offsets_and_2_1_0_reverses_the_actuator():
    """Same state, same command: the reversed pendulum accelerates the other way; each 2.x version's
    observation ends with its (mass, friction, actuator) offsets, and the cost sees the command."""
    moves = {}
    for v, offsets in {"2.0.0": [0, 0, 0], "2.1.0": [0, 0, -2], "2.2.0": [0.5, 0, 0]}.items():
        env = make_env(f"safe-pendulum@{v}")
        assert env.observation_space.shape == (6,)
        obs, _ = env.reset(seed=3)
        nxt, *_, info = env.step(np.array([1.5], np.float32))
        np.testing.assert_array_equal(obs[3:], offsets)
        np.testing.assert_array_equal(nxt[3:], offsets)
        np.testing.assert_array_equal(obs[:3], make_env("safe-pendulum").reset(seed=3)[0])
        assert info["cost"] == pytest.approx(0.5)
        moves[v] = nxt[2] - obs[2]
    free = moves["2.0.0"] - 1.5 * 3 / 1.0 * 0.05  # the same step without the torque's contribution
    assert moves["2.1.0"] - free == pytest.approx(-(moves["2.0.0"] - free), abs=1e-5)
    assert moves["2.2.0"] - free == pytest.approx((moves["2.0.0"] - free) / 1.5, abs=1e-5)
    hopper = make_env("safe-hopper@2.1.0")
    np.testing.assert_allclose(
        hopper.unwrapped.model.actuator_gear[:, 0],
        -make_env("safe-hopper").unwrapped.model.actuator_gear[:, 0],
    )
    assert hopper.observation_space.shape == (14,)


def test_pendulum_effort_cost_is_the_overload_past_the_torque_limit_and_batch_cost_agrees():
    spec = get_task("safe-pendulum")
    thr, ramp = spec.cost_fn.threshold, spec.cost_fn.ramp
    env = make_env(spec)
    env.reset(seed=0)
    actions = np.linspace(-2.0, 2.0, 41, dtype=np.float32)[:, None]  # includes exactly +-thr
    seen = []
    for a in actions:
        obs, *_, info = env.step(a)
        seen.append((info["cost"], info["collision_risk"], obs))
    cost, risk = np.array([s[0] for s in seen]), np.array([s[1] for s in seen])
    overload = np.clip((np.abs(actions[:, 0]) - thr) / ramp, 0.0, 1.0)
    np.testing.assert_allclose(cost, overload, atol=1e-6)  # zero up to the rating, 1 at full torque
    assert cost[np.abs(actions[:, 0]) <= thr].max() == 0.0 and cost.max() == 1.0
    assert np.all((risk >= 0) & (risk <= 1)) and risk[np.abs(actions[:, 0]) > thr].min() == 1.0
    next_obs = np.stack([s[2] for s in seen])
    np.testing.assert_allclose(spec.cost_fn.batch_cost(actions, next_obs), cost, atol=1e-6)


def test_effort_cost_without_a_ramp_is_a_step():
    step = ActuatorEffortCost(threshold=1.0)
    actions = np.array([[0.5], [1.0], [1.01], [-1.5], [2.0]], np.float32)
    np.testing.assert_array_equal(step.batch_cost(actions, np.zeros((5, 3))), [0, 0, 1, 1, 1])
    assert step(np.zeros(3), np.array([1.5]), np.zeros(3), {}).cost == 1.0
