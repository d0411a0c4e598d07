"""``arl doctor``: where the data pipeline's time goes, found the way the seed debugs a training system.

First every subsystem alone (the task's environment step, actor inference single and batched, replay
sampling uniform and prioritised, the learner's update at the chosen preset), then their interfaces
(a worker's Rollout has the replay's fields, dtypes and shapes and the data-version metadata; the
latency from an observation in a worker to that transition being sampled by the learner), then a short
stress run of the asynchronous pipeline when ``arl_models.online.async_loop`` exists. The verdict is the
:class:`~arl_models.rate_tuner.RateTuner`'s decision on a reading composed from the isolated rates
(or on the stress run's own reading).

Each check passes, warns, fails with a message naming what is wrong, or is skipped when an optional
part (Ray, the prioritised replay, the worker pools, the asynchronous loop) is not installed yet.
Only typer is imported at module level, so ``arl --help`` stays fast.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Annotated, Any

import typer

REPLAY_FROM_ROLLOUT = {
    "obs": "obs",
    "act": "act",
    "rew": "rew",
    "cost": "cost",
    "next_obs": "next_obs",
    "done": "terminated",
}
"""Replay field -> the Rollout field it is filled from."""
_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass
class Check:
    name: str
    group: str
    """``subsystem``, ``interface`` or ``stress``."""
    status: str
    """``pass``, ``warn``, ``fail`` or ``skip``."""
    message: str
    rate: float | None = None
    unit: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ms_per_item(self) -> float | None:
        return 1000.0 / self.rate if self.rate else None


def _optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def measure(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> float:
    """Calls per second of ``fn`` over about ``seconds`` of wall time (one warm-up call first)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while n < min_calls or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def _guard(name: str, group: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as e:  # a doctor reports a broken subsystem rather than crashing on it
        return Check(name, group, "fail", f"{type(e).__name__}: {e}")


def _rate_check(name: str, rate: float, unit: str, what: str, **details: Any) -> Check:
    ok = math.isfinite(rate) and rate > 0
    return Check(
        name,
        "subsystem",
        "pass" if ok else "fail",
        what if ok else f"{what}: no progress",
        rate,
        unit,
        details,
    )


# ---------------------------------------------------------------- subsystems in isolation
def check_env(spec, seconds: float) -> Check:
    from arl_models.envs.registry import make_env

    env = make_env(spec)
    env.reset(seed=0)
    env.action_space.seed(0)

    def step() -> None:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()

    try:
        rate = measure(step, seconds)
    finally:
        env.close()
    return _rate_check("env_step", rate, "steps/s", f"{spec.key} random actions, one process")


def check_inference(algo, obs_dim: int, seconds: float, batch: int) -> list[Check]:
    import numpy as np

    out = []
    for name, b in (("inference_single", 1), ("inference_batched", batch)):
        obs = np.random.default_rng(0).normal(size=(b, obs_dim)).astype(np.float32)
        rate = measure(lambda o=obs: algo.act(o, deterministic=False), seconds)
        out.append(
            _rate_check(
                name, rate, "calls/s", f"actor.act on ({b}, {obs_dim}) = {rate * b:,.0f} obs/s", batch=b
            )
        )
    return out


def random_replay(obs_dim: int, act_dim: int, size: int, seed: int = 0):
    import numpy as np

    from arl_models.replay import ReplayBuffer

    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(size, obs_dim, act_dim)
    buf.add(
        obs=rng.normal(size=(size, obs_dim)),
        act=rng.uniform(-1, 1, size=(size, act_dim)),
        rew=rng.normal(size=size),
        cost=(rng.uniform(size=size) < 0.1),
        next_obs=rng.normal(size=(size, obs_dim)),
        done=np.zeros(size),
    )
    return buf


def check_replay_uniform(replay, seconds: float, batch: int) -> Check:
    rate = measure(lambda: replay.sample(batch), seconds)
    return _rate_check("replay_uniform", rate, "batches/s", f"ReplayBuffer({len(replay):,}).sample({batch})")


def check_replay_prioritized(obs_dim: int, act_dim: int, size: int, seconds: float, batch: int) -> Check:
    mod = _optional("arl_models.prioritized")
    if mod is None:
        return Check("replay_prioritized", "subsystem", "skip", "arl_models.prioritized is not present")
    import numpy as np
    import torch

    per = mod.PrioritizedReplay(size, obs_dim, act_dim, mod.PERConfig())
    src = random_replay(obs_dim, act_dim, size)
    per.add(**{k: v.numpy() for k, v in src.data.items()})
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)

    def step() -> None:
        _, idx, _ = per.sample(batch, generator=gen)
        per.update_priorities(idx, torch.as_tensor(rng.exponential(size=len(idx)), dtype=torch.float32))

    rate = measure(step, seconds)
    return _rate_check(
        "replay_prioritized",
        rate,
        "batches/s",
        f"PrioritizedReplay({size:,}) sample({batch}) + priority update",
    )


def check_preprocess(name: str, replay, seconds: float, batch: int) -> Check:
    """The learner-side observation transform (``FinetuneConfig.preprocess``) on sampled batches."""
    from arl_models.preprocess import ObsStats, make_preprocessor

    prep = make_preprocessor(name, 0.1, ObsStats.of(replay.data["obs"][: len(replay)]))
    b = replay.sample(batch)
    rate = measure(lambda: prep(b), seconds)
    return _rate_check(
        "preprocess", rate, "batches/s", f"preprocess {name!r} on a batch of {batch}, learner side"
    )


def check_learner(name: str, algo, replay, seconds: float) -> Check:
    bs = algo.cfg.batch_size
    rate = measure(lambda: algo.update(replay.sample(bs)), seconds)
    return _rate_check(
        name, rate, "updates/s", f"{type(algo).__name__} update, batch {bs}, hidden {algo.cfg.hidden}"
    )


def build_learners(preset, obs_dim: int, act_dim: int) -> dict[str, Any]:
    """The offline stage's CQL and the online stage's learner (SAC: Cal-QL's critic with no conservative term)."""
    from dataclasses import fields

    from arl_models.algos.calql import CalQL, CalQLConfig
    from arl_models.algos.cql import CQL

    base = {f.name: getattr(preset.cql, f.name) for f in fields(preset.cql)}
    online_cfg = CalQLConfig(**{**base, "conservative": "none", "backup_entropy": True})
    return {
        "learner_cql": CQL(obs_dim, act_dim, preset.cql),
        "learner_online": CalQL(obs_dim, act_dim, online_cfg),
    }


# ---------------------------------------------------------------- interfaces
def reference_rollout(spec, algo, scaler, seed: int = 0) -> SimpleNamespace:
    """One episode in this process, shaped as the workers' Rollout (used when no worker pool is installed)."""
    import numpy as np

    from arl_models.data.dataset import utc_now_iso
    from arl_models.envs.registry import make_env

    env = make_env(spec)
    obs, _ = env.reset(seed=seed)
    rows: list[tuple] = []
    t_step = t_inf = 0.0
    while True:
        t0 = time.perf_counter()
        a = algo.act(obs[None].astype(np.float32), deterministic=False)[0]
        t1 = time.perf_counter()
        nxt, r, term, trunc, info = env.step(scaler.unnormalize(a))
        t_inf, t_step = t_inf + t1 - t0, t_step + time.perf_counter() - t1
        rows.append((obs, a, r, info.get("cost", 0.0), nxt, term, trunc))
        obs = nxt
        if term or trunc:
            break
    env.close()
    o, a, r, c, n, te, tr = (np.asarray(x) for x in zip(*rows, strict=True))
    return SimpleNamespace(
        worker_id=0,
        policy_version=0,
        seed=seed,
        obs=o.astype(np.float32),
        act=a.astype(np.float32),
        rew=r.astype(np.float32),
        cost=c.astype(np.float32),
        next_obs=n.astype(np.float32),
        terminated=te,
        truncated=tr,
        env_version=spec.env_version,
        policy_hash="0" * 64,
        random_seed=seed,
        timestamp=utc_now_iso(),
        episode_return=float(r.sum()),
        episode_cost=float(c.sum()),
        steps=len(rows),
        inference_calls=len(rows),
        step_time_s=t_step,
        inference_time_s=t_inf,
    )


def _field_problems(rollout, replay) -> list[str]:
    import numpy as np

    steps = int(getattr(rollout, "steps", -1))
    problems = []
    for dst, src in (*REPLAY_FROM_ROLLOUT.items(), ("done", "truncated")):
        arr = getattr(rollout, src, None)
        want = (steps, *replay.data[dst].shape[1:])
        if not isinstance(arr, np.ndarray):
            problems.append(f"field '{src}' is missing or not an ndarray (replay field '{dst}')")
        elif arr.dtype.kind not in "fb":
            problems.append(f"field '{src}' has dtype {arr.dtype}; the replay stores float32 ('{dst}')")
        elif arr.shape != want:
            problems.append(f"field '{src}' has shape {arr.shape}; the replay's '{dst}' expects {want}")
        elif not np.isfinite(arr.astype(np.float64)).all():
            problems.append(f"field '{src}' has non-finite values")
    act = getattr(rollout, "act", None)
    if isinstance(act, np.ndarray) and act.dtype.kind == "f" and act.size and np.abs(act).max() > 1.0 + 1e-6:
        problems.append(
            f"field 'act' leaves [-1, 1] (max |a| = {np.abs(act).max():.3g}): actions must be in network scale"
        )
    return problems


def _metadata_problems(rollout, env_version: str | None) -> list[str]:
    problems = []
    ev, ph, rs, ts = (
        getattr(rollout, k, None) for k in ("env_version", "policy_hash", "random_seed", "timestamp")
    )
    if not (isinstance(ev, str) and _SEMVER.match(ev)):
        problems.append(f"field 'env_version' is {ev!r}, not a semantic version")
    elif env_version is not None and ev != env_version:
        problems.append(f"field 'env_version' is {ev!r}; the task is {env_version!r}")
    if not (isinstance(ph, str) and _HEX.match(ph)):
        problems.append(f"field 'policy_hash' is {ph!r}, not lower-case hex")
    if not (isinstance(rs, int | float) and float(rs).is_integer() and 0 <= rs < 2**32):
        problems.append(f"field 'random_seed' is {rs!r}, not a uint32")
    try:
        datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"field 'timestamp' is {ts!r}, not ISO-8601")
    return problems


def check_format(rollout, replay, env_version: str | None = None) -> Check:
    """A Rollout's fields against the replay's: names, dtypes, shapes, action scale, metadata, and a round trip."""
    import numpy as np
    import torch

    from arl_models.replay import ReplayBuffer

    problems = _field_problems(rollout, replay) + _metadata_problems(rollout, env_version)
    if problems:
        return Check("rollout_format", "interface", "fail", "; ".join(problems))
    steps = int(rollout.steps)
    probe = ReplayBuffer(steps, replay.data["obs"].shape[1], replay.data["act"].shape[1])
    rows = {dst: getattr(rollout, src) for dst, src in REPLAY_FROM_ROLLOUT.items()}
    probe.add(**rows)
    back = probe.gather(torch.arange(steps))
    for dst, arr in rows.items():
        if not np.array_equal(getattr(back, dst).numpy(), np.asarray(arr, dtype=np.float32)):
            return Check(
                "rollout_format", "interface", "fail", f"field '{dst}' does not survive a replay round trip"
            )
    return Check(
        "rollout_format",
        "interface",
        "pass",
        f"{steps} steps: fields, dtypes, shapes, action scale and metadata match the replay",
        details={"steps": steps, "source": type(rollout).__name__},
    )


def check_latency(
    rollout, replay_size: int, batch: int, updates_per_s: float, transfer_s: float | None
) -> Check:
    """Observation in a worker -> that transition first sampled by the learner, in its parts."""
    from arl_models.replay import ReplayBuffer

    steps = int(rollout.steps)
    per_step = (rollout.step_time_s + rollout.inference_time_s) / max(steps, 1)
    probe = ReplayBuffer(max(replay_size, steps), rollout.obs.shape[1], rollout.act.shape[1])
    rows = {dst: getattr(rollout, src) for dst, src in REPLAY_FROM_ROLLOUT.items()}
    add_s = 1.0 / measure(lambda: probe.add(**rows), 0.05)
    parts = {
        "episode_wait_ms": 1000 * per_step * (steps - 1) / 2,  # a transition waits for its episode's end
        "transfer_ms": None if transfer_s is None else 1000 * transfer_s,
        "replay_add_ms": 1000 * add_s,
        "first_sample_ms": 1000 * replay_size / (batch * updates_per_s),  # uniform: N / B updates, expected
    }
    total = sum(v for v in parts.values() if v is not None)
    msg = (
        f"observation -> first sampled ≈ {total:,.0f} ms (episode wait {parts['episode_wait_ms']:.0f}, "
        f"replay add {parts['replay_add_ms']:.2f}, first uniform sample at {replay_size:,} rows {parts['first_sample_ms']:.0f}"
        + ("" if transfer_s is not None else "; worker transfer not measured: no worker pool")
        + ")"
    )
    status = "pass" if total < 1000 else "warn"
    if status == "warn":
        msg += ": fresh data waits long; prioritised replay with freshness samples it sooner"
    if not math.isfinite(total):
        status = "fail"
    return Check("latency", "interface", status, msg, details={**parts, "total_ms": total})


# ---------------------------------------------------------------- stress run and verdict
def check_stress(spec, seconds: float) -> Check:
    mod = _optional("arl_models.online.async_loop")
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


def run_doctor(
    task: str,
    preset: str = "demo",
    seconds: float = 1.0,
    workers: int | None = None,
    utd: float = 1.0,
    envs_per_worker: int = 1,
    batch_inference: int = 8,
    replay_size: int = 100_000,
    threads: int = 1,
    preprocess: str = "none",
) -> dict[str, Any]:
    """Every check, the verdict and the time table, as a JSON-ready dict."""
    import torch

    from arl_models.envs.registry import env_dims, get_task
    from arl_models.presets import get_preset
    from arl_models.rate_tuner import RateTargets, RateTuner
    from arl_models.replay import ActionScaler

    torch.set_num_threads(threads)
    spec, pre = get_task(task), get_preset(preset)
    obs_dim, act_dim, low, high, _ = env_dims(spec)
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    learners = build_learners(pre, obs_dim, act_dim)
    actor = learners["learner_online"]
    replay = random_replay(obs_dim, act_dim, replay_size)
    out: list[Check] = [_guard("env_step", "subsystem", lambda: check_env(spec, seconds))]
    try:
        out += check_inference(actor, obs_dim, seconds, max(batch_inference, envs_per_worker))
    except Exception as e:
        out += [
            Check(n, "subsystem", "fail", f"{type(e).__name__}: {e}")
            for n in ("inference_single", "inference_batched")
        ]
    out.append(
        _guard(
            "replay_uniform", "subsystem", lambda: check_replay_uniform(replay, seconds, pre.cql.batch_size)
        )
    )
    out.append(
        _guard(
            "replay_prioritized",
            "subsystem",
            lambda: check_replay_prioritized(obs_dim, act_dim, replay_size, seconds, pre.cql.batch_size),
        )
    )
    if preprocess != "none":
        out.append(
            _guard(
                "preprocess",
                "subsystem",
                lambda: check_preprocess(preprocess, replay, seconds, pre.cql.batch_size),
            )
        )
    for name, algo in learners.items():
        out.append(_guard(name, "subsystem", lambda n=name, a=algo: check_learner(n, a, replay, seconds)))
    checks = {c.name: c for c in out}
    scaler = ActionScaler(low, high)
    rollout = reference_rollout(spec, actor, scaler)
    out.append(_guard("rollout_format", "interface", lambda: check_format(rollout, replay, spec.env_version)))
    out.append(
        _guard(
            "latency",
            "interface",
            lambda: check_latency(
                rollout, replay_size, pre.cql.batch_size, _rate(checks, "learner_online"), None
            ),
        )
    )
    out.append(_guard("async_stress", "stress", lambda: check_stress(spec, 3 * seconds)))
    checks = {c.name: c for c in out}
    stress = checks["async_stress"]
    tuner = RateTuner(RateTargets(settle_intervals=0, max_workers=max(8, workers)))
    if stress.status == "pass":
        from arl_models.rate_tuner import RateReading

        reading, source = RateReading(**stress.details["reading"]), "the stress run"
    else:
        reading, source = compose_reading(checks, workers, utd, envs_per_worker), "the isolated rates"
    decision = tuner.observe(reading)
    add_ms = checks["latency"].details.get("replay_add_ms")
    return {
        "task": spec.key,
        "preset": preset,
        "seconds": seconds,
        "threads": threads,
        "load_average": list(os.getloadavg()),
        "checks": [{**asdict(c), "ms_per_item": c.ms_per_item} for c in out],
        "verdict": {
            "bottleneck": decision.bottleneck,
            "reason": decision.reason,
            "source": source,
            "advice": {
                "num_workers": decision.num_workers,
                "utd": decision.utd,
                "envs_per_worker": decision.envs_per_worker,
            },
            "metrics": tuner.metrics(reading, decision),
        },
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
        title=f"arl doctor: {report['task']} ({report['preset']} preset, {report['threads']} torch thread(s), load average {la})"
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
        f"worker side: {m['pipeline/num_workers']:.0f} worker(s) produce {_fmt(m['pipeline/produced_per_s'], ',.0f')} "
        f"transitions/s; learner side digests {_fmt(m['pipeline/consumed_per_s'], ',.0f')} transitions/s "
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
    preset: Annotated[str, typer.Option(help="Network sizes of the learner: demo | paper.")] = "demo",
    workers: Annotated[
        int | None, typer.Option(help="Workers assumed in the verdict (default: cores - 1).")
    ] = None,
    utd: Annotated[float, typer.Option(help="Update-to-data ratio assumed in the verdict.")] = 1.0,
    envs_per_worker: Annotated[int, typer.Option(help="Environments per worker assumed in the verdict.")] = 1,
    replay_size: Annotated[
        int, typer.Option(help="Rows in the replay buffers measured (and in the latency estimate).")
    ] = 100_000,
    threads: Annotated[int, typer.Option(help="torch threads while measuring.")] = 1,
    preprocess: Annotated[
        str,
        typer.Option(help="Also time this learner-side observation transform (none | amplitude | noise)."),
    ] = "none",
) -> None:
    """Check each data-pipeline subsystem alone, then their interfaces, then a short stress run; print
    where the time goes and which subsystem is the bottleneck. Exit status 1 if a check fails."""
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
