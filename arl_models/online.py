"""Stage 3: constrained online fine-tuning from the CQL checkpoint.

SAC (or CQL / Cal-QL critics, see ``algos/calql.py``) warm-started from the offline checkpoint:
actor, reward critics, cost critic, optimiser moments and the Lagrange multiplier's state. Offline,
the multiplier was driven by ``Q_c``; here the measured signal switches to the undiscounted cost of
finished episodes relative to the task's episode budget (``cost / budget``, held to ``1 - cost_margin``), with the
configured PID gains, and the multiplier's value and integral carry over, so the policy gets no free
burst of violations at the switch (Stooke et al. 2020). Relative, so that one set of gains fits budgets
of 12 and 25 and episode costs of 50 or 300: an episode at twice the budget is an error of 1.

Each batch is ``round(offline_ratio * B)`` transitions of the offline dataset plus the rest from the
online replay (Ball et al. 2023, "RLPD": symmetric sampling). Episodes run in worker processes
(``gymnasium.vector.AsyncVectorEnv``) with one batched policy call per step. Work is organised in
rounds of whole episodes: a round resets every worker with seeds derived from (seed, round), collects
``episodes_per_round`` episodes while doing ``utd`` gradient updates per environment step, then
updates the multiplier, logs and checkpoints. Each step's transitions enter the online replay at once
(:class:`OnlineWriter`), so the next update can draw them; Cal-QL's Monte-Carlo return of a row is
filled in when its episode ends. A checkpoint after a round holds everything needed to
continue exactly (weights, optimisers, multiplier, RNG, the online replay and the counters), so an
interrupted run resumes to the same weights.

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
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from arl_models.algos.calql import CalQL, CalQLConfig, MCBatch, Regularizer, mc_returns
from arl_models.checkpoint import (
    BEST,
    CONFIG,
    check_resumable,
    clear_train_state,
    config_from_dict,
    finished,
    has_train_state,
    load_shared_networks,
    load_train_state,
    read_config,
    save_checkpoint,
    save_policy,
)
from arl_models.data.dataset import content_digest, read_dataset, read_info
from arl_models.envs.registry import TaskSpec, get_task, make_env
from arl_models.evaluate import EVAL_SEED, evaluate
from arl_models.lagrange import PIDConfig, PIDLagrangian
from arl_models.locks import holding_out
from arl_models.metrics import FanoutSink, JsonlSink, MetricSink
from arl_models.preprocess import ObsStats, make_preprocessor
from arl_models.prioritized import PERConfig, PrioritizedReplay
from arl_models.rate_tuner import RateTargets
from arl_models.replay import ActionScaler, ReplayBuffer
from arl_models.train import check_finite


@dataclass(frozen=True)
class WorkerConfig:
    """Environment workers of the asynchronous pipeline (``arl_models.workers``)."""

    backend: str = "process"
    """``process`` (spawn processes on this machine) or ``ray`` (Ray actors; the optional extra)."""
    address: str | None = None
    """Ray cluster to attach to (``ray://head:10001``, a KubeRay head included); None: local Ray."""
    num_workers: int = 2
    envs_per_worker: int = 1
    chunk_steps: int = 50
    """Steps per environment in one chunk a worker sends."""
    sync_every: int = 50
    """Learner updates between weight broadcasts (workers act with a policy at most this far behind)."""
    tune: bool = False
    """Let the rate tuner move the number of workers and the UTD towards its targets."""
    tune_interval_s: float = 2.0
    targets: RateTargets = RateTargets()


@dataclass(frozen=True)
class FinetuneConfig:
    seed: int = 0
    steps: int = 20_000
    """Environment steps of fine-tuning, all workers together (the run stops at the first round end past it)."""
    num_envs: int = 4
    """Parallel environments (worker processes with ``vector="async"``)."""
    episodes_per_round: int | None = None
    """Episodes collected per round (default ``num_envs``); multiplier updates and checkpoints follow rounds."""
    vector: str = "async"
    """``async`` (worker processes) or ``sync`` (in-process, for tests and debugging)."""
    offline_ratio: float = 0.5
    """Share of each batch drawn from the offline data; exactly ``round(ratio * batch_size)`` rows."""
    batch_size: int | None = None
    """Batch size of updates (default: the offline stage's)."""
    utd: float = 1.0
    """Gradient updates per environment step."""
    conservative: str = "none"
    """Critic regime online: ``none`` (SAC), ``cql`` or ``calql`` (CQL term bounded by MC returns)."""
    conservative_weight: float | None = None
    """Weight of the conservative term online (default: the offline stage's)."""
    constrained: bool = True
    """Penalise the actor with the episode-cost multiplier; ``False`` is the unconstrained baseline."""
    cost_budget: float | None = None
    """Budget on the undiscounted cost of one episode (default: the task's, 25 for the velocity tasks)."""
    cost_margin: float = 0.6
    """Share of the budget held in reserve: the multiplier holds the training episodes' mean cost to
    ``budget * (1 - cost_margin)``, so that the policy's cost, which the controller only holds on
    average over noisy rounds of a few episodes of sampled actions, stays under the budget itself. On
    safe-pendulum the deployed (mean-action) policy pays 2.7-4.8 above the setpoint; at 0.3 it ended on
    the budget (2 of 5 seeds under it), at 0.5 under it on 5 of 5 while episodes were stored at their
    end; with each step stored at once the policy learns faster and 0.5 held 4 of 5, 0.6 held 5 of 5
    (benchmarks/README.md, "The loop stores each step at once")."""
    pid: PIDConfig = PIDConfig(kp=1.0, ki=0.5, kd=0.0)
    """Gains of the multiplier on the relative violation ``mean episode cost / budget - 1`` (per round);
    its state carries over from the offline stage."""
    online_capacity: int = 1_000_000
    prioritized: PERConfig | None = None
    """Sample the online part of each batch by priority and freshness (``prioritized.py``): its rows'
    critic TD losses are weighted by their IS weights (offline rows weigh 1) and their priorities set
    from the update's TD errors; ``None`` samples it uniformly."""
    preprocess: str = "none"
    """Transform of every training batch's observations on the learner's device, never on the acting
    path (``preprocess.py``): ``none``, ``amplitude`` or ``noise`` (state augmentations), or a registered name."""
    preprocess_scale: float = 0.1
    """Strength of ``preprocess``: the amplitude's half-width, or the noise's std in data stds."""
    pipeline: str = "sync"
    """``sync``: rounds over a vector environment, collection and updates in turn (this module).
    ``async``: a pool of environment workers collects while the learner updates (``online_async.py``)."""
    workers: WorkerConfig = WorkerConfig()
    """The worker pool of ``pipeline="async"`` (ignored by ``sync``)."""
    eval_every: int = 5
    """Rounds between deterministic evaluations (0: only at the start and the end)."""
    eval_episodes: int = 10
    keep_best: bool = True
    """Write ``OUT/best/`` (a policy, loadable by ``load_policy``) whenever an evaluation within the
    budget beats every earlier one, the start's included; its config records the selection under ``selected``."""
    save_every: int = 1
    """Rounds between checkpoints."""


@dataclass
class OnlineState:
    """Counters that a checkpoint carries besides the algorithm and the replay."""

    env_steps: int = 0
    episodes: int = 0
    rounds: int = 0
    updates: int = 0
    cumulative_cost: float = 0.0
    violations: int = 0
    returns: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def tensor(self) -> torch.Tensor:
        return torch.tensor([self.env_steps, self.episodes, self.rounds, self.updates, self.cumulative_cost, self.violations], dtype=torch.float64)

    def load(self, t: torch.Tensor) -> None:
        v = t.tolist()
        self.env_steps, self.episodes, self.rounds, self.updates = (int(x) for x in v[:4])
        self.cumulative_cost, self.violations = float(v[4]), int(v[5])


def sample_mixed(
    offline: ReplayBuffer, online: ReplayBuffer | PrioritizedReplay, batch_size: int, offline_ratio: float,
    offline_mc: torch.Tensor | None = None, online_mc: torch.Tensor | None = None,
) -> MCBatch:
    """Exactly ``round(ratio * B)`` offline rows followed by ``B - round(ratio * B)`` online rows."""
    return _draw_mixed(offline, online, batch_size, offline_ratio, offline_mc, online_mc)[0]


def sample_mixed_prioritized(
    offline: ReplayBuffer, online: PrioritizedReplay, batch_size: int, offline_ratio: float,
    offline_mc: torch.Tensor | None = None, online_mc: torch.Tensor | None = None,
) -> tuple[MCBatch, torch.Tensor, torch.Tensor]:
    """As :func:`sample_mixed` with the online rows drawn by priority: ``(batch, idx, weights)``, where
    ``idx`` are the slots of the batch's last ``len(idx)`` rows and ``weights`` ``(B,)`` is 1 on the
    offline rows and the IS weight on the online ones."""
    batch, per = _draw_mixed(offline, online, batch_size, offline_ratio, offline_mc, online_mc)
    idx, w_on = per if per is not None else (torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    weights = torch.cat([torch.ones(batch_size - len(idx), device=w_on.device), w_on])
    return batch, idx, weights


def _draw_mixed(
    offline: ReplayBuffer, online: ReplayBuffer | PrioritizedReplay, batch_size: int, offline_ratio: float,
    offline_mc: torch.Tensor | None, online_mc: torch.Tensor | None,
) -> tuple[MCBatch, tuple[torch.Tensor, torch.Tensor] | None]:
    n_off = int(round(offline_ratio * batch_size))
    parts, mcs = [], []
    per = None
    for buf, mc, n in ((offline, offline_mc, n_off), (online, online_mc, batch_size - n_off)):
        if n == 0:
            continue
        if isinstance(buf, PrioritizedReplay):
            idx, w = buf.sample_indices(n)
            per = (idx, w)
        else:
            idx = torch.randint(0, len(buf), (n,), device=buf.device)
        parts.append(buf.gather(idx))
        mcs.append(None if mc is None else mc.index_select(0, idx))
    fields = {k: torch.cat([getattr(p, k) for p in parts]) for k in ("obs", "act", "rew", "cost", "next_obs", "done")}
    mc_all = None if any(m is None for m in mcs) else torch.cat(mcs)  # type: ignore[arg-type]
    return MCBatch(**fields, mc_return=mc_all), per


def _offline_buffer(path: str | Path, scaler: ActionScaler, gamma: float) -> tuple[ReplayBuffer, torch.Tensor]:
    t, _ = read_dataset(path)
    buf = ReplayBuffer.from_transitions(t, scaler)
    ends = t.done | np.r_[t.episode_id[1:] != t.episode_id[:-1], True]
    return buf, torch.as_tensor(mc_returns(t.reward, ends, gamma))


SAME_PARTS = ("cql", "calql", "sac")
"""Offline algorithms whose checkpoint holds every part of the fine-tuning learner (optimisers included)."""


def build_algo(record: dict[str, Any], cfg: FinetuneConfig, regularizer: Regularizer | None = None) -> CalQL:
    """The fine-tuning algorithm from an offline checkpoint's record (any stage-2 algorithm, or an earlier
    fine-tuning); from TD3+BC or IQL it takes the settings the two share (sizes, rates, discount)."""
    given = record["config"]
    if record["algo"] not in SAME_PARTS:
        known = {f.name for f in fields(CalQLConfig)}
        given = {k: v for k, v in given.items() if k in known}
    base = config_from_dict(CalQLConfig, given)
    if cfg.constrained and not base.learn_cost:
        raise ValueError("constrained fine-tuning needs a checkpoint with a cost critic (learn_cost)")
    algo_cfg = replace(
        base, seed=cfg.seed, conservative=cfg.conservative, cost_q_limit=None, pid=cfg.pid, actor_warmup_steps=0,
        backup_entropy=True,  # online it is SAC: the soft (entropy-regularised) TD target
        external_multiplier=cfg.constrained, batch_size=cfg.batch_size or base.batch_size,
        conservative_weight=base.conservative_weight if cfg.conservative_weight is None else cfg.conservative_weight,
    )
    env = record["env"]
    return CalQL(env["obs_dim"], env["action_dim"], algo_cfg, regularizer=regularizer)


def warm_start(algo: CalQL, from_dir: str | Path, budget: float) -> dict[str, float]:
    """Load every weight, optimiser and the multiplier's state; the multiplier keeps value and integral.
    The unconstrained baseline never applies a multiplier, so its own stays at 0; the checkpoint's is returned.

    From TD3+BC or IQL, whose parts differ, the networks both have (actor, critics, cost critics, their
    targets) and the multiplier's state are loaded; the optimisers and the temperature start fresh."""
    if read_config(from_dir)["algo"] in SAME_PARTS:
        load_train_state(from_dir, algo)
    else:
        load_shared_networks(from_dir, algo)
    old = algo.lagrangian.state()
    if algo.cfg.external_multiplier:
        algo.lagrangian = PIDLagrangian(algo.cfg.pid)
        algo.lagrangian.load_state({**old, "prev": 1.0})  # the measured signal changes: no derivative kick
    else:
        algo.lagrangian = PIDLagrangian()
    algo.step = 0
    torch.manual_seed(algo.cfg.seed)
    return old


def _make_envs(spec: TaskSpec, cfg: FinetuneConfig) -> gym.vector.VectorEnv:
    fns = [lambda: make_env(spec) for _ in range(cfg.num_envs)]
    if cfg.vector == "async":
        return gym.vector.AsyncVectorEnv(fns)
    if cfg.vector == "sync":
        return gym.vector.SyncVectorEnv(fns)
    raise ValueError(f"vector must be 'async' or 'sync', got {cfg.vector!r}")


class OnlineWriter:
    """Puts experience into the online replay as it arrives and fills in each row's Monte-Carlo return
    (Cal-QL's bound) when its episode ends; until then the row's return is ``-inf``, which bounds nothing.

    Rows are written the step they happen, not at their episode's end: with ``n`` environments stepping
    together, storing whole episodes made the newest transitions reach the batches about ``n`` times as
    many updates later, and on the unpenalised hopper that lag cost most of the return (benchmarks/README.md,
    "The loop against the behaviour SAC"). Both loops write through one writer: the synchronous one a step
    at a time, the asynchronous one a poll's chunks at a time. ``add`` numbers rows in arrival order;
    ``extend`` takes one environment's rows by those numbers. A row the ring has overwritten before its
    episode ended gets no return (the slot holds a newer row), nor do the rows of episodes open when an
    asynchronous run was checkpointed (a resumed run does not continue them); synchronous rounds end on
    whole episodes, so their checkpoints hold none open.
    """

    def __init__(self, online: ReplayBuffer | PrioritizedReplay, mc: torch.Tensor, gamma: float):
        self.online, self.mc, self.gamma = online, mc, gamma
        self.added = 0  # rows written through this writer; the last of them sits just before online.ptr
        self.open: dict[Any, tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def add(self, rows: dict[str, np.ndarray]) -> np.ndarray:
        """Append rows (``obs``, ``act``, ``rew``, ``cost``, ``next_obs``, ``done`` = terminated); returns
        their numbers, for :meth:`extend`."""
        self.mc[self.online.add(**rows)] = float("-inf")
        n = len(rows["rew"])
        numbers = np.arange(self.added, self.added + n)
        self.added += n
        return numbers

    def extend(self, key: Any, numbers: np.ndarray, rew: np.ndarray, end: np.ndarray) -> None:
        """Rows of one environment (``key``), in order: extend its open episode and close those that end."""
        nums, rews = self.open.setdefault(key, ([], []))
        lo = 0
        for hi in np.flatnonzero(end) + 1:
            nums.append(numbers[lo:hi])
            rews.append(rew[lo:hi])
            self._close(nums, rews)
            lo = int(hi)
        if lo < len(rew):
            nums.append(numbers[lo:])
            rews.append(rew[lo:])

    def _close(self, nums: list[np.ndarray], rews: list[np.ndarray]) -> None:
        r, n = np.concatenate(rews), np.concatenate(nums)
        ends = np.zeros(len(r), bool)
        ends[-1] = True
        g = mc_returns(r, ends, self.gamma)
        held = n >= self.added - self.online.capacity  # the ring still holds them, row r at ptr - (added - r)
        slots = torch.as_tensor((n[held] - self.added + self.online.ptr) % self.online.capacity)
        self.mc[slots] = torch.as_tensor(g[held], dtype=self.mc.dtype)
        nums.clear()
        rews.clear()


class _Round:
    """One round: whole episodes from every worker, with interleaved gradient updates."""

    def __init__(self, algo: CalQL, cfg: FinetuneConfig, scaler: ActionScaler, writer: OnlineWriter):
        self.algo, self.cfg, self.scaler, self.writer = algo, cfg, scaler, writer
        self.metrics: dict[str, float] = {}
        self.n_updates = 0
        self.episodes: list[tuple[float, float, int]] = []

    def run(self, envs: gym.vector.VectorEnv, seed: int, update) -> None:
        n = envs.num_envs
        target = self.cfg.episodes_per_round or n
        obs, _ = envs.reset(seed=[seed + i for i in range(n)])  # type: ignore[arg-type]  # one seed per env: typed int only
        ret, cost, length = np.zeros(n), np.zeros(n), np.zeros(n, int)
        started, active, just_reset = min(n, target), np.arange(n) < target, np.zeros(n, bool)
        budget = 0.0
        while active.any():
            act = self.algo.act(obs, deterministic=False)  # (n, A) in [-1, 1]: one batched call
            next_obs, rew, term, trunc, info = envs.step(self.scaler.unnormalize(act))
            c = np.asarray(info.get("cost", np.zeros(n)), dtype=np.float64)
            valid = active & ~just_reset  # NEXT_STEP autoreset: this step only reset those workers
            done = valid & (term | trunc)
            live = np.flatnonzero(valid)
            if live.size:
                numbers = self.writer.add({"obs": obs[live], "act": act[live], "rew": rew[live], "cost": c[live],
                                           "next_obs": next_obs[live], "done": term[live].astype(np.float32)})
                for j, i in enumerate(live):
                    self.writer.extend(i, numbers[j : j + 1], rew[i : i + 1], done[i : i + 1])
            ret += np.where(valid, rew, 0.0)
            cost += np.where(valid, c, 0.0)
            length += valid
            for i in np.flatnonzero(done):
                self.episodes.append((float(ret[i]), float(cost[i]), int(length[i])))
                ret[i], cost[i], length[i] = 0.0, 0.0, 0
                if started < target:
                    started += 1
                else:
                    active[i] = False
            just_reset = done
            obs = next_obs
            budget += self.cfg.utd * int(valid.sum())
            while budget >= 1.0:
                budget -= 1.0
                m = update()
                if m is None:
                    budget = 0.0
                    break
                self.n_updates += 1
                for k, v in m.items():
                    self.metrics[k] = self.metrics.get(k, 0.0) + v

    def mean_metrics(self) -> dict[str, float]:
        return {k: v / max(self.n_updates, 1) for k, v in self.metrics.items()}


def _truncate(path: Path, key: str, last: int) -> None:
    if path.is_file():
        keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)[key] <= last]
        path.write_text("".join(f"{ln}\n" for ln in keep))


def _env_record(record: dict[str, Any], spec: TaskSpec, budget: float, data: str | Path) -> dict[str, Any]:
    env = dict(record["env"]) | {"task": spec.name, "env_version": spec.env_version, "cost_budget": budget}
    info = read_info(data)
    labelled = info.extra.get("cost_fn")
    if labelled not in (None, "given by the source", repr(spec.cost_fn)) and info.task == spec.name:
        raise ValueError(
            f"{data}: its cost column was computed by {labelled}, but {spec.key} now costs {spec.cost_fn!r}; "
            "fine-tuning would teach one cost critic both. Recompute its costs (arl data relabel) or "
            "regenerate it (arl data generate)."
        )
    if info.env_version == spec.env_version:
        env |= {"ref_random_return": info.ref_random_return, "ref_expert_return": info.ref_expert_return}
    return env


@holding_out
def finetune(
    from_dir: str | Path, out: str | Path, *, task: str | None = None, data: str | Path | None = None,
    config: FinetuneConfig = FinetuneConfig(), regularizer: Regularizer | None = None,
    sink: MetricSink | None = None, progress: bool = True, stop_after_rounds: int | None = None,
    restart: bool = False,
) -> dict[str, float]:
    """Fine-tune the checkpoint in ``from_dir`` online; writes a checkpoint to ``out`` and returns the
    final metrics record. ``out`` holding a ``train_state`` of the same settings and data resumes it (one of
    others is refused; ``restart`` discards it); one that already finished ``config.steps`` is left as it
    is and its record returned. ``stop_after_rounds`` ends the call early (checkpoint included), as an
    interruption would. A non-finite or runaway loss stops the stage (:class:`TrainingDiverged`).
    """
    cfg, out = config, Path(out)
    if cfg.pipeline not in ("sync", "async"):
        raise ValueError(f"pipeline must be 'sync' or 'async', got {cfg.pipeline!r}")
    if not 0.0 <= cfg.cost_margin < 1.0:
        raise ValueError(f"cost_margin is a share of the budget in [0, 1), got {cfg.cost_margin}")
    out.mkdir(parents=True, exist_ok=True)
    if restart:
        clear_train_state(out)
    resuming = has_train_state(out)
    rec_from = read_config(from_dir)
    spec = get_task(task) if task else get_task(rec_from["env"]["task"], rec_from["env"]["env_version"])
    budget = spec.cost_budget if cfg.cost_budget is None else cfg.cost_budget
    if not budget > 0:
        raise ValueError(f"the episode cost budget must be positive (the multiplier works on cost / budget), got {budget}")
    data = data or rec_from["dataset"]["path"]
    algo = build_algo(rec_from, cfg, regularizer)
    env = _env_record(rec_from, spec, budget, data)
    dataset = {"path": str(data), **{k: v for k, v in rec_from.get("dataset", {}).items() if k != "path"},
               "digest": content_digest(data)}
    if resuming:
        check_resumable(out, {"algo": algo.name, "config": asdict(algo.cfg), "env": env, "dataset": dataset,
                              "finetune": asdict(cfg)})
        done = finished(out, cfg.steps)
        if done is not None:
            if progress:
                print(f"[finetune] {out} finished {cfg.steps} steps already: its record is returned, nothing is trained", flush=True)
            return done
    scaler = ActionScaler.of(env["action_low"], env["action_high"])
    offline, offline_mc = _offline_buffer(data, scaler, algo.cfg.gamma)
    online: ReplayBuffer | PrioritizedReplay = (
        ReplayBuffer(cfg.online_capacity, env["obs_dim"], env["action_dim"]) if cfg.prioritized is None
        else PrioritizedReplay(cfg.online_capacity, env["obs_dim"], env["action_dim"], cfg.prioritized)
    )
    online_mc = torch.zeros(cfg.online_capacity)
    preprocess = make_preprocessor(cfg.preprocess, cfg.preprocess_scale, ObsStats.of(offline.data["obs"][: len(offline)]))
    state = OnlineState()
    refs = (env["ref_random_return"], env["ref_expert_return"]) if env.get("ref_random_return") is not None else None

    def run_eval() -> dict[str, float]:
        act = lambda o: scaler.unnormalize(algo.act(o))  # noqa: E731
        return evaluate(act, spec, cfg.eval_episodes, seed=EVAL_SEED, cost_budget=budget, ref_scores=refs).metrics()

    if resuming:
        record = read_config(out)
        left = load_train_state(out, algo)
        online.load_state_dict(left)
        online_mc[: online.size] = left["online.mc"]
        state.load(left["online.counters"])
    else:
        carried = warm_start(algo, from_dir, budget)
        initial = run_eval() if cfg.eval_episodes > 0 else {}
        record = {
            "algo": algo.name, "config": asdict(algo.cfg), "env": env,
            "dataset": dataset,
            "format_version": 1, "stage": "finetune", "from": str(from_dir), "finetune": asdict(cfg),
            "carried_multiplier": carried, "initial_eval": initial,
        } | {k: rec_from[k] for k in ("continual",) if k in rec_from}
        for name in ("metrics.jsonl", "episodes.jsonl"):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / BEST, ignore_errors=True)
    _truncate(out / "metrics.jsonl", "step", state.env_steps)
    _truncate(out / "episodes.jsonl", "episode", state.episodes)
    sinks = FanoutSink(JsonlSink(out / "metrics.jsonl"), sink)
    batch_size = algo.cfg.batch_size
    n_online = batch_size - int(round(cfg.offline_ratio * batch_size))

    def update() -> dict[str, float] | None:
        if len(online) < max(n_online, 1):
            return None
        if not isinstance(online, PrioritizedReplay):
            batch = sample_mixed(offline, online, batch_size, cfg.offline_ratio, offline_mc, online_mc)
            m = algo.update(batch if preprocess is None else preprocess(batch))
            check_finite(m, algo.step, "finetune")
            return m
        batch, idx, w = sample_mixed_prioritized(offline, online, batch_size, cfg.offline_ratio, offline_mc, online_mc)
        m = algo.update(batch if preprocess is None else preprocess(batch), weights=w)
        check_finite(m, algo.step, "finetune")
        assert algo.td_error is not None
        online.update_priorities(idx, algo.td_error[batch_size - len(idx) :])
        return m | {"is_weight_mean": float(w[batch_size - len(idx) :].mean()) if len(idx) else 1.0}

    def save(metrics: dict[str, Any] | None = None) -> None:
        extra = online.state_dict() | {"online.mc": online_mc[: online.size].clone(), "online.counters": state.tensor()}
        save_checkpoint(out, algo, record, metrics, extra_tensors=extra)

    writer = OnlineWriter(online, online_mc, algo.cfg.gamma)
    session = Session(algo, cfg, spec, budget, scaler, writer, state, record, out, sinks, update, save, run_eval, progress)
    if not resuming:
        session.keep_best(record["initial_eval"])
    if cfg.pipeline == "async":
        from arl_models.online_async import run_async

        return run_async(session, stop_after_rounds)
    t0, start_steps = time.perf_counter(), state.env_steps
    latest: dict[str, float] = {}
    rounds_here = 0
    envs = _make_envs(spec, cfg)
    try:
        while state.env_steps < cfg.steps:
            rnd = _Round(algo, cfg, scaler, writer)
            rnd.run(envs, cfg.seed * 1_000_003 + state.rounds * cfg.num_envs, update)
            latest = _after_round(algo, cfg, state, rnd, budget, out)
            latest["online/steps_per_s"] = (state.env_steps - start_steps) / max(time.perf_counter() - t0, 1e-9)
            session.report_round(latest)
            rounds_here += 1
            if stop_after_rounds is not None and rounds_here >= stop_after_rounds:
                save()
                return latest
            if state.rounds % cfg.save_every == 0:
                save()
    finally:
        envs.close()
    return session.finish(latest, t0)


@dataclass
class Session:
    """What a fine-tuning loop works on, set up by :func:`finetune` (shared by the sync and async loops)."""

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
    update: Any
    """``() -> metrics | None``: one learner update on a mixed batch (None while the online replay is short)."""
    save: Any
    """``(metrics=None) -> None``: checkpoint everything needed to continue."""
    run_eval: Any
    progress: bool

    def report_round(self, latest: dict[str, float]) -> None:
        """Evaluate when due, log the round's metrics and print a progress line."""
        cfg, state = self.cfg, self.state
        if cfg.eval_every and state.rounds % cfg.eval_every == 0 and cfg.eval_episodes > 0:
            latest |= self.run_eval()
            self.keep_best(latest)
        self.sinks.log(latest, state.env_steps)
        if self.progress:
            print(f"[finetune] steps {state.env_steps} return {latest['online/episode_return']:.1f} "
                  f"cost {latest['online/episode_cost']:.1f} cum {state.cumulative_cost:.0f} "
                  f"lambda {self.algo.lagrangian.value:.3f}" + (f" eval {latest['eval/return']:.1f}/{latest['eval/cost']:.1f}" if "eval/return" in latest else ""), flush=True)

    def keep_best(self, ev: dict[str, float]) -> None:
        """Write the current policy to ``OUT/best`` if ``ev`` (an evaluation of it) is within the budget
        and beats the best so far (see ``FinetuneConfig.keep_best``)."""
        if not self.cfg.keep_best or "eval/return" not in ev or ev["eval/cost"] > self.budget:
            return
        best = best_selection(self.out)
        if best is not None and ev["eval/return"] <= best["return"]:
            return
        selected = {"step": self.state.env_steps, "return": ev["eval/return"], "cost": ev["eval/cost"],
                    "episodes": self.cfg.eval_episodes}
        save_policy(self.out / BEST, self.algo.actor, self.record | {"selected": selected})

    def finish(self, latest: dict[str, float], t0: float) -> dict[str, float]:
        """The final record (a last evaluation if the last round had none), saved with the checkpoint."""
        state = self.state
        final = {**latest}
        if self.cfg.eval_episodes > 0 and "eval/return" not in latest:
            ev = self.run_eval()
            self.sinks.log(ev, state.env_steps)  # the curve (and whoever reads the last evaluations) ends with it
            final |= ev
            self.keep_best(final)
        final |= {f"best/{k}": float(v) for k, v in (best_selection(self.out) or {}).items()}
        final |= {f"online/initial_{k.split('/')[-1]}": v for k, v in self.record.get("initial_eval", {}).items()}
        final |= {"online/env_steps_total": float(state.env_steps), "online/cumulative_cost": state.cumulative_cost,
                  "online/violating_episodes": float(state.violations), "online/episodes": float(state.episodes),
                  "online/updates": float(state.updates), "wall_time_s": time.perf_counter() - t0}
        self.save(final)
        return final


def best_selection(out: str | Path) -> dict[str, float] | None:
    """What ``OUT/best`` was selected on (step, return, cost, episodes), or None if there is none yet."""
    path = Path(out) / BEST / CONFIG
    return json.loads(path.read_text())["selected"] if path.is_file() else None


def _after_round(algo: CalQL, cfg: FinetuneConfig, state: OnlineState, rnd: _Round, budget: float, out: Path) -> dict[str, float]:
    """Count the round's episodes, update the multiplier from their mean cost, return the round's metrics."""
    rets = np.array([e[0] for e in rnd.episodes])
    costs = np.array([e[1] for e in rnd.episodes])
    with (out / "episodes.jsonl").open("a") as f:
        for r, c, length in rnd.episodes:
            state.episodes += 1
            state.env_steps += length
            state.cumulative_cost += c
            state.violations += int(c > budget)
            f.write(json.dumps({
                "episode": state.episodes, "env_steps": state.env_steps, "return": r, "cost": c,
                "cumulative_cost": state.cumulative_cost, "multiplier": algo.lagrangian.value,
            }) + "\n")
    state.rounds += 1
    state.updates += rnd.n_updates
    if cfg.constrained:
        algo.lagrangian.update(float(costs.mean()) / budget, 1.0 - cfg.cost_margin)  # relative: gains independent of scale
    m = {f"online/{k}": v for k, v in rnd.mean_metrics().items()}
    return m | {
        "online/episode_return": float(rets.mean()), "online/episode_cost": float(costs.mean()),
        "online/cumulative_cost": state.cumulative_cost, "online/violating_episodes": float(state.violations),
        "online/episodes": float(state.episodes), "online/lagrange_multiplier": algo.lagrangian.value,
        "online/updates": float(state.updates), "online/online_buffer": float(len(rnd.writer.online)),
    }
