"""The arl command: --help everywhere, clear errors, and the offline stages end to end on a tiny dataset."""

import json

import pytest
import typer.main
from typer.testing import CliRunner

from arl_cli.main import app

runner = CliRunner()


def _commands(group, prefix=()):
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


def _leaves(cmd, prefix=()):
    for name, sub in getattr(cmd, "commands", {}).items():
        if hasattr(sub, "commands"):
            yield from _leaves(sub, (*prefix, name))
        else:
            yield (*prefix, name), sub


LEAVES = dict(_leaves(typer.main.get_command(app)))


@pytest.mark.parametrize("path", list(LEAVES), ids=" ".join)
def test_help_reads_cleanly(path):
    """A summary line, every option explained, flags without a value placeholder, no reST markup."""
    cmd = LEAVES[path]
    summary = cmd.help.split("\n\n")[0]
    assert "\n" not in summary.strip(), f"{path}: the summary is broken over lines in the command list"
    undocumented = [p.name for p in cmd.params if not p.help]
    assert not undocumented, f"arl {' '.join(path)}: no help for {undocumented}"
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "110"})
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output and "``" not in res.output, res.output


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


def test_pipeline_summary_shows_score_and_cost_beside_the_datas(tiny_dataset, capsys):
    """Each stage's line and the data's carry a score and an episode cost, so the lift and its price show;
    the evaluation names the policy it judged (fine-tuning hands over ``best/``)."""
    from arl_cli.pipeline import _print_result
    from arl_models.data import read_dataset

    t, _ = read_dataset(tiny_dataset)
    stage = {
        "steps": 10,
        "checkpoint": "ckpt/bc",
        "metrics": {"eval/normalized_score": 12.34, "eval/cost": 5.67},
    }
    _print_result(
        {
            "dataset": {"dir": str(tiny_dataset)},
            "stages": {"bc": stage},
            "evaluation": {
                "score": 12.3,
                "mean_cost": 5.7,
                "cost_budget": 10.0,
                "policy": "runs/x/finetune-1/best",
                "episodes": 50,
            },
            "decision": {"promoted": True, "model": "m", "version": 1, "alias": "champion", "reason": "ok"},
            "run_id": "r",
            "tracking_uri": "sqlite:///x",
        }
    )
    lines = capsys.readouterr().out.splitlines()
    data = next(line for line in lines if line.strip().startswith("data"))
    assert f"cost {t.episode_costs().mean():6.1f}" in data
    bc = next(line for line in lines if line.strip().startswith("bc"))
    assert "score   12.3" in bc and "cost    5.7" in bc
    assert "  evaluation of finetune-1/best (50 episodes): score 12.3, mean cost 5.7 (budget 10)" in lines
