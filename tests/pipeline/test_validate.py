"""Great Expectations really runs: good data passes, each broken property fails under the right name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_data import make_dataset, make_transitions

from arl_models.data.dataset import SIDECAR_FILE, TRANSITIONS_FILE, Transitions
from tasks.validate import DataValidationError, validate_dataset, validate_dataset_dir


def _failures(path: Path) -> set[tuple[str, str | None]]:
    report = validate_dataset_dir(path)
    assert not report.success
    return {(f.expectation, f.column) for f in report.failures}


def _set_column(path: Path, name: str, values: pa.Array) -> None:
    table = pq.read_table(path / TRANSITIONS_FILE)
    i = table.column_names.index(name)
    pq.write_table(table.set_column(i, name, values), path / TRANSITIONS_FILE)


def test_good_dataset_passes_and_builds_data_docs(good_dataset: Path, tmp_path: Path) -> None:
    report = validate_dataset_dir(good_dataset, data_docs_dir=tmp_path / "docs")
    assert report.success, report.summary()
    assert report.num_rows == 100
    assert len(report.results) >= 30
    assert report.data_docs and Path(report.data_docs).is_file()
    assert "arl_transitions" in Path(report.data_docs).read_text()


def _break(field: str, fn: Callable[[np.ndarray], None]) -> Callable[[Transitions], None]:
    return lambda t: fn(getattr(t, field))


REGEX, BETWEEN, IN_SET = (
    "expect_column_values_to_match_regex",
    "expect_column_values_to_be_between",
    "expect_column_values_to_be_in_set",
)

BROKEN = {
    "env_version not semver": (
        _break("env_version", lambda a: a.__setitem__(5, "1.0")),
        REGEX,
        "env_version",
    ),
    "policy_hash not hex": (
        _break("policy_hash", lambda a: a.__setitem__(7, "XYZ123456")),
        REGEX,
        "policy_hash",
    ),
    "policy_hash too short": (_break("policy_hash", lambda a: a.__setitem__(7, "abc")), REGEX, "policy_hash"),
    "seed negative": (_break("random_seed", lambda a: a.__setitem__(0, -1)), BETWEEN, "random_seed"),
    "seed above uint32": (_break("random_seed", lambda a: a.__setitem__(0, 2**32)), BETWEEN, "random_seed"),
    "timestamp not UTC": (
        _break("timestamp", lambda a: a.__setitem__(3, "2026-01-02T03:04:05+02:00")),
        REGEX,
        "timestamp",
    ),
    "timestamp in the future": (
        _break("timestamp", lambda a: a.__setitem__(3, "2999-01-01T00:00:00Z")),
        BETWEEN,
        "timestamp_epoch_s",
    ),
    "timestamp not a date": (
        _break("timestamp", lambda a: a.__setitem__(3, "2026-13-45T00:00:00Z")),
        "expect_column_values_to_not_be_null",
        "timestamp_epoch_s",
    ),
    "obs NaN": (_break("obs", lambda a: a.__setitem__((4, 1), np.nan)), IN_SET, "obs_finite"),
    "next_obs inf": (_break("next_obs", lambda a: a.__setitem__((4, 0), np.inf)), IN_SET, "next_obs_finite"),
    "reward NaN": (_break("reward", lambda a: a.__setitem__(9, np.nan)), IN_SET, "reward_finite"),
    "cost inf": (_break("cost", lambda a: a.__setitem__(9, -np.inf)), IN_SET, "cost_finite"),
    "action above bound": (_break("action", lambda a: a.__setitem__((2, 0), 2.5)), BETWEEN, "action_0"),
    "action below bound": (_break("action", lambda a: a.__setitem__((2, 0), -3.0)), BETWEEN, "action_0"),
    "step skips": (
        _break("step", lambda a: a.__setitem__(slice(30, 50), a[30:50] + 1)),
        IN_SET,
        "step_delta",
    ),
    "done mid-episode": (_break("terminated", lambda a: a.__setitem__(10, True)), IN_SET, "done_before_end"),
}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_each_broken_property_fails_with_its_expectation(case: str, tmp_path: Path) -> None:
    breaker, expectation, column = BROKEN[case]
    t = make_transitions()
    breaker(t)
    assert _failures(make_dataset(tmp_path / "ds", t)) == {(expectation, column)}


def test_action_nan_is_not_finite(tmp_path: Path) -> None:
    t = make_transitions()
    t.action[6, 0] = np.nan
    assert ("expect_column_values_to_be_in_set", "action_finite") in _failures(
        make_dataset(tmp_path / "d", t)
    )


def test_episodes_not_contiguous(tmp_path: Path) -> None:
    t = make_transitions()
    order = np.r_[5:100, 0:5]  # episode 0's first rows moved to the end
    assert _failures(make_dataset(tmp_path / "ds", t.select(order))) == {(IN_SET, "episode_runs")}


@pytest.mark.parametrize("column", ["env_version", "policy_hash", "random_seed", "timestamp"])
def test_missing_metadata_values_fail_not_null(column: str, good_dataset: Path) -> None:
    col = pq.read_table(good_dataset / TRANSITIONS_FILE).column(column).to_pylist()
    col[11] = None
    _set_column(good_dataset, column, pa.array(col))
    assert ("expect_column_values_to_not_be_null", column) in _failures(good_dataset)


def test_non_boolean_flag_fails_type(good_dataset: Path) -> None:
    _set_column(good_dataset, "truncated", pa.array(np.zeros(100, dtype=np.int8)))
    assert ("expect_column_values_to_be_of_type", "truncated") in _failures(good_dataset)


def test_missing_column_is_reported(good_dataset: Path) -> None:
    table = pq.read_table(good_dataset / TRANSITIONS_FILE).drop_columns(["policy_hash"])
    pq.write_table(table, good_dataset / TRANSITIONS_FILE)
    assert ("expect_column_to_exist", "policy_hash") in _failures(good_dataset)


def test_row_count_must_match_sidecar(good_dataset: Path) -> None:
    sidecar = good_dataset / SIDECAR_FILE
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "num_transitions": 99}))
    assert _failures(good_dataset) == {("expect_table_row_count_to_equal", None)}


def test_report_names_rows_and_values(tmp_path: Path) -> None:
    t = make_transitions()
    t.action[27, 0] = 4.0  # episode 1, step 2
    report = validate_dataset_dir(make_dataset(tmp_path / "ds", t))
    (failure,) = report.failures
    assert failure.examples == [4.0]
    assert failure.example_rows == [{"episode_id": 1, "step": 2}]
    assert "action_0" in report.summary() and "4.0" in report.summary()


def test_task_raises_with_failing_expectations(tmp_path: Path) -> None:
    from prefect.logging import disable_run_logger

    t = make_transitions()
    t.policy_hash[0] = "not-hex"
    path = make_dataset(tmp_path / "ds", t)
    with disable_run_logger(), pytest.raises(DataValidationError) as err:
        validate_dataset.fn(str(path))
    assert "policy_hash" in str(err.value) and "not-hex" in str(err.value)
    assert err.value.report.failures[0].column == "policy_hash"


def test_task_returns_summary_on_good_data(good_dataset: Path) -> None:
    from prefect.logging import disable_run_logger

    with disable_run_logger():
        out = validate_dataset.fn(str(good_dataset))
    assert out["validated"] and out["num_rows"] == 100
    json.dumps(out)


@pytest.mark.slow
def test_a_million_rows_validate_in_seconds(tmp_path: Path) -> None:
    path = make_dataset(tmp_path / "big", make_transitions(n_episodes=1000, ep_len=1000))
    report = validate_dataset_dir(path)
    assert report.success and report.num_rows == 1_000_000
    assert report.seconds < 30, report.seconds  # ~2 s on one idle core; generous for busy CI machines
