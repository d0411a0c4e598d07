"""Where fine-tuning starts: the learner built from an offline checkpoint, its warm start, and the
records of the task and data it runs on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from arl_models.algos.calql import CalQL, CalQLConfig, Regularizer
from arl_models.checkpoint import config_from_dict, config_record, read_config
from arl_models.data.dataset import content_digest, read_info
from arl_models.envs.registry import TaskSpec, get_task
from arl_models.online.config import FinetuneConfig
from arl_models.warm_start import SAME_PARTS, learner_from


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
        base,
        seed=cfg.seed,
        conservative=cfg.conservative,
        cost_q_limit=None,
        pid=cfg.pid,
        actor_warmup_steps=0,
        backup_entropy=True,  # online it is SAC: the soft (entropy-regularised) TD target
        external_multiplier=cfg.constrained,
        batch_size=cfg.batch_size or base.batch_size,
        conservative_weight=(
            base.conservative_weight if cfg.conservative_weight is None else cfg.conservative_weight
        ),
    )
    env = record["env"]
    return CalQL(env["obs_dim"], env["action_dim"], algo_cfg, regularizer=regularizer)


def warm_start(algo: CalQL, from_dir: str | Path, budget: float) -> dict[str, float]:
    """The learner from the checkpoint in ``from_dir`` (``warm_start.learner_from``: all of a SAC-family
    checkpoint, the shared networks of TD3+BC's or IQL's), its multiplier at rest with the online gains
    (the unconstrained baseline never updates it); returns the checkpoint's multiplier state, for the
    record."""
    previous = learner_from(algo, from_dir)
    torch.manual_seed(algo.cfg.seed)
    return previous


def env_record(record: dict[str, Any], spec: TaskSpec, budget: float, data: str | Path) -> dict[str, Any]:
    """The checkpoint's environment record for ``spec`` and ``budget``, with the data's reference returns
    when they were measured on this version of the task. Refuses data whose costs the task no longer gives."""
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


@dataclass
class Origin:
    """What a fine-tuning run starts from: the offline checkpoint and its record, the task and its episode
    cost budget, the offline data, and the learner built for them."""

    from_dir: str | Path
    record: dict[str, Any]
    spec: TaskSpec
    budget: float
    data: str | Path
    algo: CalQL
    env: dict[str, Any]
    dataset: dict[str, Any]

    def run_record(self, cfg: FinetuneConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The record of a fine-tuning run with ``cfg`` from here, ``extra`` at its end; a checkpoint
        folder resumes only for a run whose record matches its own (``checkpoint.check_resumable``)."""
        entries = {"stage": "finetune", "from": str(self.from_dir), "finetune": asdict(cfg), **(extra or {})}
        return config_record(self.algo, self.env, self.dataset, entries)


def resolve_origin(
    from_dir: str | Path,
    task: str | None,
    data: str | Path | None,
    cfg: FinetuneConfig,
    regularizer: Regularizer | None,
) -> Origin:
    """The start of a run from ``from_dir``: the task given (else the checkpoint's), its budget (the
    config's, else the task's), the data given (else the checkpoint's) and the learner."""
    rec_from = read_config(from_dir)
    spec = get_task(task) if task else get_task(rec_from["env"]["task"], rec_from["env"]["env_version"])
    budget = spec.cost_budget if cfg.cost_budget is None else cfg.cost_budget
    if not budget > 0:
        raise ValueError(
            f"the episode cost budget must be positive (the multiplier works on cost / budget), got {budget}"
        )
    data = data or rec_from["dataset"]["path"]
    algo = build_algo(rec_from, cfg, regularizer)
    env = env_record(rec_from, spec, budget, data)
    dataset = {
        "path": str(data),
        **{k: v for k, v in rec_from.get("dataset", {}).items() if k != "path"},
        "digest": content_digest(data),
    }
    return Origin(from_dir, rec_from, spec, budget, data, algo, env, dataset)
