"""Checkpoints: safetensors weights plus JSON; loading never unpickles.

A stage's output directory::

    OUT/
      weights.safetensors   every network and free parameter of the algorithm
      config.json           algorithm name, its config, the environment spec, the dataset it saw
      metrics.json          the final metrics record
      metrics.jsonl         one line per logging interval (appended while training)
      train_state/          what resuming needs: weights, optimiser moments, RNG, step, multipliers;
                            replaced atomically at each save
      best/                 fine-tuning only: the policy the stage hands over (its best evaluation
                            within the cost budget), a policy directory of its own

:func:`load_policy` rebuilds just the actor for acting, from ``config.json`` and the weights.
:func:`handed_over` names the policy a stage hands over: ``best/`` where there is one, else the stage's
own weights. Training continues from the stage's weights and ``train_state/``; serving, the pipeline's
evaluation and gate, and continual learning's forgetting use the handed-over policy.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from arl_models.data.dataset import reference_pair, staged_dir
from arl_models.nets import Actor, DeterministicActor, TanhGaussianActor
from arl_models.replay import ActionScaler

WEIGHTS = "weights.safetensors"
CONFIG = "config.json"
METRICS = "metrics.json"
TRAIN_STATE = "train_state"
BEST = "best"


class Algorithm(Protocol):
    name: str
    cfg: Any
    obs_dim: int
    act_dim: int
    step: int

    def networks(self) -> dict[str, nn.Module]: ...
    def optimizers(self) -> dict[str, torch.optim.Optimizer]: ...
    def parameters(self) -> dict[str, nn.Parameter]: ...
    def extra_state(self) -> dict[str, float]: ...
    def load_extra_state(self, s: dict[str, float]) -> None: ...


def model_state(algo: Algorithm) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, net in algo.networks().items():
        out |= {f"{name}.{k}": v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    out |= {f"param.{k}": p.detach().cpu().reshape(-1).clone() for k, p in algo.parameters().items()}
    return out


def load_weights(net: nn.Module, state: dict[str, torch.Tensor], prefix: str, where: Path) -> None:
    """Load the entries of ``state`` under ``prefix`` into ``net``; a set of names that does not fit is an
    error naming the checkpoint and the names (a checkpoint of an older network layout, for example).
    Input statistics (``nets.ObsNorm``) a checkpoint lacks stay the identity: it predates them, and saw raw
    inputs."""
    keys = net.load_state_dict(
        {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=False
    )
    missing = [k for k in keys.missing_keys if k.split(".")[-2:-1] != ["obs_norm"]]  # older: identity
    if missing or keys.unexpected_keys:
        raise ValueError(
            f"{where}: its weights do not fit the network its config.json describes (missing "
            f"{[prefix + k for k in missing]}, "
            f"unexpected {[prefix + k for k in keys.unexpected_keys]}); "
            "a checkpoint written before a change of layout must be retrained"
        )


def load_model_state(algo: Algorithm, state: dict[str, torch.Tensor], where: Path) -> None:
    for name, net in algo.networks().items():
        load_weights(net, state, f"{name}.", where)
    with torch.no_grad():
        for k, p in algo.parameters().items():
            p.copy_(state[f"param.{k}"].reshape(p.shape))


def _optimizer_tensors(
    opts: dict[str, torch.optim.Optimizer],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    groups: dict[str, Any] = {}
    for name, opt in opts.items():
        sd = opt.state_dict()
        groups[name] = sd["param_groups"]
        for idx, st in sd["state"].items():
            for key, val in st.items():
                tensors[f"opt.{name}.{idx}.{key}"] = torch.as_tensor(val).detach().cpu().contiguous()
    return tensors, groups


def _load_optimizers(
    opts: dict[str, torch.optim.Optimizer], tensors: dict[str, torch.Tensor], groups: dict, where: Path
) -> None:
    for name, opt in opts.items():
        if len(groups[name]) != len(opt.param_groups):
            raise ValueError(
                f"{where}: the {name} optimizer was saved with {len(groups[name])} parameter group(s), this "
                f"configuration builds {len(opt.param_groups)} (a conditioned network trained before "
                "context_lr_scale existed has one: continue it with context_lr_scale 1.0, in its config.json "
                "for a continual or fine-tuning start)"
            )
        state: dict[int, dict[str, torch.Tensor]] = {}
        prefix = f"opt.{name}."
        for k, v in tensors.items():
            if k.startswith(prefix):
                idx, key = k[len(prefix) :].split(".", 1)
                state.setdefault(int(idx), {})[key] = v
        opt.load_state_dict({"state": state, "param_groups": groups[name]})


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def config_record(
    algo: Algorithm,
    env: dict[str, Any],
    dataset: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint's record (``config.json``): the algorithm's name and config, the environment and the
    dataset it ran on, then ``extra``, the stage's own entries, in their order."""
    return {
        "algo": algo.name,
        "config": dataclasses.asdict(algo.cfg),
        "env": env,
        "dataset": dataset or {},
        "format_version": 1,
        **(extra or {}),
    }


def record_references(record: dict[str, Any]) -> tuple[float, float] | None:
    """The (random, expert) reference returns a checkpoint's record carries, or None."""
    env = record["env"]
    return reference_pair(env.get("ref_random_return"), env.get("ref_expert_return"))


def save_checkpoint(
    out: str | Path,
    algo: Algorithm,
    record: dict[str, Any],
    metrics: dict[str, Any] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write weights, config and metrics, and the resumable ``train_state/`` (atomically)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weights = model_state(algo)
    opt_tensors, groups = _optimizer_tensors(algo.optimizers())
    with staged_dir(out / TRAIN_STATE) as tmp:
        rng = {"rng.torch": torch.get_rng_state()}
        save_file({**weights, **opt_tensors, **rng, **(extra_tensors or {})}, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(
            json.dumps({"param_groups": groups, "extra": algo.extra_state(), "record": record})
        )
    tmp_w = out / f".{WEIGHTS}.tmp"
    save_file(weights, str(tmp_w))
    os.replace(tmp_w, out / WEIGHTS)
    _atomic_write_text(out / CONFIG, json.dumps(record, indent=2) + "\n")
    if metrics is not None:
        _atomic_write_text(out / METRICS, json.dumps(metrics, indent=2) + "\n")
    return out


def finished(out: str | Path, steps: int) -> dict[str, Any] | None:
    """The final metrics record of a checkpoint that completed ``steps`` (gradient steps, or environment
    steps for fine-tuning), else None. A stage asked to train a finished checkpoint returns this instead
    of touching it."""
    f = Path(out) / METRICS
    if not f.is_file():
        return None
    metrics = json.loads(f.read_text())
    done = metrics.get("steps", metrics.get("online/env_steps_total", 0))
    return metrics if done >= steps and "wall_time_s" in metrics else None


def has_train_state(out: str | Path) -> bool:
    return (Path(out) / TRAIN_STATE / "state.json").is_file()


class ResumeMismatch(ValueError):
    """A checkpoint folder holds a run of other settings or data than the one asked to resume in it."""


RESUME_KEYS = (
    "algo",
    "config",
    "preset",
    "finetune",
    "continual_config",
    "dataset.digest",
    "env.task",
    "env.env_version",
    "env.cost_budget",
)
"""What a rerun must share with the run whose checkpoint it resumes (``a.b``: key ``b`` of ``a``); a step
budget (``steps``) may differ, so that a longer run continues a shorter one."""


LEGACY_ALGO_NAMES: dict[tuple[Any, Any], str] = {("calql", "none"): "sac", ("calql", "cql"): "cql"}
"""``(algo, config.conservative)`` of fine-tuning and continual records written before a learner was named
by its critic regime (``algos.calql.REGIME_NAMES``), and the name that regime has now."""


def recorded_algo(record: dict[str, Any]) -> Any:
    """The algorithm a checkpoint record names, an older record's ``calql`` read as its regime's name."""
    regime = (record.get("config") or {}).get("conservative")
    return LEGACY_ALGO_NAMES.get((record.get("algo"), regime), record.get("algo"))


def _get(record: dict[str, Any], key: str) -> Any:
    if key == "algo":
        return recorded_algo(record)
    for part in key.split("."):
        record = record.get(part) if isinstance(record, dict) else None  # type: ignore[assignment]
    return record


def check_resumable(out: str | Path, record: dict[str, Any]) -> None:
    """Refuse (:class:`ResumeMismatch`, naming each difference) to resume the run in ``out`` with ``record``
    when they differ in any of :data:`RESUME_KEYS`."""
    saved = saved_record(out)
    record = json.loads(json.dumps(record))  # as it would be saved: tuples become lists
    diffs: list[str] = []
    for key in RESUME_KEYS:
        was, now = _get(saved, key), _get(record, key)
        if isinstance(was, dict) and isinstance(now, dict):
            diffs += [
                f"{key}.{k} was {was.get(k)!r}, now {now.get(k)!r}"
                for k in {**was, **now}
                if k != "steps" and was.get(k) != now.get(k)
            ]
        elif was != now:
            diffs.append(f"{key} was {was!r}, now {now!r}")
    if diffs:
        raise ResumeMismatch(
            f"{out} holds a run with other settings or data: {'; '.join(diffs)}. "
            "Start over (restart=True, `--restart`) or choose another output folder."
        )


def saved_record(out: str | Path) -> dict[str, Any]:
    """The record of the run whose ``train_state/`` is in ``out``, kept with it (written with the weights
    it resumes, in one rename, so a run killed before its ``config.json`` was rewritten still has it);
    ``config.json``'s for a checkpoint written before the record was kept there, else ``{}``."""
    state = Path(out) / TRAIN_STATE / "state.json"
    saved = json.loads(state.read_text()).get("record") if state.is_file() else None
    if saved is None:
        f = Path(out) / CONFIG
        saved = json.loads(f.read_text()) if f.is_file() else {}
    return saved


def clear_train_state(out: str | Path) -> None:
    """Forget the run in ``out`` (train state, weights, records, logs), so the next one starts afresh."""
    import shutil

    out = Path(out)
    shutil.rmtree(out / TRAIN_STATE, ignore_errors=True)
    shutil.rmtree(out / BEST, ignore_errors=True)
    for name in (WEIGHTS, CONFIG, METRICS, "metrics.jsonl", "episodes.jsonl"):
        (out / name).unlink(missing_ok=True)


def load_train_state(out: str | Path, algo: Algorithm) -> dict[str, torch.Tensor]:
    """Restore everything :func:`save_checkpoint` wrote into ``algo`` (and torch's RNG).

    Returns the tensors the algorithm did not claim (for example a replay buffer).
    """
    d = Path(out) / TRAIN_STATE
    tensors = load_file(str(d / "state.safetensors"))
    meta = json.loads((d / "state.json").read_text())
    load_model_state(algo, tensors, Path(out))
    _load_optimizers(algo.optimizers(), tensors, meta["param_groups"], Path(out))
    algo.load_extra_state(meta["extra"])
    torch.set_rng_state(tensors["rng.torch"])
    return {k: v for k, v in tensors.items() if not k.startswith(("opt.", "rng.", "param."))}


def read_config(path: str | Path) -> dict[str, Any]:
    f = Path(path) / CONFIG
    if not f.is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint directory (missing {CONFIG})")
    return json.loads(f.read_text())


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Rebuild a (nested) config dataclass from its ``asdict`` form; unknown keys are an error."""
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v, default = d[f.name], getattr(defaults, f.name)
        if dataclasses.is_dataclass(default):
            v = config_from_dict(type(default), v)
        elif isinstance(default, tuple):
            v = tuple(v)
        kwargs[f.name] = v
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    return cls(**kwargs)


class Policy:
    """A trained actor, ready to act in the environment's action space."""

    def __init__(self, actor: Actor, scaler: ActionScaler, record: dict[str, Any]):
        self.actor = actor.eval()
        self.scaler = scaler
        self.record = record

    @property
    def task(self) -> str:
        return self.record["env"]["task"]

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        o = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        single = o.dim() == 1
        a = self.actor.act(o.unsqueeze(0) if single else o, deterministic).numpy()
        a = self.scaler.unnormalize(a)
        return a[0] if single else a


def handed_over(checkpoint: str | Path) -> Path:
    """The policy directory a stage hands over: ``checkpoint/best`` where the stage kept one, else
    ``checkpoint`` itself."""
    best = Path(checkpoint) / BEST
    return best if (best / CONFIG).is_file() else Path(checkpoint)


def load_policy(path: str | Path) -> Policy:
    record = read_config(path)
    cfg, env = record["config"], record["env"]
    hidden = tuple(cfg["hidden"])
    deterministic = record["algo"] == "bc" and cfg.get("policy") == "deterministic"
    cls = DeterministicActor if deterministic else TanhGaussianActor
    actor = cls(env["obs_dim"], env["action_dim"], hidden, cfg.get("context_dim", 0))
    weights = load_file(str(Path(path) / WEIGHTS))
    load_weights(actor, weights, "actor.", Path(path))
    scaler = ActionScaler.of(env["action_low"], env["action_high"])
    return Policy(actor, scaler, record)


def save_policy(out: str | Path, actor: nn.Module, record: dict[str, Any]) -> Path:
    """Write an actor alone (weights + config), loadable by :func:`load_policy`; the directory is
    replaced whole, so a reader never sees one policy's weights under another's config."""
    out = Path(out)
    with staged_dir(out) as tmp:
        save_file(
            {f"actor.{k}": v.detach().cpu().contiguous() for k, v in actor.state_dict().items()},
            str(tmp / WEIGHTS),
        )
        (tmp / CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    return out
