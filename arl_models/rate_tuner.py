"""The rate tuner: measure the data pipeline each interval, name its bottleneck, nudge workers and UTD.

A training system runs at the speed of its slowest subsystem. Once per interval the asynchronous loop
hands the tuner a :class:`RateReading` (rates measured over that interval) and gets back a
:class:`RateDecision`: how many environment workers to run and which update-to-data ratio (UTD) the
learner should keep next, which subsystem is the bottleneck, and why, in words.

**What the two ratios mean.**

* ``produce_consume = produced_per_s / consumed_per_s``. *Produced* is fresh environment transitions
  entering the replay per second (all workers together). *Consumed* is fresh transitions the learner
  digests per second at its UTD: ``consumed_per_s = updates_per_s / utd``, which is the same as
  ``updates_per_s * batch_size / reuse`` with ``reuse = utd * batch_size`` (the rows the learner means
  to sample per fresh transition). A ratio of 1 means the learner just keeps pace; the default target
  1.5 asks for data arriving half again as fast as it is digested, so the learner never waits on the
  workers. Below target, data is short; above, the learner is behind (each transition is replayed
  fewer times than the UTD asks, and the replay grows stale relative to the policy).
* ``step_inference = env_steps_per_s / inference_calls_per_s``: environment steps served per policy
  call. One environment per worker gives 1.0; a worker that steps ``k`` environments with one batched
  call gives ``k``. Below target, inference overhead is paid once per step: more environments per worker
  (batched inference) is the remedy. Pools that cannot change it get the advice only, in the reason.

Both targets (the seed's 1.5 and 1.2) are configurable starting points, not laws.

**The controller.** Readings are smoothed by an exponential moving average (EMA); decisions compare
the smoothed ratio with a deadband around the target, change at most one thing by one step per
interval (one worker, or the UTD by a constant factor), and ignore the first ``settle_intervals``
readings of every setting (the EMA restarts when workers or UTD change), so the transient of a change
is not read as a new error. In order:

1. The learner has not updated yet (``consumed_per_s == 0``, warm-up): hold.
2. The learner is starved (utilisation below ``starved_utilization``, it waits on data) or production
   is below the band: add a worker; at ``max_workers`` raise the UTD instead, so the learner spends its
   idle time on more updates per transition (bottleneck ``env``, or ``inference`` when steps per call
   are below target).
3. Production is above the band (the learner is behind): lower the UTD; at ``min_utd`` drop a worker,
   whose data would go unused and whose core the learner can use (bottleneck ``learner``).
4. Otherwise, inside the band: hold (``balanced``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

BOTTLENECKS = ("balanced", "env", "inference", "learner")
"""Bottleneck labels; ``metrics()`` logs the label's index as ``pipeline/bottleneck``."""


@dataclass(frozen=True)
class RateTargets:
    """Targets and limits of the tuner."""

    produce_consume: float = 1.5
    """Target of transitions produced / transitions consumed (see the module docstring)."""
    step_inference: float = 1.2
    """Target of environment steps per inference call."""
    min_workers: int = 1
    max_workers: int = 8
    min_utd: float = 0.25
    max_utd: float = 4.0
    deadband: float = 0.15
    """Relative half-width of the band around each target in which nothing changes."""
    utd_step: float = 1.25
    """Factor by which one decision raises (or divides) the UTD."""
    starved_utilization: float = 0.7
    """Learner utilisation below which the learner counts as waiting on data."""
    ema: float = 0.5
    """Weight of the newest reading in the moving average (1.0: no smoothing)."""
    settle_intervals: int = 1
    """Fresh readings to wait for after a change before the next one."""
    max_envs_per_worker: int = 16
    """Upper limit of the environments-per-worker advice."""

    def __post_init__(self) -> None:
        if not (1 <= self.min_workers <= self.max_workers):
            raise ValueError("need 1 <= min_workers <= max_workers")
        if not (0 < self.min_utd <= self.max_utd):
            raise ValueError("need 0 < min_utd <= max_utd")
        if self.utd_step <= 1.0 or not (0 < self.ema <= 1.0) or not (0 <= self.deadband < 1):
            raise ValueError("need utd_step > 1, 0 < ema <= 1 and 0 <= deadband < 1")


@dataclass(frozen=True)
class RateReading:
    """Rates measured over one interval (per second of wall time)."""

    interval_s: float
    env_steps_per_s: float
    inference_calls_per_s: float
    produced_per_s: float
    """Fresh transitions entering the replay."""
    consumed_per_s: float
    """Fresh transitions digested by the learner: ``updates_per_s / utd`` (see the module docstring)."""
    learner_utilization: float
    """Share of the interval's wall time the learner spent in ``update()``."""
    num_workers: int
    utd: float
    """UTD in force during the interval."""
    envs_per_worker: int = 1

    @classmethod
    def from_counts(
        cls,
        *,
        interval_s: float,
        env_steps: int,
        inference_calls: int,
        transitions: int,
        updates: int,
        update_time_s: float,
        num_workers: int,
        utd: float,
        envs_per_worker: int = 1,
    ) -> RateReading:
        """A reading from the counters' increments over one interval."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        return cls(
            interval_s=interval_s,
            env_steps_per_s=env_steps / interval_s,
            inference_calls_per_s=inference_calls / interval_s,
            produced_per_s=transitions / interval_s,
            consumed_per_s=updates / utd / interval_s,
            learner_utilization=min(update_time_s / interval_s, 1.0),
            num_workers=num_workers,
            utd=utd,
            envs_per_worker=envs_per_worker,
        )

    @property
    def produce_consume(self) -> float:
        return _ratio(self.produced_per_s, self.consumed_per_s)

    @property
    def step_inference(self) -> float:
        return _ratio(self.env_steps_per_s, self.inference_calls_per_s)


@dataclass(frozen=True)
class RateDecision:
    """What to run next interval, and which subsystem limits the pipeline now."""

    num_workers: int
    utd: float
    bottleneck: str
    """One of :data:`BOTTLENECKS`."""
    reason: str
    envs_per_worker: int = 1
    """Advised environments per worker (batched inference); pools that cannot change it ignore it."""
    changed: bool = False


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return math.inf if a > 0 else math.nan


class RateTuner:
    """A damped controller over :class:`RateReading` s; one :meth:`observe` per interval."""

    def __init__(self, targets: RateTargets = RateTargets()) -> None:
        self.targets = targets
        self._avg: RateReading | None = None
        self._fresh = 0  # readings since the last change
        self.intervals = 0
        self.changes = 0

    def smoothed(self) -> RateReading | None:
        """The moving average of the readings since the last change."""
        return self._avg

    def _smooth(self, r: RateReading) -> RateReading:
        if self._avg is None or self._avg.num_workers != r.num_workers or self._avg.utd != r.utd:
            self._avg, self._fresh = r, 1  # a new setting: start the average afresh
            return r
        w, a = self.targets.ema, self._avg
        mix = {
            k: w * getattr(r, k) + (1 - w) * getattr(a, k)
            for k in (
                "env_steps_per_s",
                "inference_calls_per_s",
                "produced_per_s",
                "consumed_per_s",
                "learner_utilization",
            )
        }
        self._avg = replace(r, **mix)
        self._fresh += 1
        return self._avg

    def _envs_advice(self, r: RateReading) -> tuple[int, bool]:
        """(advised envs per worker, steps per call below the band)."""
        t, s = self.targets, r.step_inference
        if not math.isfinite(s) or s >= t.step_inference * (1 - t.deadband):
            return r.envs_per_worker, False
        want = math.ceil(r.envs_per_worker * t.step_inference / max(s, 1e-9))
        return max(r.envs_per_worker, min(want, t.max_envs_per_worker)), True

    def observe(self, reading: RateReading) -> RateDecision:
        """Fold in one interval's reading and decide the next interval's workers and UTD."""
        if reading.interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {reading.interval_s}")
        self.intervals += 1
        r = self._smooth(reading)
        d = self._decide(r, reading)
        if d.changed:
            self.changes += 1
        return d

    def _decide(self, r: RateReading, raw: RateReading) -> RateDecision:
        """Decide on the smoothed reading ``r``; the stall checks look at this interval's ``raw`` one."""
        t = self.targets
        envs, few_steps = self._envs_advice(r)
        hold = RateDecision(r.num_workers, r.utd, "balanced", "", envs)
        ratio, util = r.produce_consume, r.learner_utilization
        if raw.produced_per_s <= 0:
            return replace(hold, bottleneck="env", reason="no transitions produced this interval: holding")
        if raw.consumed_per_s <= 0:
            return replace(
                hold, bottleneck="learner", reason="learner has not updated yet (warm-up): holding"
            )
        lo, hi = t.produce_consume * (1 - t.deadband), t.produce_consume * (1 + t.deadband)
        nums = f"produced/consumed {ratio:.2f} (target {t.produce_consume:g}), learner busy {100 * util:.0f}%"
        settling = self._fresh <= t.settle_intervals  # the first readings of a setting carry its transient
        if util < t.starved_utilization or ratio < lo:
            return self._short(r, hold, nums, few_steps, settling)
        if ratio > hi:
            return self._plenty(r, hold, nums, settling)
        return replace(hold, reason=f"{nums}: inside the band")

    def _short(
        self, r: RateReading, hold: RateDecision, nums: str, few_steps: bool, settling: bool
    ) -> RateDecision:
        t = self.targets
        label = "inference" if few_steps else "env"
        why = (
            "learner waits on data" if r.learner_utilization < t.starved_utilization else "data below target"
        )
        tip = (
            (
                f"; {r.step_inference:.2f} env steps per inference call (target {t.step_inference:g}): "
                f"run {hold.envs_per_worker} envs per worker (batched inference)"
            )
            if few_steps
            else ""
        )
        base = replace(hold, bottleneck=label)
        if settling:
            return replace(base, reason=f"{nums}: {why}; settling after the last change{tip}")
        if r.num_workers < t.max_workers:
            return replace(
                base,
                num_workers=r.num_workers + 1,
                changed=True,
                reason=f"{nums}: {why}, adding a worker ({r.num_workers} -> {r.num_workers + 1}){tip}",
            )
        if r.utd < t.max_utd:
            utd = min(r.utd * t.utd_step, t.max_utd)
            return replace(
                base,
                utd=utd,
                changed=True,
                reason=(
                    f"{nums}: {why} and workers at max ({t.max_workers}): "
                    f"raising utd {r.utd:.3g} -> {utd:.3g}{tip}"
                ),
            )
        return replace(base, reason=f"{nums}: {why}; workers and utd at their maxima{tip}")

    def _plenty(self, r: RateReading, hold: RateDecision, nums: str, settling: bool) -> RateDecision:
        t = self.targets
        base = replace(hold, bottleneck="learner")
        why = "the learner is behind the data"
        if settling:
            return replace(base, reason=f"{nums}: {why}; settling after the last change")
        if r.utd > t.min_utd:
            utd = max(r.utd / t.utd_step, t.min_utd)
            return replace(
                base, utd=utd, changed=True, reason=f"{nums}: {why}, lowering utd {r.utd:.3g} -> {utd:.3g}"
            )
        if r.num_workers > t.min_workers:
            return replace(
                base,
                num_workers=r.num_workers - 1,
                changed=True,
                reason=f"{nums}: {why} and utd at its minimum: dropping a worker "
                f"({r.num_workers} -> {r.num_workers - 1})",
            )
        return replace(
            base, reason=f"{nums}: {why}; utd and workers at their minima (a faster learner device helps)"
        )

    def metrics(self, reading: RateReading, decision: RateDecision) -> dict[str, float]:
        """``pipeline/...`` metrics of one interval: the raw reading and the decision taken on it."""
        return {
            "pipeline/env_steps_per_s": reading.env_steps_per_s,
            "pipeline/inference_calls_per_s": reading.inference_calls_per_s,
            "pipeline/produced_per_s": reading.produced_per_s,
            "pipeline/consumed_per_s": reading.consumed_per_s,
            "pipeline/produce_consume_ratio": reading.produce_consume,
            "pipeline/step_inference_ratio": reading.step_inference,
            "pipeline/learner_utilization": reading.learner_utilization,
            "pipeline/num_workers": float(reading.num_workers),
            "pipeline/utd": reading.utd,
            "pipeline/next_num_workers": float(decision.num_workers),
            "pipeline/next_utd": decision.utd,
            "pipeline/envs_per_worker_advice": float(decision.envs_per_worker),
            "pipeline/bottleneck": float(BOTTLENECKS.index(decision.bottleneck)),
            "pipeline/changed": float(decision.changed),
        }
