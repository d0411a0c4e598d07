"""``arl doctor``'s checks of the interfaces between subsystems: a worker's Rollout against the replay
(fields, dtypes, shapes, action scale, the data-version metadata, a round trip) and the latency from an
observation in a worker to that transition's first sample by the learner, in its parts.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime
from types import SimpleNamespace

from arl_cli.doctor_subsystems import Check, measure

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
            f"field 'act' leaves [-1, 1] (max |a| = {np.abs(act).max():.3g}): "
            "actions must be in network scale"
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
    """A Rollout's fields against the replay's: names, dtypes, shapes, action scale, metadata, and a round
    trip."""
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
        f"replay add {parts['replay_add_ms']:.2f}, "
        f"first uniform sample at {replay_size:,} rows {parts['first_sample_ms']:.0f}"
        + ("" if transfer_s is not None else "; worker transfer not measured: no worker pool")
        + ")"
    )
    status = "pass" if total < 1000 else "warn"
    if status == "warn":
        msg += ": fresh data waits long; prioritised replay with freshness samples it sooner"
    if not math.isfinite(total):
        status = "fail"
    return Check("latency", "interface", status, msg, details={**parts, "total_ms": total})
