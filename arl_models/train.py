"""The gradient-step loop shared by the offline stages: logging, evaluation, checkpoints and resume.

Resuming restores weights, optimiser moments, the algorithm's counters and torch's RNG from the
last ``train_state/``, so an interrupted run reaches the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

from tqdm.auto import tqdm

from arl_models.checkpoint import (
    Algorithm,
    check_resumable,
    clear_train_state,
    finished,
    has_train_state,
    load_train_state,
    save_checkpoint,
)
from arl_models.locks import holding_out
from arl_models.metrics import FanoutSink, JsonlSink, MetricSink
from arl_models.prioritized import PrioritizedReplay, TDLearner, prioritized_update
from arl_models.replay import Batch


class Trainable(Algorithm, Protocol):
    """An algorithm :func:`fit` can drive: a checkpointable one with a gradient step."""

    def update(self, batch: Batch) -> dict[str, float]: ...


DIVERGED_ABOVE = 1e8
"""A loss or value whose magnitude passes this has run away: the stage stops (:class:`TrainingDiverged`)."""


class TrainingDiverged(RuntimeError):
    """A gradient step gave a non-finite or runaway loss or value; the checkpoint on disk is the last good
    one."""


def check_finite(metrics: dict[str, float], step: int, where: str) -> None:
    """Raise :class:`TrainingDiverged` naming each metric of ``metrics`` that is not finite or passed
    :data:`DIVERGED_ABOVE` at ``step``."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v) or abs(v) > DIVERGED_ABOVE}
    if bad:
        named = ", ".join(f"{k} = {v:.4g}" for k, v in bad.items())
        raise TrainingDiverged(f"{where}: step {step}: {named}; nothing was saved from this step on")


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop log lines written after the checkpoint we resume from."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= last_step]
    path.write_text("".join(f"{ln}\n" for ln in keep))


def _resume_or_begin(
    algo: Trainable,
    out: Path,
    record: dict[str, Any],
    steps: int,
    prioritized: PrioritizedReplay | None,
    restart: bool,
    progress: bool,
) -> dict[str, float] | None:
    """Set ``algo`` (and the replay's priorities) to the run in ``out`` when there is one of ``record``'s
    settings (another is refused; ``restart`` discards it), else begin afresh; log lines past the state
    resumed are cut. Returns the final metrics of a run in ``out`` that already finished ``steps``."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "metrics.jsonl"
    if restart:
        clear_train_state(out)
    if not has_train_state(out):
        log_path.unlink(missing_ok=True)
        return None
    check_resumable(out, record)
    done = finished(out, steps)
    if done is not None:
        if progress:
            print(
                f"{out} finished {steps} steps already: its record is returned, nothing is trained",
                flush=True,
            )
        return done
    left = load_train_state(out, algo)
    if prioritized is not None:
        prioritized.load_priority_state_dict(left)
    _truncate_jsonl(log_path, algo.step)
    return None


@holding_out
def fit(
    algo: Trainable,
    sample: Callable[[], Batch],
    steps: int,
    out: str | Path,
    record: dict[str, Any],
    *,
    sink: MetricSink | None = None,
    log_every: int = 1000,
    save_every: int = 5000,
    evaluate: Callable[[], dict[str, float]] | None = None,
    eval_every: int = 0,
    progress: bool = True,
    desc: str = "",
    stop_after: int | None = None,
    prioritized: PrioritizedReplay | None = None,
    restart: bool = False,
) -> dict[str, float]:
    """Run ``algo.update(sample())`` until ``algo.step == steps``; returns the final metrics record (a
    checkpoint in ``out`` that already finished ``steps`` is left as it is and its record returned).

    ``stop_after`` ends the call early after that many steps in this call (checkpoint included): it
    is how tests simulate an interruption. With ``prioritized`` each step draws its batch from that
    replay instead, weights the TD loss and updates the priorities; checkpoints carry them.

    A checkpoint in ``out`` is resumed only when it was written with the same settings and data
    (:func:`check_resumable`); ``restart`` discards it instead. A non-finite or runaway loss stops the
    run with :class:`TrainingDiverged` before anything of that step is saved.
    """
    out = Path(out)
    done = _resume_or_begin(algo, out, record, steps, prioritized, restart, progress)
    if done is not None:
        return done
    sinks = FanoutSink(JsonlSink(out / "metrics.jsonl"), sink)
    extra = (lambda: None) if prioritized is None else prioritized.priority_state_dict
    window: dict[str, float] = {}
    count: dict[str, int] = {}  # per metric: the delayed actor's metrics come every policy_freq-th step
    latest: dict[str, float] = {}
    t0, start = time.perf_counter(), algo.step
    bar = tqdm(
        total=steps, initial=start, desc=desc or algo.name, disable=not progress, unit="step", smoothing=0.1
    )
    try:
        while algo.step < steps:
            if prioritized is None:
                m = algo.update(sample())
            else:
                m = prioritized_update(cast(TDLearner, algo), prioritized, algo.cfg.batch_size)
            check_finite(m, algo.step, desc or algo.name)
            for k, v in m.items():
                window[k] = window.get(k, 0.0) + v
                count[k] = count.get(k, 0) + 1
            step = algo.step
            bar.update(1)
            if step % log_every == 0 or step == steps:
                latest = {f"train/{k}": v / count[k] for k, v in window.items()}
                latest["train/steps_per_s"] = (step - start) / max(time.perf_counter() - t0, 1e-9)
                if evaluate is not None and eval_every and (step % eval_every == 0 or step == steps):
                    latest |= evaluate()
                sinks.log(latest, step)
                bar.set_postfix({k.split("/")[-1]: f"{v:.3g}" for k, v in list(latest.items())[:3]})
                window, count = {}, {}
            if stop_after is not None and step - start >= stop_after:
                break  # the checkpoint after the loop is the one a rerun resumes from
            if step % save_every == 0 and step < steps:
                save_checkpoint(out, algo, record, extra_tensors=extra())
    finally:
        bar.close()
    final = {**latest, "steps": float(algo.step), "wall_time_s": time.perf_counter() - t0}
    save_checkpoint(out, algo, record, metrics=final, extra_tensors=extra())
    return final
