"""Dataset names are safe slugs at every entry point; nothing outside the data repository is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tasks.data import UnsafeDatasetPath, check_dataset_path, dataset_dir, flow_data_repo

TRAVERSALS = [
    "../../victim",
    "../victim",
    "/tmp/victim",
    "a/../../victim",
    ".git",
    ".dvc",
    "x.dvc",
    "",
    "a//b",
    "./x",
    "-rf",
    "na me",
    "a\\..\\b",
    "..",
    "~/victim",
]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_unsafe_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(UnsafeDatasetPath, match="is not allowed; a dataset name is letters, digits"):
        check_dataset_path(name)


@pytest.mark.parametrize("name", ["tiny", "safe-hopper-1.1.0-medium", "pend_v1.1", "data/new", "A1"])
def test_plain_names_and_nested_paths_are_kept(name: str, tmp_path: Path) -> None:
    assert dataset_dir(tmp_path, name) == tmp_path.resolve() / name


def test_a_symlink_out_of_the_repo_is_refused(tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (repo / "escape").symlink_to(outside)
    with pytest.raises(UnsafeDatasetPath, match="outside the data repository"):
        dataset_dir(repo, "escape")


@pytest.mark.parametrize("name", ["../../victim", "../victim", ".git"])
def test_flow_parameters_refuse_traversal(name: str) -> None:
    """What Prefect runs on every flow run, whether started from the UI, the API or an event's trigger."""
    from prefect.exceptions import ParameterTypeError

    from flows.ingest import ingest_flow
    from flows.offline_to_online import offline_to_online_flow
    from flows.retrain import retrain_on_new_data_flow

    with pytest.raises(ParameterTypeError, match="is not allowed"):
        ingest_flow.validate_parameters({"source": {"kind": "import", "source": "/tmp/x", "name": name}})
    for flow in (offline_to_online_flow, retrain_on_new_data_flow):
        with pytest.raises(ParameterTypeError, match="is not allowed"):
            flow.validate_parameters({"dataset": {"path": name}})


def test_a_flow_never_makes_a_directory_into_a_data_repo(tmp_path: Path) -> None:
    with pytest.raises(UnsafeDatasetPath, match="is not a data repository"):
        flow_data_repo(str(tmp_path), tmp_path / "default")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_push_with_a_traversal_name_deletes_nothing(good_dataset: Path, tmp_path: Path) -> None:
    from arl_cli.main import app

    repo = tmp_path / "home" / "data"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    res = CliRunner().invoke(
        app,
        [
            "data",
            "push",
            str(good_dataset),
            "--name",
            "../victim",
            "--repo",
            str(repo),
            "--no-validate",
            "--no-event",
            "--remote",
            str(tmp_path / "remote"),
        ],
    )
    assert res.exit_code == 2 and "'..' is not allowed" in res.output
    assert (victim / "keep.txt").read_text() == "precious"
    assert not repo.exists()


def test_pipeline_run_refuses_a_traversal_dataset_before_starting() -> None:
    from arl_cli.main import app

    res = CliRunner().invoke(app, ["pipeline", "run", "--dataset", "../../victim"])
    assert res.exit_code == 2 and "'..' is not allowed" in res.output
