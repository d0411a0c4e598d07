"""Settings of online fine-tuning: the learner, the multiplier, the loops and the worker pool."""

from __future__ import annotations

from dataclasses import dataclass

from arl_models.lagrange import PIDConfig
from arl_models.prioritized import PERConfig
from arl_models.rate_tuner import RateTargets


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
    """Constrained online fine-tuning (stage 3): SAC, optionally with CQL's or Cal-QL's conservative
    term (Nakamoto et al. 2023), on batches mixing offline and online data symmetrically (Ball et al.
    2023, RLPD), under a PID Lagrange multiplier on the episode cost (Stooke et al. 2020)."""

    seed: int = 0
    steps: int = 20_000
    """Environment steps of fine-tuning, all workers together (the run stops at the first round end
    past it)."""
    num_envs: int = 4
    """Parallel environments (worker processes with ``vector="async"``)."""
    episodes_per_round: int | None = None
    """Episodes collected per round (default ``num_envs``); multiplier updates and checkpoints follow
    rounds."""
    vector: str = "sync"
    """``sync``: the environments step in the learner's process; ``async``: one worker process each (pays
    where an environment step costs more than passing its observation between processes)."""
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
    """Share of the budget held in reserve: the multiplier holds the measured cost (``cost_signal``) to
    ``budget * (1 - cost_margin)``."""
    cost_signal: str = "episodes"
    """The cost the multiplier measures after each round: ``evaluation``, the mean cost of the round's
    deterministic evaluation (the policy that keep-best hands over) where the round has one, else the
    training episodes'; ``episodes``, always the training episodes' (stochastic actions)."""
    pid: PIDConfig = PIDConfig(kp=1.0, ki=0.5, kd=0.0)
    """Gains of the multiplier on the relative violation ``measured cost / budget - (1 - cost_margin)``
    (per round); it starts at rest (the offline stage's weighed ``Q_c``, not episodes), a resumed run at
    its own."""
    online_capacity: int = 1_000_000
    prioritized: PERConfig | None = None
    """Sample the online part of each batch by priority and freshness (``prioritized.py``): its rows'
    critic TD losses are weighted by their IS weights (offline rows weigh 1) and their priorities set
    from the update's TD errors; ``None`` samples it uniformly."""
    preprocess: str = "none"
    """Transform of every training batch's observations on the learner's device, never on the acting
    path (``preprocess.py``): ``none``, ``amplitude`` or ``noise`` (state augmentations), or a
    registered name."""
    preprocess_scale: float = 0.1
    """Strength of ``preprocess``: the amplitude's half-width, or the noise's std in data stds."""
    pipeline: str = "sync"
    """``sync``: rounds over a vector environment, collection and updates in turn (``sync_loop.py``).
    ``async``: a pool of environment workers collects while the learner updates (``async_loop.py``)."""
    workers: WorkerConfig = WorkerConfig()
    """The worker pool of ``pipeline="async"`` (ignored by ``sync``)."""
    eval_every: int = 1
    """Rounds between deterministic evaluations (0: only at the start and the end). Each evaluation
    within the budget is a candidate for ``OUT/best``; the evaluation runs its episodes in one vector
    environment, cheap beside a round's updates."""
    eval_episodes: int = 10
    keep_best: bool = True
    """Write ``OUT/best/`` (a policy, loadable by ``load_policy``) whenever an evaluation within the
    budget beats every earlier one, the start's included; its config records the selection under
    ``selected``."""
    save_every: int = 1
    """Rounds between checkpoints."""
