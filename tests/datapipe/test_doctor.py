"""``arl doctor``: the whole report on safe-pendulum, and the interface checks catching what is broken."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from arl_cli import doctor, doctor_interfaces, doctor_subsystems
from arl_cli.main import app
from arl_models.rate_tuner import BOTTLENECKS

SUBSYSTEMS = {
    "env_step",
    "inference_single",
    "inference_batched",
    "replay_uniform",
    "replay_prioritized",
    "learner_cql",
    "learner_online",
}
INTERFACES = {"rollout_format", "latency"}


@pytest.fixture(scope="module")
def report():
    res = CliRunner().invoke(
        app, ["doctor", "--task", "safe-pendulum", "--seconds", "1", "--json", "--replay-size", "20000"]
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_report_has_every_subsystem_with_status_and_finite_rates(report):
    checks = {c["name"]: c for c in report["checks"]}
    assert SUBSYSTEMS | INTERFACES | {"async_stress"} <= checks.keys()
    for c in checks.values():
        assert c["status"] in {"pass", "warn", "fail", "skip"} and c["message"], c
    for name in SUBSYSTEMS - {"replay_prioritized"}:
        assert checks[name]["status"] == "pass", checks[name]
        assert math.isfinite(checks[name]["rate"]) and checks[name]["rate"] > 0
    per = checks["replay_prioritized"]
    assert per["status"] == "pass" or (per["status"] == "skip" and "not present" in per["message"])
    assert checks["rollout_format"]["status"] == "pass"
    lat = checks["latency"]["details"]
    assert all(
        math.isfinite(lat[k]) for k in ("episode_wait_ms", "replay_add_ms", "first_sample_ms", "total_ms")
    )
    assert report["ok"] is True and len(report["load_average"]) == 3


def test_report_names_a_bottleneck_with_its_metrics(report):
    v = report["verdict"]
    assert v["bottleneck"] in BOTTLENECKS and v["reason"]
    assert all(k.startswith("pipeline/") for k in v["metrics"])
    parts = {r["part"]: r for r in report["where_time_goes"]}
    assert {"env step", "inference", "learner update"} <= parts.keys()
    assert all(
        r["ms_per_transition"] is None or math.isfinite(r["ms_per_transition"]) for r in parts.values()
    )


def _rollout(steps: int = 5, obs_dim: int = 3, act_dim: int = 1, **override) -> SimpleNamespace:
    rng = np.random.default_rng(0)
    base = dict(
        obs=rng.normal(size=(steps, obs_dim)).astype(np.float32),
        act=rng.uniform(-1, 1, (steps, act_dim)).astype(np.float32),
        rew=rng.normal(size=steps).astype(np.float32),
        cost=np.zeros(steps, np.float32),
        next_obs=rng.normal(size=(steps, obs_dim)).astype(np.float32),
        terminated=np.zeros(steps, bool),
        truncated=np.r_[np.zeros(steps - 1, bool), True],
        steps=steps,
        env_version="1.0.0",
        policy_hash="ab" * 32,
        random_seed=7,
        timestamp="2026-12-01T10:00:00.000000Z",
        step_time_s=0.001,
        inference_time_s=0.002,
    )
    return SimpleNamespace(**{**base, **override})


@pytest.fixture(scope="module")
def replay():
    return doctor_subsystems.random_replay(obs_dim=3, act_dim=1, size=64)


def test_a_matching_rollout_passes(replay):
    c = doctor_interfaces.check_format(_rollout(), replay, "1.0.0")
    assert c.status == "pass", c.message


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        (
            {"obs": np.zeros((5, 4), np.float32)},
            "field 'obs' has shape (5, 4); the replay's 'obs' expects (5, 3)",
        ),
        ({"next_obs": np.zeros((4, 3), np.float32)}, "field 'next_obs' has shape (4, 3)"),
        ({"rew": np.zeros(5, np.int64)}, "field 'rew' has dtype int64"),
        ({"terminated": None}, "field 'terminated' is missing"),
        ({"cost": np.full(5, np.nan, np.float32)}, "field 'cost' has non-finite values"),
        ({"act": np.full((5, 1), 2.0, np.float32)}, "field 'act' leaves [-1, 1]"),
        ({"env_version": "1.0"}, "field 'env_version' is '1.0'"),
        ({"env_version": "1.1.0"}, "the task is '1.0.0'"),
        ({"policy_hash": "XYZ"}, "field 'policy_hash'"),
        ({"random_seed": -1}, "field 'random_seed'"),
        ({"timestamp": "yesterday"}, "field 'timestamp'"),
    ],
)
def test_a_broken_interface_fails_naming_the_field(replay, override, needle):
    c = doctor_interfaces.check_format(_rollout(**override), replay, "1.0.0")
    assert c.status == "fail" and needle in c.message, c.message


def test_latency_parts_follow_the_rates():
    slow = doctor_interfaces.check_latency(
        _rollout(steps=201), replay_size=10_000, batch=100, updates_per_s=10.0, transfer_s=None
    )
    assert slow.status == "warn" and math.isclose(slow.details["first_sample_ms"], 10_000.0)  # N / (B * U)
    assert math.isclose(slow.details["episode_wait_ms"], 1000 * 0.003 / 201 * 100)
    fast = doctor_interfaces.check_latency(
        _rollout(steps=201), replay_size=1_000, batch=100, updates_per_s=1000.0, transfer_s=0.002
    )
    assert fast.status == "pass" and math.isclose(fast.details["transfer_ms"], 2.0)


def _checks(**rates: float) -> dict[str, doctor_subsystems.Check]:
    return {k: doctor_subsystems.Check(k, "subsystem", "pass", "", v) for k, v in rates.items()}


@pytest.mark.parametrize(
    ("rates", "step_target", "bottleneck"),
    [
        (
            dict(env_step=1e6, inference_single=100.0, learner_online=1000.0),
            1.2,
            "inference",
        ),  # one call per step
        (dict(env_step=100.0, inference_single=1e6, learner_online=1000.0), 1.0, "env"),
        (dict(env_step=1e5, inference_single=1e5, learner_online=10.0), 1.2, "learner"),
        (dict(env_step=1500.0, inference_single=1e9, learner_online=1000.0), 1.0, "balanced"),
    ],
)
def test_verdict_from_isolated_rates(rates, step_target, bottleneck):
    from arl_models.rate_tuner import RateTargets, RateTuner

    reading = doctor.compose_reading(_checks(**rates), workers=1, utd=1.0, envs_per_worker=1)
    assert (
        RateTuner(RateTargets(settle_intervals=0, step_inference=step_target)).observe(reading).bottleneck
        == bottleneck
    )


def test_a_crashing_check_is_reported_not_raised():
    def broken():
        raise RuntimeError("simulator exploded")

    c = doctor_subsystems.guard("env_step", "subsystem", broken)
    assert c.status == "fail" and "simulator exploded" in c.message


def test_unknown_task_is_a_clear_error():
    res = CliRunner().invoke(app, ["doctor", "--task", "no-such-task", "--seconds", "0.1"])
    assert res.exit_code == 2 and "unknown task" in res.output


def test_preprocess_check_times_the_transform_and_joins_the_learner_side():
    replay = doctor_subsystems.random_replay(3, 1, 2_000)
    c = doctor_subsystems.check_preprocess("noise", replay, 0.2, 64)
    assert c.status == "pass" and c.rate > 0 and "noise" in c.message
    checks = {c.name: c}
    rows = {r["part"]: r for r in doctor.where_time_goes(checks, 1.0, 1, None)}
    assert rows["preprocess"]["side"] == "learner"
    assert rows["preprocess"]["ms_per_transition"] == pytest.approx(1000 / c.rate)
