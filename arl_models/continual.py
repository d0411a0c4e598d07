"""Stage 4: continual learning across data and environment versions with (online) EWC.

When a new version arrives (a dataset generated on ``safe-pendulum@1.1.0``, say), the policy is
trained on it offline (CQL, optionally followed by constrained online fine-tuning on the new
environment version) with an EWC penalty (``algos/ewc.py``) anchored at the parameters the earlier
versions produced, with the Fisher of the policy and the critics estimated on the earlier versions'
data. Over a sequence of versions the Fisher accumulates with decay (online EWC); the accumulated
terms travel in ``OUT/ewc.safetensors``.

Forgetting is measured, not assumed: after training, the policy is evaluated on every earlier
version's environment and on the new one. Per earlier version, forgetting is the best score any
earlier policy of the chain reached there minus the current score. The same run trains the naive
baseline (sequential training without the penalty, from ``naive_from`` or the same start) into
``OUT/naive`` and reports it beside EWC, in ``OUT/continual.json`` and the metrics record.

Rehearsal (``ContinualConfig.rehearsal``) draws a fixed share of every offline batch from the earlier
versions' datasets, the replay half of CLEAR (Rolnick et al., "Experience Replay for Continual
Learning", NeurIPS 2019). Here it costs no extra storage: every version's dataset is already kept and
versioned. It applies to the offline stage, not to the online fine-tuning that may follow. The naive
baseline never rehearses; EWC at weight 0 with rehearsal is rehearsal alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from arl_models.algos.calql import CalQL, CalQLConfig
from arl_models.algos.ewc import EWCConfig, EWCPenalty, compute_fisher, current_anchor
from arl_models.checkpoint import (
    config_from_dict,
    config_record,
    handed_over,
    has_train_state,
    load_policy,
    read_config,
)
from arl_models.data.dataset import DatasetInfo, Transitions, read_dataset
from arl_models.envs.registry import get_task
from arl_models.evaluate import EVAL_SEED, EvalResult, evaluate
from arl_models.metrics import MetricSink
from arl_models.offline import dataset_record, env_record, held_to_budget, live_eval
from arl_models.online import FinetuneConfig, finetune, sample_mixed
from arl_models.replay import ActionScaler, Batch, ReplayBuffer
from arl_models.train import fit
from arl_models.warm_start import learner_from

EWC_FILE = "ewc.safetensors"


@dataclass(frozen=True)
class ContinualConfig:
    seed: int = 0
    steps: int = 5_000
    """Offline gradient steps on the new dataset."""
    ewc: EWCConfig = EWCConfig()
    online_steps: int = 0
    """Environment steps of constrained fine-tuning on the new version afterwards (0: offline only)."""
    finetune: FinetuneConfig = FinetuneConfig()
    """Settings of that fine-tuning (its ``steps`` are replaced by ``online_steps``)."""
    rehearsal: float = 0.0
    """Share of each offline batch drawn from the earlier versions' datasets (exactly ``round(share * B)``
    rows, uniform over their transitions together); 0: the new data alone. Not applied to the baseline."""
    baseline: bool = True
    """Also train naive sequential fine-tuning (no penalty, no rehearsal) and report it."""
    eval_episodes: int = 10
    eval_every: int = 0
    """Every this many offline steps, evaluate the live policy on every version (``eval/TASK@VERSION/...``
    in the metrics: forgetting and learning as curves); 0: only the final evaluation."""
    log_every: int = 500

    def __post_init__(self) -> None:
        if not 0.0 <= self.rehearsal < 1.0:
            raise ValueError(f"continual: rehearsal is a share of the batch in [0, 1), got {self.rehearsal}")
        if self.eval_every and self.eval_every % self.log_every:
            raise ValueError(
                f"continual: eval_every ({self.eval_every}) must be a multiple of log_every "
                f"({self.log_every}), where evaluations are logged"
            )


def version_key(info: DatasetInfo) -> str:
    return f"{info.task}@{info.env_version}"


def evaluate_on(
    policy_dir: str | Path, info: DatasetInfo, episodes: int, seed: int = EVAL_SEED
) -> EvalResult:
    """Episodes of a checkpoint's policy on a dataset's task version."""
    return evaluate(load_policy(policy_dir).act, get_task(info.task, info.env_version), episodes, seed=seed)


def _score(res: EvalResult, info: DatasetInfo) -> float:
    return res.mean_return if info.references is None else info.normalized_score(res.mean_return)


def score_on(policy_dir: str | Path, info: DatasetInfo, episodes: int, seed: int = EVAL_SEED) -> float:
    """Normalised score (or raw return without reference scores) of a checkpoint on a dataset's version."""
    return _score(evaluate_on(policy_dir, info, episodes, seed), info)


def offline_start(from_dir: Path, t: Transitions, info: DatasetInfo) -> CalQL:
    """A CQL-family algorithm holding ``from_dir``'s weights, configured for offline training on ``info``;
    a constrained start stays constrained, held on the new data's episode starts as ``train_cql`` does."""
    rec = read_config(from_dir)
    cfg = config_from_dict(CalQLConfig, rec["config"])
    constrained = (cfg.cost_q_limit is not None or cfg.external_multiplier) and info.cost_budget is not None
    # the limit of the new data, held with the offline gains (the champion's were the online ones)
    cfg = replace(
        cfg, conservative="cql", external_multiplier=False, cost_q_limit=None, pid=CalQLConfig().pid
    )
    algo = held_to_budget(CalQL, cfg, info, t, constrained, calibrate=False)
    learner_from(algo, from_dir)
    return algo


def _scaler(info: DatasetInfo) -> ActionScaler:
    return ActionScaler.of(info.action_low, info.action_high)


def earlier_buffer(previous: list[Path], new: DatasetInfo) -> ReplayBuffer:
    """The earlier versions' datasets in one buffer, for rehearsal; each must fit the new one's shapes."""
    parts = [read_dataset(p) for p in previous]
    for path, (_, info) in zip(previous, parts, strict=True):
        if (info.obs_dim, info.action_dim) != (new.obs_dim, new.action_dim):
            raise ValueError(
                f"rehearsal: {path} has observations of {info.obs_dim} and actions of {info.action_dim} "
                f"dimensions, the new version {version_key(new)} {new.obs_dim} and {new.action_dim}"
            )
    buf = ReplayBuffer(sum(len(t) for t, _ in parts), new.obs_dim, new.action_dim)
    for t, info in parts:
        buf.add_transitions(t, _scaler(info))
    return buf


def batches(
    new: ReplayBuffer, earlier: ReplayBuffer | None, batch_size: int, share: float
) -> Callable[[], Batch]:
    """The offline stage's sampler: the new data alone, or ``round(share * B)`` earlier rows first."""
    if earlier is None:
        return lambda: new.sample(batch_size)
    return lambda: sample_mixed(earlier, new, batch_size, share)


def earlier_penalty(algo: CalQL, from_dir: Path, previous: list[Path], cfg: EWCConfig) -> EWCPenalty:
    """Online EWC: the start's accumulated Fisher (if any) decayed, plus the Fisher on earlier data."""
    anchor = current_anchor(algo, cfg.networks)
    saved = from_dir / EWC_FILE
    penalty = EWCPenalty.from_tensors(load_file(str(saved)), cfg.weight) if saved.is_file() else None
    # with an accumulated Fisher only the newest earlier version is new; otherwise all, oldest first
    fresh = previous[-1:] if penalty is not None else previous
    gen = torch.Generator().manual_seed(cfg.seed)
    for path in fresh:
        t, info = read_dataset(path)
        idx = torch.randperm(len(t), generator=gen)[: cfg.samples].numpy()
        obs = torch.as_tensor(t.obs[idx])
        act = torch.as_tensor(_scaler(info).normalize(t.action[idx]))
        fisher = compute_fisher(algo, obs, act, cfg)
        penalty = (
            EWCPenalty(fisher, anchor, cfg.weight)
            if penalty is None
            else penalty.consolidate(fisher, anchor, cfg.decay)
        )
    assert penalty is not None
    return penalty


def every_version(algo: CalQL, infos: list[DatasetInfo], episodes: int) -> Callable[[], dict[str, float]]:
    """The live policy's evaluation on each version (the registered ones), keyed ``eval/TASK@VERSION/``."""
    made = (live_eval(algo, _scaler(i), i, episodes, f"eval/{version_key(i)}/") for i in infos)
    runs = [r for r in made if r is not None]

    def run() -> dict[str, float]:
        return {k: v for r in runs for k, v in r().items()}

    return run


def _train_branch(
    from_dir: Path,
    data: Path,
    out: Path,
    previous: list[Path],
    cfg: ContinualConfig,
    use_ewc: bool,
    sink: MetricSink | None,
    progress: bool,
    infos: list[DatasetInfo],
) -> Path:
    """Offline CQL on the new data (with or without EWC), then optionally online fine-tuning; returns the
    final checkpoint directory."""
    t, info = read_dataset(data)
    algo = offline_start(from_dir, t, info)
    offline_out = out / "offline" if cfg.online_steps > 0 else out
    offline_out.mkdir(parents=True, exist_ok=True)
    penalty = None
    if use_ewc and previous:
        f = offline_out / EWC_FILE
        if f.is_file():
            penalty = EWCPenalty.from_tensors(load_file(str(f)), cfg.ewc.weight)
        else:
            penalty = earlier_penalty(algo, from_dir, previous, cfg.ewc)
            save_file(penalty.tensors(), str(f))
    algo.regularizer = penalty
    buffer = ReplayBuffer.from_transitions(t, _scaler(info))
    rehearse = use_ewc and previous and cfg.rehearsal > 0
    sample = batches(
        buffer, earlier_buffer(previous, info) if rehearse else None, algo.cfg.batch_size, cfg.rehearsal
    )
    if not has_train_state(offline_out):
        torch.manual_seed(cfg.seed)
    entries = {"stage": "continual", "from": str(from_dir), "ewc": use_ewc, "continual_config": asdict(cfg)}
    record = config_record(algo, env_record(info), dataset_record(data, info), entries)
    fit(
        algo,
        sample,
        cfg.steps,
        offline_out,
        record,
        sink=sink,
        evaluate=every_version(algo, infos, cfg.eval_episodes) if cfg.eval_every else None,
        eval_every=cfg.eval_every,
        log_every=cfg.log_every,
        save_every=max(cfg.steps // 4, 1),
        progress=progress,
        desc=f"continual {'ewc' if use_ewc else 'naive'} {version_key(info)}",
    )
    if cfg.online_steps <= 0:
        return offline_out
    ft = replace(cfg.finetune, steps=cfg.online_steps, seed=cfg.seed)
    finetune(
        offline_out,
        out,
        task=version_key(info),
        data=data,
        config=ft,
        regularizer=penalty,
        sink=sink,
        progress=progress,
    )
    if penalty is not None:
        save_file(penalty.tensors(), str(out / EWC_FILE))
    return out


def _history(from_dir: Path) -> dict[str, float]:
    return dict(read_config(from_dir).get("continual", {}).get("best_scores", {}))


def forgetting_report(
    start: Path, final: Path, infos: list[DatasetInfo], episodes: int, seed: int = EVAL_SEED
) -> dict[str, Any]:
    """Scores of ``final`` on every version and its forgetting on the earlier ones, against the best
    earlier scores of the chain ``start`` continues (any policy checkpoint can be ``final``: the EWC
    branch's, or a stage that trained on the new version alone); also its mean cost on the new version.

    Both ends are scored by the policy they hand over (``handed_over``: a fine-tuning stage's ``best/``),
    so forgetting is measured against what was served, while training continued from the last weights."""
    best = _history(start)
    keys = [version_key(i) for i in infos]
    served_start, served_final = handed_over(start), handed_over(final)
    start_scores = {k: score_on(served_start, i, episodes, seed) for k, i in zip(keys, infos, strict=True)}
    earlier = keys[:-1]
    scores = {k: score_on(served_final, i, episodes, seed) for k, i in zip(earlier, infos, strict=False)}
    new = evaluate_on(served_final, infos[-1], episodes, seed)
    scores[keys[-1]] = _score(new, infos[-1])
    for k in earlier:
        best[k] = max(best.get(k, -np.inf), start_scores[k])
    forgetting = {k: best[k] - scores[k] for k in earlier}
    new_best = dict(best) | {k: max(best.get(k, -np.inf), scores[k]) for k in keys}
    return {
        "scores": scores,
        "start_scores": start_scores,
        "best_earlier": {k: best[k] for k in earlier},
        "forgetting": forgetting,
        "mean_forgetting": float(np.mean(list(forgetting.values()))) if earlier else 0.0,
        "new_version": keys[-1],
        "new_score": scores[keys[-1]],
        "new_cost": new.mean_cost,
        "cost_budget": new.cost_budget,
        "best_scores": new_best,
        "versions": keys,
    }


def _write_chain_record(final: Path, report: dict[str, Any], datasets: list[Path]) -> None:
    """Put the chain's history (versions, datasets, best scores) into the checkpoint's config.json."""
    path = final / "config.json"
    rec = json.loads(path.read_text())
    rec["continual"] = {
        "versions": report["versions"],
        "datasets": [str(d) for d in datasets],
        "best_scores": report["best_scores"],
    }
    tmp = path.with_name(".config.json.tmp")
    tmp.write_text(json.dumps(rec, indent=2) + "\n")
    os.replace(tmp, path)


def train_continual(
    from_dir: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    previous: list[str | Path] | None = None,
    naive_from: str | Path | None = None,
    config: ContinualConfig = ContinualConfig(),
    sink: MetricSink | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train on a new version with EWC (into ``out``) and, as the baseline, without (``out/naive``).

    ``previous``: the earlier versions' datasets, oldest first (default: the chain recorded in
    ``from_dir``, or the dataset it was trained on). Returns the report written to ``continual.json``.
    """
    from_dir, data, out = Path(from_dir), Path(data), Path(out)
    rec = read_config(from_dir)
    if previous is None:
        previous = rec.get("continual", {}).get("datasets") or [rec["dataset"]["path"]]
    prev = [Path(p) for p in previous]
    infos = [read_dataset(p)[1] for p in [*prev, data]]
    final = _train_branch(from_dir, data, out, prev, config, True, sink, progress, infos)
    report: dict[str, Any] = {
        "config": asdict(config),
        "from": str(from_dir),
        "data": str(data),
        "previous": [str(p) for p in prev],
    }
    report["ewc"] = forgetting_report(from_dir, final, infos, config.eval_episodes)
    _write_chain_record(final, report["ewc"], [*prev, data])
    if config.baseline:
        nstart = Path(naive_from) if naive_from else from_dir
        nfinal = _train_branch(nstart, data, out / "naive", prev, config, False, None, progress, infos)
        report["naive"] = forgetting_report(nstart, nfinal, infos, config.eval_episodes)
        _write_chain_record(nfinal, report["naive"], [*prev, data])
        nf = report["naive"]["mean_forgetting"]
        report["forgetting_ratio"] = report["ewc"]["mean_forgetting"] / nf if nf > 0 else None
        ns = report["naive"]["new_score"]
        report["new_score_ratio"] = report["ewc"]["new_score"] / ns if ns > 0 else None
    (out / "continual.json").write_text(json.dumps(report, indent=2) + "\n")
    metrics = {f"continual/ewc_{k}": v for k, v in report["ewc"].items() if isinstance(v, float)}
    if "naive" in report:
        metrics |= {f"continual/naive_{k}": v for k, v in report["naive"].items() if isinstance(v, float)}
    if sink is not None:
        sink.log(metrics, 0)
    mpath = final / "metrics.json"
    base = json.loads(mpath.read_text()) if mpath.is_file() else {}
    mpath.write_text(json.dumps(base | metrics, indent=2) + "\n")
    return report
