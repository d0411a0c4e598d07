"""The arl command's defaults are the library's: each option that sets something the library has a default for
defaults to that value (read from the source by ``arl_cli.defaults``, so that ``arl`` starts without torch),
and ``arl pipeline run`` leaves the flow's defaults to the flow."""

from __future__ import annotations

import inspect
from dataclasses import fields
from operator import attrgetter

import pytest
import typer.main

from arl_cli.defaults import library
from arl_cli.main import app


def _command(*path: str):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _defaults(*path: str) -> dict:
    return {p.name: p.default for p in _command(*path).params}


def test_finetune_defaults_are_finetune_configs():
    from arl_cli.online import FINETUNE_FIELDS, finetune_config
    from arl_models.online import FinetuneConfig

    defaults, library_cfg = _defaults("finetune"), FinetuneConfig()
    assert set(defaults) - set(FINETUNE_FIELDS) == {"from_dir", "out", "task", "data", "restart", "threads"}
    for option, path in FINETUNE_FIELDS.items():
        assert defaults[option] == attrgetter(path)(library_cfg), f"--{option} is not FinetuneConfig.{path}"
    assert finetune_config(defaults) == library_cfg


def test_finetune_options_reach_their_fields():
    from arl_cli.online import finetune_config

    given = {
        **_defaults("finetune"),
        "kp": 3.0,
        "workers": 5,
        "ray_address": "ray://head:10001",
        "budget": 7.0,
    }
    cfg = finetune_config(given)
    assert (cfg.pid.kp, cfg.workers.num_workers, cfg.workers.address, cfg.cost_budget) == (
        3.0,
        5,
        "ray://head:10001",
        7.0,
    )


def test_continual_defaults_are_continual_configs():
    from arl_cli.online import continual_config
    from arl_models.continual import ContinualConfig

    defaults = _defaults("continual")
    options = {
        k: v
        for k, v in defaults.items()
        if k not in ("from_dir", "data", "out", "previous", "naive_from", "threads")
    }
    assert continual_config(**options) == ContinualConfig()
    one = continual_config(**{**options, "ewc_networks": "actor", "seed": 3})
    assert one.ewc.networks == ("actor",) and one.ewc.seed == one.seed == 3


def _signature(module: str, function: str) -> dict:
    import importlib

    fn = getattr(importlib.import_module(module), function)
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}


KEYWORD_DEFAULTS = [
    (("evaluate",), "arl_models.offline", "evaluate_checkpoint", ("episodes", "seed")),
    (
        ("data", "generate"),
        "arl_models.data.generate",
        "generate_dataset",
        ("transitions", "seed", "cost_penalty"),
    ),
    (("data", "import"), "arl_models.data.importers", "import_d4rl", ("quality", "seed")),
    (("data", "import"), "arl_models.data.importers", "import_minari", ("quality", "seed")),
    (("train", "bc"), "arl_models.offline", "train_bc", ("preset", "seed")),
    *(
        (("train", algo), "arl_models.offline", "train_offline_algo", ("preset", "seed", "constrained"))
        for algo in ("cql", "td3bc", "iql", "rebrac")
    ),
    (("train", "offline"), "arl_models.offline", "train_offline", ("preset", "seed", "constrained")),
    (("up",), "tasks.stack", "up", ("prefect_port", "mlflow_port", "deploy", "mlflow_auth")),
    (("doctor",), "arl_models.offline", "train_offline", ("preset",)),
]


@pytest.mark.parametrize(
    "path, module, function, options",
    KEYWORD_DEFAULTS,
    ids=lambda x: " ".join(x) if isinstance(x, tuple) else x,
)
def test_options_default_to_the_library_functions_keywords(path, module, function, options):
    defaults, library_defaults = _defaults(*path), _signature(module, function)
    for option in options:
        assert defaults[option] == library_defaults[option], f"arl {' '.join(path)} --{option}"


def test_doctor_assumes_the_librarys_fine_tuning():
    from arl_models.online import FinetuneConfig
    from arl_models.presets import Preset

    defaults, cfg = _defaults("doctor"), FinetuneConfig()
    assert (defaults["utd"], defaults["envs_per_worker"], defaults["preprocess"]) == (
        cfg.utd,
        cfg.workers.envs_per_worker,
        cfg.preprocess,
    )
    assert defaults["threads"] == next(f.default for f in fields(Preset) if f.name == "threads")


def test_pipeline_run_passes_the_flow_only_what_was_given():
    from arl_cli.pipeline import GATE_OPTIONS, TRAINING_OPTIONS, given
    from flows.params import GateConfig, TrainingConfig

    defaults = _defaults("pipeline", "run")
    for options, model in ((TRAINING_OPTIONS, TrainingConfig), (GATE_OPTIONS, GateConfig)):
        assert set(options.values()) <= set(model.model_fields), f"{model.__name__} lacks a field"
        assert all(defaults[o] is None for o in options), "a flow field's option has a default of its own"
        assert given(defaults, options) == {}
    assert defaults["task"] is None
    assert given({**defaults, "seed": 0, "tolerance": 2.5}, {**TRAINING_OPTIONS, **GATE_OPTIONS}) == {
        "seed": 0,
        "tolerance": 2.5,
    }


def test_pipeline_run_help_states_the_gates_defaults():
    from tasks.registry import GATE

    help_of = {p.name: p.help for p in _command("pipeline", "run").params}
    assert f"the gate's, {GATE.eval_episodes})" in help_of["gate_episodes"]
    assert f"the gate's, {GATE.eval_seed})" in help_of["gate_seed"]
    assert f"the gate's, {GATE.tolerance:g})" in help_of["tolerance"]
    assert f"the gate's, {GATE.max_forgetting:g})" in help_of["max_forgetting"]


@pytest.mark.parametrize(
    "module, name, attrs",
    [
        ("tasks.registry", "GATE", ("eval_episodes", "eval_seed", "tolerance", "max_forgetting")),
        ("tasks.registry", "CHAMPION", ()),
        ("arl_models.data.generate", "QUALITIES", ()),
        ("arl_models.continual", "ContinualConfig", ("log_every", "ewc.weight", "finetune.pid.ki")),
        ("arl_models.online.config", "FinetuneConfig", ("workers.targets.produce_consume", "prioritized")),
    ],
)
def test_the_reader_finds_what_an_import_would(module, name, attrs):
    import importlib

    imported = getattr(importlib.import_module(module), name)
    read = library(module, name)
    if not attrs:
        assert read == imported
    if inspect.isclass(imported):
        imported = imported()
    for attr in attrs:
        assert attrgetter(attr)(read) == attrgetter(attr)(imported), f"{module}.{name}.{attr}"


def test_the_reader_names_what_it_cannot_read(tmp_path, monkeypatch):
    pkg = tmp_path / "arl_reader_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "conf.py").write_text(
        "from dataclasses import dataclass, field\n"
        "from .base import Base\n"
        "LIMIT, NAME = 2**8, 'probe'\n\n"
        "@dataclass\n"
        "class Conf(Base):\n"
        "    size: int = 3\n"
        "    items: list = field(default_factory=list)\n"
        "    limit: int = LIMIT\n\n"
        "def run(x, *, steps=-5, conf=Conf(size=4)):\n"
        "    pass\n"
    )
    (pkg / "base.py").write_text("class Base:\n    inherited: float = 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = library("arl_reader_probe.conf", "Conf")
    assert conf.size == 3 and conf.inherited == 0.5
    assert library("arl_reader_probe.conf", "NAME") == "probe"
    run = library("arl_reader_probe.conf", "run")
    assert run.steps == -5 and run.conf.size == 4 and run.conf.inherited == 0.5
    with pytest.raises(LookupError, match="field"):
        _ = conf.items
    with pytest.raises(LookupError, match=r"2 \*\* 8"):
        _ = conf.limit
    with pytest.raises(AttributeError, match="no default 'missing'"):
        _ = conf.missing
    with pytest.raises(LookupError, match="binds no 'Nothing'"):
        library("arl_reader_probe.conf", "Nothing")
