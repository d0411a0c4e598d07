"""The asynchronous loop of stage 3: workers collect while the learner updates.

``finetune(..., config=FinetuneConfig(pipeline="async", workers=WorkerConfig(...)))`` sets up the same
session as the synchronous loop (warm start, offline data, online replay, multiplier, checkpoints; see
``session.py``) and then runs this loop instead of rounds over a vector environment:

* A pool of environment workers (``arl_models.workers``: processes, or Ray actors) steps the task with
  the newest policy it has received; the learner broadcasts the actor every ``sync_every`` updates.
* The learner polls the pool without waiting while it has work, puts every chunk that arrived into
  the online replay in one batched write (Monte-Carlo returns are filled in when an episode ends, for
  Cal-QL), and does ``utd`` updates per transition that arrived. It waits (briefly) only when it is
  ahead of the data, and that waiting is what ``pipeline/learner_utilization`` reports. When it owes
  more than one chunk per worker of updates it stops reading, and the workers wait: the UTD holds,
  as in the synchronous loop, and the gain is the overlap of collection with learning.
* Every ``episodes_per_round`` finished episodes (default: one per environment) make a *round*, as in
  the synchronous loop: evaluations follow the same ``eval_every``, the multiplier is updated from the
  same measured cost, metrics are logged and checkpoints follow ``save_every``.
* Every ``tune_interval_s``, and at the end of a round that had no reading yet, the rates of the
  interval (environment steps, inference calls, transitions produced and consumed, learner
  utilisation) are logged under ``pipeline/...``, so every round's row carries them; with
  ``tune=True`` the :class:`~arl_models.rate_tuner.RateTuner` moves the number of workers and the UTD.

A checkpoint holds the same state as the synchronous loop's, so an interrupted run resumes from its
last round; arrival order across workers is not reproducible, so the async loop is not bit-exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from arl_models.algos.calql import CalQL, CalQLConfig
from arl_models.envs.registry import env_dims, get_task
from arl_models.online.rounds import Round, after_round
from arl_models.online.session import Session
from arl_models.rate_tuner import RateDecision, RateReading, RateTuner
from arl_models.replay import ReplayBuffer
from arl_models.workers import Chunk, WorkerPool, WorkerSpec, flatten, make_pool

MAX_UPDATES_PER_POLL = 16
"""Updates between two polls of the pool, so arriving data is taken in promptly."""


@dataclass
class _Counters:
    """Counts since the last rate reading."""

    t0: float = field(default_factory=time.perf_counter)
    env_steps: int = 0
    inference_calls: int = 0
    updates: int = 0
    update_time_s: float = 0.0
    lag: float = 0.0
    chunks: int = 0


def _store(s: Session, chunks: list[Chunk]) -> None:
    """A poll's chunks into the online replay in one write; each environment's rows extend its episode."""
    keys = ("obs", "act", "rew", "cost", "next_obs", "term")
    cat = {k: np.concatenate([getattr(c, k) for c in chunks]) for k in keys}
    numbers = s.writer.add(
        {
            "obs": cat["obs"],
            "act": cat["act"],
            "rew": cat["rew"],
            "cost": cat["cost"],
            "next_obs": cat["next_obs"],
            "done": cat["term"],
        }
    )
    start = 0
    for c in chunks:
        for e in range(s.cfg.workers.envs_per_worker):
            rows = np.flatnonzero(c.env_index == e)
            if rows.size:
                key = (c.worker, c.incarnation, e)
                s.writer.extend(key, numbers[start + rows], c.rew[rows], c.episode_end[rows])
        start += len(c)


def worker_spec(session: Session) -> WorkerSpec:
    """What each worker runs: the session's task and actor shape, seeded from (seed, round)."""
    algo, env, w = session.algo, session.record["env"], session.cfg.workers
    return WorkerSpec(
        task=session.spec.key,
        obs_dim=env["obs_dim"],
        act_dim=env["action_dim"],
        hidden=tuple(algo.cfg.hidden),
        action_low=tuple(float(x) for x in env["action_low"]),
        action_high=tuple(float(x) for x in env["action_high"]),
        # a resumed run continues with fresh streams: the interrupted workers' episodes are not replayed
        seed=session.cfg.seed * 1_000_003 + session.state.rounds,
        chunk_steps=w.chunk_steps,
        envs_per_worker=w.envs_per_worker,
        context_dim=algo.cfg.context_dim,
    )


def run_async(s: Session, stop_after_rounds: int | None = None) -> dict[str, float]:
    """Collect with the worker pool and update until ``cfg.steps`` environment steps (or
    ``stop_after_rounds`` rounds of this call, with a checkpoint); returns the final record, or the last
    round's metrics when stopped early."""
    cfg, w, algo, state = s.cfg, s.cfg.workers, s.algo, s.state
    tuner = RateTuner(w.targets) if w.tune else None
    utd = cfg.utd
    per_round = cfg.episodes_per_round or w.num_workers * w.envs_per_worker
    t0, start_steps = time.perf_counter(), state.env_steps
    latest: dict[str, float] = {}
    rounds_here, version, since_sync, owed, received = 0, 0, 0, 0.0, 0
    counters, flowing, read_this_round = _Counters(), False, False
    last_rates: dict[str, float] = {}
    rnd = Round(algo, cfg, s.scaler, s.writer)
    pool: WorkerPool = make_pool(worker_spec(s), w.num_workers, w.backend, w.address)
    with pool:
        pool.broadcast(flatten(algo.actor.state_dict()), version)
        while state.env_steps < cfg.steps:
            # backpressure: at most one chunk per worker of updates owed, so the UTD holds; unread, the
            # workers' pipes fill (processes) or their next call is not submitted (Ray), and they wait
            backlog = utd * w.chunk_steps * w.envs_per_worker * pool.num_workers
            chunks = pool.poll(timeout=0.0 if owed >= 1.0 else 0.01) if owed < backlog else []
            if chunks and not flowing:  # rates start with the data: worker start-up is not a reading
                counters, flowing = _Counters(), True
            if chunks:
                _store(s, chunks)
                for c in chunks:
                    rnd.episodes += c.episodes
                    owed += utd * len(c)
                    received += len(c)
                    counters.env_steps += c.env_steps
                    counters.inference_calls += c.inference_calls
                    counters.lag += version - c.policy_version
                    counters.chunks += 1
            done = 0
            t_up = time.perf_counter()
            while owed >= 1.0 and done < MAX_UPDATES_PER_POLL:
                m = s.update()
                if m is None:
                    owed = 0.0
                    break
                owed -= 1.0
                done += 1
                rnd.add(m)
                since_sync += 1
                if since_sync >= w.sync_every:
                    version += 1
                    pool.broadcast(flatten(algo.actor.state_dict()), version)
                    since_sync = 0
            counters.updates += done
            counters.update_time_s += time.perf_counter() - t_up
            round_due = len(rnd.episodes) >= per_round and not read_this_round
            interval_over = time.perf_counter() - counters.t0 >= w.tune_interval_s
            if flowing and counters.chunks and (interval_over or round_due):
                last_rates, utd = _read_rates(pool, counters, utd, tuner)
                s.sinks.log(last_rates, state.env_steps)
                counters, read_this_round = _Counters(), True
            while len(rnd.episodes) >= per_round and state.env_steps < cfg.steps:
                # a round is exactly `per_round` episodes, as in the sync loop; the rest open the next
                rnd.episodes, extra = rnd.episodes[:per_round], rnd.episodes[per_round:]
                latest = after_round(algo, state, rnd, s.budget, s.out) | last_rates
                elapsed = max(time.perf_counter() - t0, 1e-9)
                latest["online/steps_per_s"] = (state.env_steps - start_steps) / elapsed
                latest["pipeline/replaced_workers"] = float(pool.replaced)
                # finished episodes' transitions and the open ones'
                latest["pipeline/transitions_received"] = float(received)
                s.report_round(latest)
                rnd = Round(algo, cfg, s.scaler, s.writer)
                rnd.episodes, read_this_round = extra, False
                rounds_here += 1
                if s.end_round(rounds_here, stop_after_rounds):
                    return latest
    return s.finish(latest, t0)


def _read_rates(
    pool: WorkerPool,
    c: _Counters,
    utd: float,
    tuner: RateTuner | None,
) -> tuple[dict[str, float], float]:
    """The interval's reading as metrics; with a tuner, its decision applied to the pool and the UTD."""
    interval = time.perf_counter() - c.t0
    envs_per_worker = pool.spec.envs_per_worker
    reading = RateReading.from_counts(
        interval_s=interval,
        env_steps=c.env_steps,
        inference_calls=c.inference_calls,
        transitions=c.env_steps,
        updates=c.updates,
        update_time_s=c.update_time_s,
        num_workers=pool.num_workers,
        utd=utd,
        envs_per_worker=envs_per_worker,
    )
    metrics = {"pipeline/policy_lag": c.lag / max(c.chunks, 1), "pipeline/utd": utd}
    if tuner is None:
        hold = RateDecision(
            num_workers=pool.num_workers,
            utd=utd,
            bottleneck="balanced",
            reason="not tuned",
            envs_per_worker=envs_per_worker,
        )
        return metrics | RateTuner().metrics(reading, hold), utd
    decision = tuner.observe(reading)
    if decision.num_workers != pool.num_workers:
        pool.resize(decision.num_workers)
    return metrics | tuner.metrics(reading, decision), decision.utd


def stress_run(
    task: str,
    seconds: float = 3.0,
    num_workers: int = 2,
    backend: str = "process",
) -> RateReading:
    """``seconds`` of the asynchronous data path on ``task`` with a fresh CQL-shaped learner and no
    dataset: workers collect, the learner does SAC updates from the online replay at UTD 1. Returns
    the rates of the last second (``arl doctor``'s stress run)."""
    spec_t = get_task(task)
    obs_dim, act_dim, low, high, _ = env_dims(spec_t)
    algo = CalQL(obs_dim, act_dim, CalQLConfig(conservative="none", batch_size=256))
    spec = WorkerSpec(
        task=spec_t.key,
        obs_dim=obs_dim,
        act_dim=act_dim,
        hidden=tuple(algo.cfg.hidden),
        action_low=tuple(low.tolist()),
        action_high=tuple(high.tolist()),
        chunk_steps=50,
    )
    replay = ReplayBuffer(100_000, obs_dim, act_dim)
    counters, owed, reading = _Counters(), 0.0, None
    end = time.perf_counter() + seconds
    with make_pool(spec, num_workers, backend) as pool:
        pool.broadcast(flatten(algo.actor.state_dict()), 0)
        first = pool.poll(timeout=120.0)  # worker start-up is not part of the reading
        while not first:
            first = pool.poll(timeout=1.0)
        counters, end = _Counters(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            for c in pool.poll(timeout=0.0 if owed >= 1 else 0.01):
                replay.add(obs=c.obs, act=c.act, rew=c.rew, cost=c.cost, next_obs=c.next_obs, done=c.term)
                owed += len(c)
                counters.env_steps += c.env_steps
                counters.inference_calls += c.inference_calls
            t = time.perf_counter()
            n = 0
            while owed >= 1 and n < MAX_UPDATES_PER_POLL and len(replay) >= 256:
                idx = torch.randint(0, len(replay), (256,))
                algo.update(replay.gather(idx))
                owed -= 1
                n += 1
            counters.updates += n
            counters.update_time_s += time.perf_counter() - t
        reading = RateReading.from_counts(
            interval_s=time.perf_counter() - counters.t0,
            env_steps=counters.env_steps,
            inference_calls=counters.inference_calls,
            transitions=counters.env_steps,
            updates=counters.updates,
            update_time_s=counters.update_time_s,
            num_workers=num_workers,
            utd=1.0,
        )
    return reading
