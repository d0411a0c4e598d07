"""Bad data never trains: every dataset of the broken corpus (``tests/broken_datasets.py``) is refused by
``arl data validate`` and by ``arl train bc`` with an error that names the problem, and nothing is written.

The real suites and readers run; nothing is stubbed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arl_cli.main import app
from tests.broken_datasets import BROKEN, write_valid

runner = CliRunner()


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_valid(tmp_path_factory.mktemp("valid") / "ds")


@pytest.fixture(autouse=True)
def _no_gx_analytics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_corpus_is_large_and_its_base_is_valid(valid: Path) -> None:
    assert len(BROKEN) >= 30
    res = runner.invoke(app, ["data", "validate", str(valid)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_broken_dataset_is_refused_by_validate_and_train(case: str, valid: Path, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(valid, data)
    BROKEN[case].breaks(data)
    word = BROKEN[case].word
    before = _files(tmp_path)

    res = runner.invoke(app, ["data", "validate", str(data)])
    assert res.exit_code != 0, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # an error message, not a traceback
    assert word in res.output, res.output

    out = tmp_path / "out"
    res = runner.invoke(app, ["train", "bc", "--data", str(data), "--out", str(out), "--steps", "2"])
    assert res.exit_code != 0, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    assert word in res.output, res.output
    assert not out.exists()
    assert _files(tmp_path) == before  # validation wrote nothing, not even beside the dataset


@pytest.mark.parametrize("case", ["obs widths shifted", "0 rows"])
def test_data_info_refuses_what_the_readers_cannot_use(case: str, valid: Path, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    shutil.copytree(valid, data)
    BROKEN[case].breaks(data)
    res = runner.invoke(app, ["data", "info", str(data)])
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    assert {"obs widths shifted": "column 'obs'", "0 rows": "0 rows"}[case] in res.output, res.output


@pytest.mark.parametrize(
    "content", [b"not an HDF5 file", b"\x89HDF\r\n\x1a\n" + bytes(100)], ids=["text", "truncated"]
)
def test_importers_name_an_unreadable_file(content: bytes, tmp_path: Path) -> None:
    from arl_models.data import DatasetError
    from arl_models.data.importers import import_d4rl

    src = tmp_path / "data.hdf5"
    src.write_bytes(content)
    with pytest.raises(DatasetError, match="data.hdf5: cannot read the HDF5 file"):
        import_d4rl(src, "safe-pendulum", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_importers_refuse_an_empty_file(tmp_path: Path) -> None:
    import h5py
    import numpy as np

    from arl_models.data import DatasetError
    from arl_models.data.importers import import_d4rl

    src = tmp_path / "empty.hdf5"
    with h5py.File(src, "w") as f:
        for key, shape in (
            ("observations", (0, 3)),
            ("actions", (0, 1)),
            ("rewards", (0,)),
            ("terminals", (0,)),
            ("timeouts", (0,)),
        ):
            f[key] = np.zeros(shape, np.float32)
    with pytest.raises(DatasetError, match="0 transitions"):
        import_d4rl(src, "safe-pendulum", tmp_path / "out")
