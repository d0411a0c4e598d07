"""Stage 3: constrained online fine-tuning from the CQL checkpoint.

SAC (or CQL / Cal-QL critics, see ``algos/calql.py``) warm-started from the offline checkpoint:
actor, reward critics, cost critic and optimiser moments. Offline, the multiplier weighed ``Q_c`` at the
data's episode starts; here it starts at rest and measures the undiscounted cost of whole episodes
relative to the task's episode budget (``cost / budget``, held to ``1 - cost_margin``) with the configured
PID gains (Stooke et al. 2020): the training episodes' mean cost, or with ``cost_signal="evaluation"``
that of each round's deterministic evaluation, the policy a run hands over. Relative, so that one set of
gains fits budgets of 10 and 25 and episode costs of 50 or 300: an episode at twice the budget is an error
of 1.

Each batch is ``round(offline_ratio * B)`` transitions of the offline dataset plus the rest from the
online replay (Ball et al. 2023, "RLPD": symmetric sampling). Work is organised in rounds of whole
episodes: ``episodes_per_round`` episodes are collected while ``utd`` gradient updates are done per
environment step, then the policy is evaluated (every ``eval_every`` rounds), the multiplier updated,
metrics logged and a checkpoint written. Each step's transitions enter the online replay at once
(:class:`OnlineWriter`), so the next update can draw them; Cal-QL's Monte-Carlo return of a row is filled
in when its episode ends. A checkpoint after a round
holds everything needed to continue (weights, optimisers, multiplier, RNG, the online replay and the
counters), so an interrupted run resumes from its last round.

With ``preprocess`` set, every training batch's observations go through a batched transform on the
learner's device (``preprocess.py``: state augmentations, or a registered one) between sampling and the
update; the environments, the workers and the replays only ever see raw observations.

Every episode is recorded in ``OUT/episodes.jsonl`` (return, cost, cumulative cost, multiplier);
``OUT/metrics.jsonl`` has one line per round under ``online/...`` and ``eval/...``.

``OUT/best/`` holds the best policy the run went through: the one whose evaluation had the highest return
at a mean cost within the budget, the start's own evaluation being the first candidate (``keep_best``).
Online RL does not improve monotonically (a Hopper that stands in one evaluation may fall in the next), and
the last weights are what a resumed run continues from, not necessarily what should be deployed. What is
served, evaluated by the pipeline and gated is ``best/`` (``checkpoint.handed_over``); what continual
learning continues is the last weights with their critics and ``train_state/``.

The package: ``config`` (the settings), ``start`` (the learner from the offline checkpoint, its warm
start), ``sampling`` (mixed batches), ``writer`` (the online replay's writer), ``rounds`` (counters,
rounds and the multiplier's update), ``session`` (what a loop works on), and two loops over the same
session: ``sync_loop`` (rounds over a vector environment, bit-exact on resume) and ``async_loop``
(environment workers collecting while the learner updates).
"""

from __future__ import annotations

from pathlib import Path

from arl_models.algos.calql import Regularizer
from arl_models.checkpoint import check_resumable, clear_train_state, finished, has_train_state
from arl_models.locks import holding_out
from arl_models.metrics import MetricSink
from arl_models.online.async_loop import run_async, stress_run
from arl_models.online.config import FinetuneConfig, WorkerConfig
from arl_models.online.rounds import OnlineState, Round, after_round, measured_cost, steer
from arl_models.online.sampling import offline_buffer, sample_mixed, sample_mixed_prioritized
from arl_models.online.session import Session, best_selection, open_session
from arl_models.online.start import SAME_PARTS, Origin, build_algo, env_record, resolve_origin, warm_start
from arl_models.online.sync_loop import make_envs, run_sync
from arl_models.online.writer import OnlineWriter

__all__ = [
    "SAME_PARTS",
    "FinetuneConfig",
    "OnlineState",
    "OnlineWriter",
    "Origin",
    "Round",
    "Session",
    "WorkerConfig",
    "after_round",
    "best_selection",
    "build_algo",
    "env_record",
    "finetune",
    "make_envs",
    "measured_cost",
    "offline_buffer",
    "open_session",
    "resolve_origin",
    "run_async",
    "run_sync",
    "sample_mixed",
    "sample_mixed_prioritized",
    "steer",
    "stress_run",
    "warm_start",
]


@holding_out
def finetune(
    from_dir: str | Path,
    out: str | Path,
    *,
    task: str | None = None,
    data: str | Path | None = None,
    config: FinetuneConfig = FinetuneConfig(),  # noqa: B008 (frozen)
    regularizer: Regularizer | None = None,
    sink: MetricSink | None = None,
    progress: bool = True,
    stop_after_rounds: int | None = None,
    restart: bool = False,
) -> dict[str, float]:
    """Fine-tune the checkpoint in ``from_dir`` online; writes a checkpoint to ``out`` and returns the
    final metrics record. ``out`` holding a ``train_state`` of the same settings and data resumes it (one of
    others is refused; ``restart`` discards it); one that already finished ``config.steps`` is left as it
    is and its record returned. ``stop_after_rounds`` ends the call early (checkpoint included), as an
    interruption would. A non-finite or runaway loss stops the stage (:class:`TrainingDiverged`).
    """
    cfg, out = config, Path(out)
    _check_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    if restart:
        clear_train_state(out)
    resuming = has_train_state(out)
    origin = resolve_origin(from_dir, task, data, cfg, regularizer)
    if resuming:
        check_resumable(out, origin.run_record(cfg))
        done = finished(out, cfg.steps)
        if done is not None:
            if progress:
                print(
                    f"[finetune] {out} finished {cfg.steps} steps already: its record is returned, "
                    "nothing is trained",
                    flush=True,
                )
            return done
    session = open_session(origin, cfg, out, resuming, sink, progress)
    if cfg.pipeline == "async":
        return run_async(session, stop_after_rounds)
    return run_sync(session, stop_after_rounds)


def _check_config(cfg: FinetuneConfig) -> None:
    if cfg.pipeline not in ("sync", "async"):
        raise ValueError(f"pipeline must be 'sync' or 'async', got {cfg.pipeline!r}")
    if not 0.0 <= cfg.cost_margin < 1.0:
        raise ValueError(f"cost_margin is a share of the budget in [0, 1), got {cfg.cost_margin}")
    if cfg.cost_signal not in ("evaluation", "episodes"):
        raise ValueError(f"cost_signal must be 'evaluation' or 'episodes', got {cfg.cost_signal!r}")
