"""The rate tuner on synthetic readings and on a small simulated plant: direction, limits, damping, labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arl_models.rate_tuner import BOTTLENECKS, RateDecision, RateReading, RateTargets, RateTuner


def plant(
    workers: int,
    utd: float,
    *,
    per_worker: float = 100.0,
    learner: float = 600.0,
    envs_per_worker: int = 1,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
) -> RateReading:
    """A throttled learner: it does ``utd`` updates per fresh transition, at most ``learner`` updates/s."""
    jitter = 1.0 + (noise * rng.standard_normal() if rng is not None else 0.0)
    produced = workers * per_worker * jitter
    updates = min(learner, utd * produced)
    return RateReading(
        interval_s=1.0,
        env_steps_per_s=produced,
        inference_calls_per_s=produced / envs_per_worker,
        produced_per_s=produced,
        consumed_per_s=updates / utd,
        learner_utilization=updates / learner,
        num_workers=workers,
        utd=utd,
        envs_per_worker=envs_per_worker,
    )


def reading(
    ratio: float = 1.5, util: float = 1.0, workers: int = 4, utd: float = 1.0, steps_per_call: float = 2.0
) -> RateReading:
    consumed = 400.0
    return RateReading(
        interval_s=1.0,
        env_steps_per_s=ratio * consumed,
        inference_calls_per_s=ratio * consumed / steps_per_call,
        produced_per_s=ratio * consumed,
        consumed_per_s=consumed,
        learner_utilization=util,
        num_workers=workers,
        utd=utd,
    )


def run_loop(
    tuner: RateTuner, workers: int, utd: float, n: int, **plant_kw
) -> list[tuple[RateReading, RateDecision]]:
    out = []
    for _ in range(n):
        r = plant(workers, utd, **plant_kw)
        d = tuner.observe(r)
        out.append((r, d))
        workers, utd = d.num_workers, d.utd
    return out


def test_starved_learner_adds_workers_up_to_max_then_stops():
    t = RateTargets(max_workers=5, max_utd=2.0)
    # the learner always waits
    hist = run_loop(RateTuner(t), workers=1, utd=1.0, n=60, learner=1e9, envs_per_worker=2)
    workers = [d.num_workers for _, d in hist]
    assert workers == sorted(workers) and max(workers) == 5  # only ever adds, up to the limit
    first_max = workers.index(5)
    utds = [d.utd for _, d in hist]
    assert utds[first_max] == 1.0  # utd moves only once workers are at max
    assert utds[-1] == 2.0 and utds == sorted(utds)
    assert not any(d.changed for _, d in hist[-10:])  # then it stops
    assert all(d.bottleneck == "env" for _, d in hist)
    changed = [d.changed for _, d in hist]
    # the first reading of a setting settles
    assert not any(a and b for a, b in zip(changed, changed[1:], strict=False))
    assert "workers and utd at their maxima" in hist[-1][1].reason


def test_saturated_learner_lowers_utd_then_drops_workers():
    t = RateTargets(min_utd=0.5, min_workers=2)
    hist = run_loop(RateTuner(t), workers=8, utd=4.0, n=60, learner=50.0)  # far behind the data
    utds = [d.utd for _, d in hist]
    assert utds == sorted(utds, reverse=True) and min(utds) == 0.5
    workers = [d.num_workers for _, d in hist]
    assert workers[utds.index(0.5)] == 8  # workers only drop once utd is at its minimum
    assert workers[-1] == 2 and not any(d.changed for _, d in hist[-5:])
    assert all(d.bottleneck == "learner" for _, d in hist)


def test_at_target_nothing_changes():
    tuner = RateTuner()
    for _ in range(20):
        d = tuner.observe(reading(ratio=1.5, util=1.0))
        assert (d.num_workers, d.utd, d.changed, d.bottleneck) == (4, 1.0, False, "balanced")
    assert tuner.changes == 0


@pytest.mark.parametrize("ratio", [1.3, 1.7])
def test_inside_the_deadband_nothing_changes(ratio):
    tuner = RateTuner()
    decisions = [tuner.observe(reading(ratio=ratio)) for _ in range(10)]
    assert not any(d.changed for d in decisions)


def test_noisy_readings_around_target_do_not_oscillate():
    rng = np.random.default_rng(0)
    noisy = [reading(ratio=1.5 * (1 + 0.06 * rng.standard_normal())) for _ in range(300)]
    damped = RateTuner()
    assert sum(damped.observe(r).changed for r in noisy) == 0
    # the same readings without smoothing, deadband or settling would keep flipping: the damping is
    # what holds it
    raw = RateTuner(RateTargets(deadband=0.0, ema=1.0, settle_intervals=0))
    assert sum(raw.observe(r).changed for r in noisy) > 50


def test_closed_loop_noisy_plant_settles_without_flapping():
    rng = np.random.default_rng(1)
    hist = run_loop(
        RateTuner(), workers=1, utd=1.0, n=120, per_worker=100.0, learner=1000.0, noise=0.05, rng=rng
    )
    late = hist[60:]
    assert len({(d.num_workers, d.utd) for _, d in late}) <= 2  # at most one correction late on


def test_decisions_respect_limits_under_wild_readings():
    t = RateTargets(min_workers=2, max_workers=6, min_utd=0.5, max_utd=3.0, settle_intervals=0)
    tuner = RateTuner(t)
    rng = np.random.default_rng(3)
    workers, utd = 4, 1.0
    for _ in range(500):
        r = reading(ratio=float(rng.lognormal(0, 1.5)), util=float(rng.uniform()), workers=workers, utd=utd)
        d = tuner.observe(r)
        assert t.min_workers <= d.num_workers <= t.max_workers and t.min_utd <= d.utd <= t.max_utd
        assert abs(d.num_workers - workers) <= 1  # one step at a time
        assert not (d.num_workers != workers and d.utd != utd)  # one knob at a time
        assert d.bottleneck in BOTTLENECKS
        workers, utd = d.num_workers, d.utd
    assert tuner.changes > 20


def test_bottleneck_labels():
    t = RateTargets(settle_intervals=0)
    assert RateTuner(t).observe(reading(ratio=1.0, util=0.3, steps_per_call=4.0)).bottleneck == "env"
    d = RateTuner(t).observe(reading(ratio=1.0, util=0.3, steps_per_call=1.0))
    assert d.bottleneck == "inference" and d.envs_per_worker == 2 and "batched inference" in d.reason
    d = RateTuner(t).observe(reading(ratio=3.0, util=1.0))
    assert d.bottleneck == "learner" and d.utd < 1.0 and "lowering utd" in d.reason
    d = RateTuner(t).observe(reading(ratio=1.5, util=0.95))
    assert d.bottleneck == "balanced" and "inside the band" in d.reason


def test_warm_up_holds():
    tuner = RateTuner(RateTargets(settle_intervals=0))
    r = RateReading(1.0, 500.0, 500.0, 500.0, 0.0, 0.0, num_workers=2, utd=1.0)
    d = tuner.observe(r)
    assert not d.changed and d.bottleneck == "learner" and "warm-up" in d.reason
    d = tuner.observe(RateReading(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, num_workers=2, utd=1.0))
    assert not d.changed and "no transitions produced" in d.reason


@pytest.mark.parametrize(
    ("workers", "utd", "kw"),
    [
        (
            1,
            1.0,
            dict(per_worker=100.0, learner=1000.0),
        ),  # starts data-starved: adds workers, then raises utd
        (8, 2.0, dict(per_worker=100.0, learner=200.0)),  # starts learner-bound: lowers utd
        (1, 0.25, dict(per_worker=50.0, learner=300.0)),  # few workers' worth: settles below max workers
    ],
)
def test_closed_loop_converges_to_the_target_ratio(workers, utd, kw):
    t = RateTargets()
    hist = run_loop(RateTuner(t), workers, utd, n=40, **kw)
    lo, hi = t.produce_consume * (1 - t.deadband), t.produce_consume * (1 + t.deadband)
    late = [r.produce_consume for r, _ in hist[-10:]]
    assert all(lo <= x <= hi for x in late), late
    assert not any(d.changed for _, d in hist[-10:])
    assert hist[-1][1].bottleneck == "balanced"


def test_from_counts_defines_consumed_as_updates_over_utd():
    r = RateReading.from_counts(
        interval_s=2.0,
        env_steps=1000,
        inference_calls=250,
        transitions=1000,
        updates=1500,
        update_time_s=1.5,
        num_workers=2,
        utd=0.5,
        envs_per_worker=4,
    )
    assert r.produced_per_s == 500.0 and r.consumed_per_s == 1500.0  # 750 updates/s / 0.5
    assert r.learner_utilization == 0.75 and r.step_inference == 4.0
    assert math.isclose(r.produce_consume, 1 / 3)
    with pytest.raises(ValueError):
        RateReading.from_counts(
            interval_s=0.0,
            env_steps=0,
            inference_calls=0,
            transitions=0,
            updates=0,
            update_time_s=0.0,
            num_workers=1,
            utd=1.0,
        )


def test_metrics_are_pipeline_keys_and_finite():
    tuner = RateTuner()
    r = reading(ratio=1.0, util=0.3, steps_per_call=1.0)
    m = tuner.metrics(r, tuner.observe(r))
    assert all(k.startswith("pipeline/") for k in m)
    for k in (
        "env_steps_per_s",
        "inference_calls_per_s",
        "produced_per_s",
        "consumed_per_s",
        "produce_consume_ratio",
        "step_inference_ratio",
        "learner_utilization",
        "num_workers",
        "utd",
        "bottleneck",
    ):
        assert math.isfinite(m[f"pipeline/{k}"]), k
    assert m["pipeline/bottleneck"] == BOTTLENECKS.index("inference")


def test_bad_targets_are_refused():
    with pytest.raises(ValueError):
        RateTargets(min_workers=4, max_workers=2)
    with pytest.raises(ValueError):
        RateTargets(utd_step=1.0)
