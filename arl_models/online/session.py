"""What a fine-tuning loop works on: the learner and its typed parts (the mixed-batch update, the
checkpoint, the evaluation), the online replay's writer, the counters and the run's record; set up
fresh (warm start, first evaluation) or from an interrupted run's train state."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arl_models.algos.calql import CalQL
from arl_models.checkpoint import (
    BEST,
    CONFIG,
    load_train_state,
    record_references,
    save_checkpoint,
    save_policy,
    saved_record,
)
from arl_models.envs.registry import TaskSpec
from arl_models.evaluate import Evaluator
from arl_models.metrics import FanoutSink, JsonlSink, MetricSink
from arl_models.online.config import FinetuneConfig
from arl_models.online.rounds import OnlineState, steer
from arl_models.online.sampling import offline_buffer, sample_mixed, sample_mixed_prioritized
from arl_models.online.start import Origin, warm_start
from arl_models.online.writer import OnlineWriter
from arl_models.preprocess import ObsStats, Preprocessor, make_preprocessor
from arl_models.prioritized import PrioritizedReplay
from arl_models.replay import ActionScaler, ReplayBuffer
from arl_models.train import check_finite


@dataclass
class MixedUpdate:
    """One learner update on a batch of ``offline_ratio`` offline rows and the rest online (the
    observations through ``preprocess`` if set); online rows by priority with a prioritised replay,
    whose priorities the update's TD errors then set."""

    algo: CalQL
    offline: ReplayBuffer
    offline_mc: torch.Tensor
    writer: OnlineWriter
    preprocess: Preprocessor | None
    offline_ratio: float

    def __call__(self) -> dict[str, float] | None:
        """The update's metrics, or None while the online replay is shorter than a batch's online part."""
        algo, online, online_mc, ratio = self.algo, self.writer.online, self.writer.mc, self.offline_ratio
        batch_size = algo.cfg.batch_size
        n_online = batch_size - int(round(ratio * batch_size))
        if len(online) < max(n_online, 1):
            return None
        if not isinstance(online, PrioritizedReplay):
            batch = sample_mixed(self.offline, online, batch_size, ratio, self.offline_mc, online_mc)
            m = algo.update(batch if self.preprocess is None else self.preprocess(batch))
            check_finite(m, algo.step, "finetune")
            return m
        batch, idx, w = sample_mixed_prioritized(
            self.offline, online, batch_size, ratio, self.offline_mc, online_mc
        )
        m = algo.update(batch if self.preprocess is None else self.preprocess(batch), weights=w)
        check_finite(m, algo.step, "finetune")
        assert algo.td_error is not None
        online.update_priorities(idx, algo.td_error[batch_size - len(idx) :])
        return m | {"is_weight_mean": float(w[batch_size - len(idx) :].mean()) if len(idx) else 1.0}


@dataclass
class Checkpointer:
    """Saves everything needed to continue exactly: the learner, the online replay with its rows'
    Monte-Carlo returns, and the counters."""

    out: Path
    algo: CalQL
    writer: OnlineWriter
    state: OnlineState
    record: dict[str, Any]

    def __call__(self, metrics: dict[str, Any] | None = None) -> None:
        online = self.writer.online
        extra = online.state_dict() | {
            "online.mc": self.writer.mc[: online.size].clone(),
            "online.counters": self.state.tensor(),
        }
        save_checkpoint(self.out, self.algo, self.record, metrics, extra_tensors=extra)


@dataclass
class Session:
    """What a fine-tuning loop works on, set up by :func:`open_session` (shared by the sync and async
    loops)."""

    algo: CalQL
    cfg: FinetuneConfig
    spec: TaskSpec
    budget: float
    scaler: ActionScaler
    writer: OnlineWriter
    """The online replay (``writer.online``) and its rows' Monte-Carlo returns (``writer.mc``)."""
    state: OnlineState
    record: dict[str, Any]
    out: Path
    sinks: MetricSink
    update: MixedUpdate
    """One learner update on a mixed batch (None while the online replay is short)."""
    save: Checkpointer
    """Checkpoint everything needed to continue."""
    run_eval: Evaluator
    """The learner's deterministic evaluation on the task, against the run's budget and references."""
    progress: bool

    def report_round(self, latest: dict[str, float]) -> None:
        """Evaluate when due, update the multiplier, log the round's metrics and print a progress line."""
        cfg, state = self.cfg, self.state
        if cfg.eval_every and state.rounds % cfg.eval_every == 0 and cfg.eval_episodes > 0:
            latest |= self.run_eval()
            self.keep_best(latest)
        steer(self.algo, cfg, latest, self.budget)
        self.sinks.log(latest, state.env_steps)
        if self.progress:
            ev = ""
            if "eval/return" in latest:
                ev = f" eval {latest['eval/return']:.1f}/{latest['eval/cost']:.1f}"
            print(
                f"[finetune] steps {state.env_steps} return {latest['online/episode_return']:.1f} "
                f"cost {latest['online/episode_cost']:.1f} cum {state.cumulative_cost:.0f} "
                f"lambda {self.algo.lagrangian.value:.3f}" + ev,
                flush=True,
            )

    def end_round(self, rounds_here: int, stop_after_rounds: int | None) -> bool:
        """Checkpoint after a round when due (every ``save_every`` rounds); True, after a checkpoint, when
        this call has run its ``stop_after_rounds`` rounds and is to stop here."""
        if stop_after_rounds is not None and rounds_here >= stop_after_rounds:
            self.save()
            return True
        if self.state.rounds % self.cfg.save_every == 0:
            self.save()
        return False

    def keep_best(self, ev: dict[str, float]) -> None:
        """Write the current policy to ``OUT/best`` if ``ev`` (an evaluation of it) is within the budget
        and beats the best so far (see ``FinetuneConfig.keep_best``)."""
        if not self.cfg.keep_best or "eval/return" not in ev or ev["eval/cost"] > self.budget:
            return
        best = best_selection(self.out)
        if best is not None and ev["eval/return"] <= best["return"]:
            return
        selected = {
            "step": self.state.env_steps,
            "return": ev["eval/return"],
            "cost": ev["eval/cost"],
            "episodes": self.cfg.eval_episodes,
        }
        save_policy(self.out / BEST, self.algo.actor, self.record | {"selected": selected})

    def finish(self, latest: dict[str, float], t0: float) -> dict[str, float]:
        """The final record (a last evaluation if the last round had none), saved with the checkpoint."""
        state = self.state
        final = {**latest}
        if self.cfg.eval_episodes > 0 and "eval/return" not in latest:
            ev = self.run_eval()
            # the curve (and whoever reads the last evaluations) ends with it
            self.sinks.log(ev, state.env_steps)
            final |= ev
            self.keep_best(final)
        final |= {f"best/{k}": float(v) for k, v in (best_selection(self.out) or {}).items()}
        initial = self.record.get("initial_eval", {})
        final |= {f"online/initial_{k.split('/')[-1]}": v for k, v in initial.items()}
        final |= {
            "online/env_steps_total": float(state.env_steps),
            "online/cumulative_cost": state.cumulative_cost,
            "online/violating_episodes": float(state.violations),
            "online/episodes": float(state.episodes),
            "online/updates": float(state.updates),
            "wall_time_s": time.perf_counter() - t0,
        }
        self.save(final)
        return final


def best_selection(out: str | Path) -> dict[str, float] | None:
    """What ``OUT/best`` was selected on (step, return, cost, episodes), or None if there is none yet."""
    path = Path(out) / BEST / CONFIG
    return json.loads(path.read_text())["selected"] if path.is_file() else None


def open_session(
    origin: Origin,
    cfg: FinetuneConfig,
    out: Path,
    resuming: bool,
    sink: MetricSink | None,
    progress: bool,
) -> Session:
    """The session of a run in ``out``: the offline data as a replay, an empty online replay, and the
    learner warm-started and evaluated, or, ``resuming``, all of them as the interrupted run left them.
    Logs past the state resumed from are cut; a fresh start clears the folder's logs and ``best/``."""
    algo, env = origin.algo, origin.env
    scaler = ActionScaler.of(env["action_low"], env["action_high"])
    offline, offline_mc = offline_buffer(origin.data, scaler, algo.cfg.gamma)
    online: ReplayBuffer | PrioritizedReplay = (
        ReplayBuffer(cfg.online_capacity, env["obs_dim"], env["action_dim"])
        if cfg.prioritized is None
        else PrioritizedReplay(cfg.online_capacity, env["obs_dim"], env["action_dim"], cfg.prioritized)
    )
    writer = OnlineWriter(online, torch.zeros(cfg.online_capacity), algo.cfg.gamma)
    obs_stats = ObsStats.of(offline.data["obs"][: len(offline)])
    preprocess = make_preprocessor(cfg.preprocess, cfg.preprocess_scale, obs_stats)
    state = OnlineState()
    refs = record_references(origin.run_record(cfg))
    act = lambda o: scaler.unnormalize(algo.act(o))  # noqa: E731
    run_eval = Evaluator(act, origin.spec, cfg.eval_episodes, refs, cost_budget=origin.budget)
    record = _resume(out, algo, writer, state) if resuming else _begin(origin, cfg, out, run_eval)
    _truncate(out / "metrics.jsonl", "step", state.env_steps)
    _truncate(out / "episodes.jsonl", "episode", state.episodes)
    sinks = FanoutSink(JsonlSink(out / "metrics.jsonl"), sink)
    update = MixedUpdate(algo, offline, offline_mc, writer, preprocess, cfg.offline_ratio)
    save = Checkpointer(out, algo, writer, state, record)
    session = Session(
        algo,
        cfg,
        origin.spec,
        origin.budget,
        scaler,
        writer,
        state,
        record,
        out,
        sinks,
        update,
        save,
        run_eval,
        progress,
    )
    if not resuming:
        session.keep_best(record["initial_eval"])
    return session


def _resume(out: Path, algo: CalQL, writer: OnlineWriter, state: OnlineState) -> dict[str, Any]:
    """Load the interrupted run's train state into the learner, the online replay and the counters;
    returns its record."""
    record = saved_record(out)
    left = load_train_state(out, algo)
    writer.online.load_state_dict(left)
    writer.mc[: writer.online.size] = left["online.mc"]
    state.load(left["online.counters"])
    return record


def _begin(origin: Origin, cfg: FinetuneConfig, out: Path, run_eval: Evaluator) -> dict[str, Any]:
    """Warm-start the learner, evaluate it, and clear what an earlier run left in ``out``; returns the
    new run's record."""
    carried = warm_start(origin.algo, origin.from_dir, origin.budget)
    initial = run_eval() if cfg.eval_episodes > 0 else {}
    chain = {k: origin.record[k] for k in ("continual",) if k in origin.record}
    record = origin.run_record(cfg, {"start_multiplier": carried, "initial_eval": initial, **chain})
    for name in ("metrics.jsonl", "episodes.jsonl"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / BEST, ignore_errors=True)
    return record


def _truncate(path: Path, key: str, last: int) -> None:
    if path.is_file():
        keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)[key] <= last]
        path.write_text("".join(f"{ln}\n" for ln in keep))
