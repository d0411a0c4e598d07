"""``arl doctor``: where the data pipeline's time goes, found the way the seed debugs a training system.

First every subsystem alone (:mod:`arl_cli.doctor_subsystems`: the task's environment step, actor
inference single and batched, replay sampling uniform and prioritised, the learner's update at the chosen
preset), then their interfaces (:mod:`arl_cli.doctor_interfaces`: a worker's Rollout has the replay's
fields, dtypes and shapes and the data-version metadata; the latency from an observation in a worker to
that transition being sampled by the learner), then a short stress run of the asynchronous pipeline when
``arl_models.online.async_loop`` has one. The verdict is the :class:`~arl_models.rate_tuner.RateTuner`'s
decision on a reading composed from the isolated rates (or on the stress run's own reading).

Each check passes, warns, fails with a message naming what is wrong, or is skipped when an optional part
is not installed. Only typer is imported at module level, so ``arl --help`` stays fast; the options that
model fine-tuning default to ``FinetuneConfig``'s (:mod:`arl_cli.defaults`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from typing import Annotated, Any

import typer

from arl_cli.defaults import library
from arl_cli.doctor_interfaces import check_format, check_latency, reference_rollout
from arl_cli.doctor_subsystems import (
    Check,
    build_learners,
    check_env,
    check_inference,
    check_learner,
    check_preprocess,
    check_replay_prioritized,
    check_replay_uniform,
    guard,
    optional,
    random_replay,
)

_FINETUNE = library("arl_models.online.config", "FinetuneConfig")
_PRESET = library("arl_models.presets", "Preset")
_OFFLINE = library("arl_models.offline", "train_offline")


# ---------------------------------------------------------------- stress run and verdict
def check_stress(spec, seconds: float) -> Check:
    mod = optional("arl_models.online.async_loop")
    if mod is None:
        return Check(
            "async_stress",
            "stress",
            "skip",
            "arl_models.online.async_loop is not present (no asynchronous loop yet)",
        )
    if not hasattr(mod, "stress_run"):
        return Check(
            "async_stress",
            "stress",
            "skip",
            "arl_models.online.async_loop has no stress_run(task, seconds) -> RateReading",
        )
    reading = mod.stress_run(spec.key, seconds=seconds)
    return Check(
        "async_stress",
        "stress",
        "pass",
        f"{seconds:g} s of the asynchronous pipeline",
        reading.produced_per_s,
        "transitions/s",
        details={"reading": asdict(reading)},
    )


def _rate(checks: dict[str, Check], name: str) -> float:
    c = checks.get(name)
    return c.rate if c is not None and c.status == "pass" and c.rate else math.nan


def compose_reading(checks: dict[str, Check], workers: int, utd: float, envs_per_worker: int):
    """A pipeline reading from the isolated rates: ``workers`` in parallel, each stepping ``envs_per_worker``
    environments with one inference call per step of them all; a learner that keeps ``utd``."""
    from arl_models.rate_tuner import RateReading

    env, learner = _rate(checks, "env_step"), _rate(checks, "learner_online")
    calls = _rate(checks, "inference_single" if envs_per_worker == 1 else "inference_batched")
    per_worker = envs_per_worker / (envs_per_worker / env + 1 / calls)  # env steps/s of one worker
    produced = workers * per_worker
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


def where_time_goes(
    checks: dict[str, Check], utd: float, envs_per_worker: int, rollout_add_ms: float | None
) -> list[dict]:
    """Milliseconds of each subsystem per fresh transition, on its own side of the pipeline."""
    b = "inference_single" if envs_per_worker == 1 else "inference_batched"
    rows = [
        ("env step", "worker", 1000 / _rate(checks, "env_step")),
        ("inference", "worker", 1000 / (_rate(checks, b) * envs_per_worker)),
        ("replay add", "learner", rollout_add_ms),
        ("replay sample", "learner", utd * 1000 / _rate(checks, "replay_uniform")),
        *(
            [("preprocess", "learner", utd * 1000 / _rate(checks, "preprocess"))]
            if "preprocess" in checks
            else []
        ),
        ("learner update", "learner", utd * 1000 / _rate(checks, "learner_online")),
    ]
    per_side = {
        s: sum(ms for _, side, ms in rows if side == s and ms is not None and math.isfinite(ms))
        for s in ("worker", "learner")
    }
    return [
        {
            "part": p,
            "side": s,
            "ms_per_transition": ms,
            "share_of_side": (ms / per_side[s]) if ms is not None and per_side[s] > 0 else None,
        }
        for p, s, ms in rows
    ]


def _subsystem_checks(spec, pre, actor, learners, replay, *, seconds, batch_inference, preprocess):
    """Every subsystem's check, each alone."""
    obs_dim = replay.data["obs"].shape[1]
    act_dim = replay.data["act"].shape[1]
    batch = pre.cql.batch_size
    out: list[Check] = [guard("env_step", "subsystem", lambda: check_env(spec, seconds))]
    try:
        out += check_inference(actor, obs_dim, seconds, batch_inference)
    except Exception as e:
        out += [
            Check(n, "subsystem", "fail", f"{type(e).__name__}: {e}")
            for n in ("inference_single", "inference_batched")
        ]
    out.append(guard("replay_uniform", "subsystem", lambda: check_replay_uniform(replay, seconds, batch)))
    out.append(
        guard(
            "replay_prioritized",
            "subsystem",
            lambda: check_replay_prioritized(obs_dim, act_dim, len(replay), seconds, batch),
        )
    )
    if preprocess != "none":
        out.append(
            guard("preprocess", "subsystem", lambda: check_preprocess(preprocess, replay, seconds, batch))
        )
    for name, algo in learners.items():
        out.append(guard(name, "subsystem", lambda n=name, a=algo: check_learner(n, a, replay, seconds)))
    return out


def _verdict(checks: dict[str, Check], workers: int, utd: float, envs_per_worker: int) -> dict[str, Any]:
    """The rate tuner's decision on the stress run's reading, else on one composed from the isolated rates."""
    from arl_models.rate_tuner import RateReading, RateTargets, RateTuner

    stress = checks["async_stress"]
    tuner = RateTuner(RateTargets(settle_intervals=0, max_workers=max(8, workers)))
    if stress.status == "pass":
        reading, source = RateReading(**stress.details["reading"]), "the stress run"
    else:
        reading, source = compose_reading(checks, workers, utd, envs_per_worker), "the isolated rates"
    decision = tuner.observe(reading)
    return {
        "bottleneck": decision.bottleneck,
        "reason": decision.reason,
        "source": source,
        "advice": {
            "num_workers": decision.num_workers,
            "utd": decision.utd,
            "envs_per_worker": decision.envs_per_worker,
        },
        "metrics": tuner.metrics(reading, decision),
    }


def run_doctor(
    task: str,
    preset: str,
    seconds: float,
    workers: int | None,
    utd: float,
    envs_per_worker: int,
    *,
    batch_inference: int = 8,
    replay_size: int,
    threads: int,
    preprocess: str,
) -> dict[str, Any]:
    """Every check, the verdict and the time table, as a JSON-ready dict."""
    import torch

    from arl_models.envs.registry import env_dims, get_task
    from arl_models.presets import get_preset
    from arl_models.replay import ActionScaler

    torch.set_num_threads(threads)
    spec, pre = get_task(task), get_preset(preset)
    obs_dim, act_dim, low, high, _ = env_dims(spec)
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    learners = build_learners(pre, obs_dim, act_dim)
    actor = learners["learner_online"]
    replay = random_replay(obs_dim, act_dim, replay_size)
    out = _subsystem_checks(
        spec,
        pre,
        actor,
        learners,
        replay,
        seconds=seconds,
        batch_inference=max(batch_inference, envs_per_worker),
        preprocess=preprocess,
    )
    checks = {c.name: c for c in out}
    rollout = reference_rollout(spec, actor, ActionScaler(low, high))
    updates_per_s = _rate(checks, "learner_online")
    out += [
        guard("rollout_format", "interface", lambda: check_format(rollout, replay, spec.env_version)),
        guard(
            "latency",
            "interface",
            lambda: check_latency(rollout, replay_size, pre.cql.batch_size, updates_per_s, None),
        ),
        guard("async_stress", "stress", lambda: check_stress(spec, 3 * seconds)),
    ]
    checks = {c.name: c for c in out}
    add_ms = checks["latency"].details.get("replay_add_ms")
    return {
        "task": spec.key,
        "preset": preset,
        "seconds": seconds,
        "threads": threads,
        "load_average": list(os.getloadavg()),
        "checks": [{**asdict(c), "ms_per_item": c.ms_per_item} for c in out],
        "verdict": _verdict(checks, workers, utd, envs_per_worker),
        "where_time_goes": where_time_goes(
            checks, utd, envs_per_worker, None if add_ms is None else add_ms / rollout.steps
        ),
        "ok": all(c.status != "fail" for c in out),
    }


# ---------------------------------------------------------------- output
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _fmt(x: float | None, spec: str = ",.1f") -> str:
    return "–" if x is None or not math.isfinite(x) else format(x, spec)


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 150)
    la = ", ".join(f"{x:.2f}" for x in report["load_average"])
    t = Table(
        title=f"arl doctor: {report['task']} ({report['preset']} preset, {report['threads']} torch "
        f"thread(s), load average {la})"
    )
    for col in ("check", "group", "status", "rate", "ms / item", "message"):
        t.add_column(col, overflow="fold")
    for c in report["checks"]:
        st = c["status"]
        t.add_row(
            c["name"],
            c["group"],
            f"[{_STYLE[st]}]{st}[/]",
            f"{_fmt(c['rate'], ',.0f')} {c['unit']}".strip(),
            _fmt(c["ms_per_item"], ".3f"),
            c["message"],
        )
    con.print(t)
    w = Table(title="where the time goes (ms per fresh transition)")
    for col in ("part", "side", "ms", "share of side"):
        w.add_column(col)
    for r in report["where_time_goes"]:
        share = r["share_of_side"]
        w.add_row(
            r["part"],
            r["side"],
            _fmt(r["ms_per_transition"], ".4f"),
            "–" if share is None else f"{100 * share:.0f}%",
        )
    con.print(w)
    v = report["verdict"]
    m = v["metrics"]
    con.print(
        f"worker side: {m['pipeline/num_workers']:.0f} worker(s) produce "
        f"{_fmt(m['pipeline/produced_per_s'], ',.0f')} transitions/s; learner side digests "
        f"{_fmt(m['pipeline/consumed_per_s'], ',.0f')} transitions/s "
        f"at utd {m['pipeline/utd']:g} (busy {100 * m['pipeline/learner_utilization']:.0f}%)"
    )
    con.print(f"[bold]bottleneck: {v['bottleneck']}[/] (from {v['source']}): {v['reason']}")


def doctor_cmd(
    task: Annotated[
        str, typer.Option("--task", "-t", help="Task name, optionally with a version.")
    ] = "safe-pendulum",
    seconds: Annotated[
        float, typer.Option(help="Seconds of measurement per subsystem (the stress run takes 3x).")
    ] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full report as JSON.")] = False,
    preset: Annotated[
        str, typer.Option(help="Network sizes of the learner: demo | paper.")
    ] = _OFFLINE.preset,
    workers: Annotated[
        int | None, typer.Option(help="Workers assumed in the verdict (default: cores - 1).")
    ] = None,
    utd: Annotated[float, typer.Option(help="Update-to-data ratio assumed in the verdict.")] = _FINETUNE.utd,
    envs_per_worker: Annotated[
        int, typer.Option(help="Environments per worker assumed in the verdict.")
    ] = _FINETUNE.workers.envs_per_worker,
    replay_size: Annotated[
        int, typer.Option(help="Rows in the replay buffers measured (and in the latency estimate).")
    ] = 100_000,
    threads: Annotated[int, typer.Option(help="torch threads while measuring.")] = _PRESET.threads,
    preprocess: Annotated[
        str,
        typer.Option(help="Also time this learner-side observation transform: none | amplitude | noise."),
    ] = _FINETUNE.preprocess,
) -> None:
    """Time each data-pipeline subsystem, check their interfaces, and name the bottleneck.

    Each subsystem alone, then their interfaces, then a short stress run; exit status 1 if a check fails.
    """
    if seconds <= 0:
        typer.secho("error: --seconds must be positive", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    try:
        report = run_doctor(
            task,
            preset,
            seconds,
            workers,
            utd,
            envs_per_worker,
            replay_size=replay_size,
            threads=threads,
            preprocess=preprocess,
        )
    except KeyError as e:
        typer.secho(f"error: {e.args[0]}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(_finite(report), indent=2, allow_nan=False))
    else:
        render(report)
    if not report["ok"]:
        raise typer.Exit(1)


def _finite(x: Any) -> Any:
    """The report with non-finite numbers as ``null`` (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
