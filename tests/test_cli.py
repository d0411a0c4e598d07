"""The arl command: --help everywhere, clear errors, and the offline stages end to end on a tiny dataset."""

import json

import pytest
from typer.testing import CliRunner

from arl_cli.main import app

runner = CliRunner()


def _commands(group, prefix=()):
    import typer.main

    cmd = typer.main.get_command(group)
    for name, sub in getattr(cmd, "commands", {}).items():
        yield (*prefix, name)
        if hasattr(sub, "commands"):
            for subname in sub.commands:
                yield (*prefix, name, subname)


@pytest.mark.parametrize("path", list(_commands(app)), ids=" ".join)
def test_every_command_has_help(path):
    res = runner.invoke(app, [*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_train_evaluate_roundtrip(tiny_dataset, tmp_path):
    out = tmp_path / "bc"
    res = runner.invoke(app, ["train", "bc", "--data", str(tiny_dataset), "--out", str(out), "--steps", "10"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["evaluate", "--policy", str(out), "--episodes", "2", "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["episodes"] == 2 and payload["task"] == "safe-pendulum"
    assert {"mean_return", "normalized_score", "mean_cost", "over_budget_share"} <= payload.keys()


def test_train_options_reach_the_config(tiny_dataset, tmp_path):
    for stage in ("bc", "cql"):
        out = tmp_path / stage
        res = runner.invoke(
            app,
            [
                "train",
                stage,
                "--data",
                str(tiny_dataset),
                "--out",
                str(out),
                "--steps",
                "2",
                "--context-dim",
                "1",
                "--context-lr-scale",
                "5",
            ],
        )
        assert res.exit_code == 0, res.output
        assert json.loads((out / "config.json").read_text())["config"]["context_lr_scale"] == 5.0
    res = runner.invoke(
        app,
        [
            "train",
            "cql",
            "--data",
            str(tiny_dataset),
            "--out",
            str(tmp_path / "cw"),
            "--steps",
            "2",
            "--conservative-weight",
            "20",
        ],
    )
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "cw" / "config.json").read_text())["config"]
    assert config["conservative_weight"] == 20.0 and config["context_lr_scale"] == 30.0


def test_train_td3bc_iql_and_the_offline_half(tiny_dataset, tmp_path):
    res = runner.invoke(
        app,
        [
            "train",
            "td3bc",
            "--data",
            str(tiny_dataset),
            "--out",
            str(tmp_path / "t"),
            "--steps",
            "2",
            "--alpha",
            "1.5",
            "--no-constrained",
        ],
    )
    assert res.exit_code == 0, res.output
    config = json.loads((tmp_path / "t" / "config.json").read_text())["config"]
    assert config["alpha"] == 1.5 and config["cost_q_limit"] is None
    res = runner.invoke(
        app,
        [
            "train",
            "iql",
            "--data",
            str(tiny_dataset),
            "--out",
            str(tmp_path / "i"),
            "--steps",
            "2",
            "--beta",
            "1.0",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "i" / "config.json").read_text())["config"]["beta"] == 1.0
    res = runner.invoke(
        app,
        [
            "train",
            "offline",
            "--data",
            str(tiny_dataset),
            "--out",
            str(tmp_path / "o"),
            "--algo",
            "iql",
            "--bc-steps",
            "3",
            "--steps",
            "2",
        ],
    )
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)) == {"bc", "iql"}
    assert json.loads((tmp_path / "o" / "iql" / "config.json").read_text())["init_actor"]["path"] == str(
        tmp_path / "o" / "bc"
    )
    res = runner.invoke(
        app, ["train", "offline", "--data", str(tiny_dataset), "--out", str(tmp_path / "x"), "--algo", "awac"]
    )
    assert res.exit_code == 2 and "unknown offline algorithm 'awac'" in res.output


def test_bad_dataset_gives_a_clear_error(tmp_path):
    res = runner.invoke(app, ["train", "cql", "--data", str(tmp_path), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert "missing dataset.json" in res.output


def test_unknown_quality_is_refused(tmp_path):
    res = runner.invoke(
        app, ["data", "generate", "-t", "safe-pendulum", "-q", "great", "-o", str(tmp_path / "d")]
    )
    assert res.exit_code == 2 and "unknown quality 'great'" in res.output


def test_merge_writes_one_mixed_dataset_and_names_a_missing_part(tiny_dataset, tmp_path):
    res = runner.invoke(
        app, ["data", "merge", str(tiny_dataset), str(tiny_dataset), "-o", str(tmp_path / "m")]
    )
    assert res.exit_code == 0, res.output
    assert "400 transitions, 8 episodes from 2 datasets" in res.output
    res = runner.invoke(
        app, ["data", "merge", str(tiny_dataset), str(tmp_path / "nope"), "-o", str(tmp_path / "m2")]
    )
    assert (
        res.exit_code == 2
        and "nope: not a dataset directory" in res.output
        and not (tmp_path / "m2").exists()
    )


def _option_help(path, option):
    import typer.main

    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return next(p.help for p in cmd.params if option in p.opts)


def _library_defaults():
    from arl_models.algos.ewc import EWCConfig
    from arl_models.presets import get_preset

    demo = get_preset("demo")
    return [
        (("continual",), "--ewc-weight", EWCConfig.weight),
        (("continual",), "--decay", EWCConfig.decay),
        (("train", "cql"), "--conservative-weight", demo.cql.conservative_weight),
        (("train", "cql"), "--context-lr-scale", demo.cql.context_lr_scale),
        (("train", "bc"), "--context-lr-scale", demo.bc.context_lr_scale),
    ]


@pytest.mark.parametrize(
    "path, option, value", _library_defaults(), ids=lambda x: x if isinstance(x, str) else None
)
def test_help_states_the_library_default(path, option, value):
    """The CLI spells a few defaults in its help without importing torch; they must stay the library's."""
    import re

    found = re.search(r"\(default: [^,]*, ([0-9.]+)", _option_help(path, option))
    assert found is not None, f"{option}: no '(default: ..., VALUE' in its help"
    assert float(found[1]) == value, (
        f"{' '.join(path)} {option}: help says {found[1]}, the library's default is {value}"
    )


def test_finetune_options_default_to_the_librarys_config():
    """``arl finetune`` writes its defaults out (no torch at import); each must stay FinetuneConfig's."""
    import inspect

    from arl_cli.online import finetune_cmd
    from arl_models.online import FinetuneConfig

    cfg = FinetuneConfig()
    library = {
        "budget": cfg.cost_budget,
        "kp": cfg.pid.kp,
        "ki": cfg.pid.ki,
        "kd": cfg.pid.kd,
        "workers": cfg.workers.num_workers,
        "backend": cfg.workers.backend,
        "ray_address": cfg.workers.address,
        "sync_every": cfg.workers.sync_every,
        "tune": cfg.workers.tune,
    }
    options = {
        n: p.default
        for n, p in inspect.signature(finetune_cmd).parameters.items()
        if n not in ("from_dir", "out", "task", "data", "restart")
    }
    expected = {n: library[n] if n in library else getattr(cfg, n) for n in options}
    assert options == expected
