"""Validate a dataset directory against the Great Expectations suites in ``expectations/``.

:func:`validate_dataset_dir` is plain Python (usable from a notebook or the CLI); :func:`validate_dataset`
is the Prefect task around it that fails the run with :class:`DataValidationError`. The table is turned
into one flat frame with numpy (``tasks.frames``); both suites run against it through one GX
``Checkpoint`` in an ephemeral context, which also builds Data Docs when a directory is given.

The task's result is cached under the dataset's content digest and the suites' digest
(:func:`validation_key`): the pipeline validating the version that ``ingest_flow`` validated minutes ago
(the same bytes, pulled by DVC) reads the recorded verdict instead of running GX again. Only a pass is
recorded; a failing or unreadable dataset is judged afresh every time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from arl_models.data.dataset import DatasetError, content_digest, read_info, read_table
from tasks.frames import INDEX_COLUMNS, run_parameters, validation_frame

SUITES = ("metadata", "transitions")
MAX_EXAMPLES = 5
_VALIDATION_CODE = ("validate.py", "frames.py")
"""Files beside this one whose code decides the verdict (with ``expectations/``), part of the suites'
digest."""


class DataValidationError(Exception):
    """A dataset failed validation; the message lists each failing expectation, column and examples."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.summary())


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's verdict, with a few offending values and the rows (episode_id, step) they sit in."""

    suite: str
    expectation: str
    column: str | None
    success: bool
    unexpected_count: int = 0
    examples: list[Any] = field(default_factory=list)
    example_rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    expected: str | None = None
    """What the expectation allows, as text (``one of [...]``, ``between -2.0 and 2.0``)."""

    def describe(self) -> str:
        where = f" on column {self.column!r}" if self.column else ""
        if self.error:
            return f"{self.suite}: {self.expectation}{where} raised: {self.error}"
        rows = f" at rows {self.example_rows}" if self.example_rows else ""
        expected = f"; expected {self.expected}" if self.expected else ""
        return (
            f"{self.suite}: {self.expectation}{where}: {self.unexpected_count} unexpected, "
            f"e.g. {self.examples}{rows}{expected}"
        )


@dataclass(frozen=True)
class ValidationReport:
    path: str
    success: bool
    results: list[ExpectationOutcome]
    num_rows: int
    seconds: float
    data_docs: str | None = None
    """``index.html`` of the Data Docs site, when one was built."""

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [r for r in self.results if not r.success]

    def summary(self) -> str:
        if self.success:
            return f"{self.path}: {len(self.results)} expectations passed on {self.num_rows} rows"
        lines = [f"{self.path}: {len(self.failures)} of {len(self.results)} expectations failed:"]
        lines += [f"  - {f.describe()}" for f in self.failures]
        if self.data_docs:
            lines.append(f"  Data Docs: {self.data_docs}")
        return "\n".join(lines)


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones, so reports serialise to JSON."""
    return value.item() if hasattr(value, "item") else value


def _row_id(value: Any) -> Any:
    """Index columns are floats in the frame (NaN for nulls); show whole numbers as int."""
    value = _plain(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _distinct(values: list[Any]) -> list[Any]:
    """``values`` without repeats, in order (a sidecar's value sits on every row)."""
    return [v for i, v in enumerate(values) if v not in values[:i]]


def _expected(kwargs: dict[str, Any]) -> str | None:
    """The allowed values of a set or range expectation (parameters already substituted), as text."""
    if isinstance(kwargs.get("value_set"), list | tuple | set):
        values = list(kwargs["value_set"])
        if len(values) <= 3:
            return f"one of {values}"
        return f"one of {len(values)} values: {', '.join(map(str, values[:3]))}, ..."
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and low == high:
        return f"{low}"
    if low is not None and high is not None:
        return f"between {low} and {high}"
    if low is not None or high is not None:
        return f">= {low}" if low is not None else f"<= {high}"
    return None


def _outcome(suite: str, res: Any) -> ExpectationOutcome:
    cfg = res.expectation_config
    column = cfg.kwargs.get("column")
    exc = res.exception_info or {}
    if exc.get("raised_exception"):
        return ExpectationOutcome(suite, cfg.type, column, False, error=str(exc.get("exception_message")))
    result = res.result or {}
    rows = result.get("partial_unexpected_index_list") or []
    rows = [{k: _row_id(v) for k, v in r.items() if k in INDEX_COLUMNS} for r in rows if isinstance(r, dict)]
    return ExpectationOutcome(
        suite=suite,
        expectation=cfg.type,
        column=column,
        success=bool(res.success),
        unexpected_count=int(result.get("unexpected_count") or 0),
        examples=_distinct([_plain(v) for v in result.get("partial_unexpected_list") or []])[:MAX_EXAMPLES],
        example_rows=rows[:MAX_EXAMPLES],
        expected=_expected(cfg.kwargs),
    )


def _add_docs_site(context: Any, data_docs_dir: Path) -> str:
    site = "arl_local_site"
    context.add_data_docs_site(
        site_name=site,
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(data_docs_dir.resolve()),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    return site


def _checkpoint(context: Any, action_dim: int, data_docs_dir: Path | None) -> Any:
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction

    from expectations import build_suite

    batch = (
        context.data_sources.add_pandas("arl")
        .add_dataframe_asset("transitions")
        .add_batch_definition_whole_dataframe("all_rows")
    )
    definitions = []
    for name in SUITES:
        suite = context.suites.add(build_suite(name, action_dim=action_dim))
        definitions.append(
            context.validation_definitions.add(
                gx.ValidationDefinition(name=f"arl_{name}", data=batch, suite=suite)
            )
        )
    actions = []
    if data_docs_dir is not None:
        actions.append(
            UpdateDataDocsAction(name="data_docs", site_names=[_add_docs_site(context, data_docs_dir)])
        )
    result_format = {
        "result_format": "SUMMARY",
        "partial_unexpected_count": MAX_EXAMPLES,
        "unexpected_index_column_names": list(INDEX_COLUMNS),
    }
    return context.checkpoints.add(
        gx.Checkpoint(
            name="arl_dataset",
            validation_definitions=definitions,
            actions=actions,
            result_format=result_format,
        )
    )


def _ephemeral_context() -> Any:
    """An in-memory GX context without progress bars or its INFO line about a temporary docs directory."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def validate_dataset_dir(path: str | Path, *, data_docs_dir: str | Path | None = None) -> ValidationReport:
    """Run both suites on the dataset at ``path``; build Data Docs into ``data_docs_dir`` if given.

    A sidecar or Parquet file that cannot be read at all raises :class:`DatasetError`; everything the
    suites can judge comes back in the report.
    """
    t0 = time.perf_counter()
    path = Path(path)
    info = read_info(path)
    table = read_table(path)
    frame = validation_frame(table, info)
    docs = Path(data_docs_dir) if data_docs_dir is not None else None
    checkpoint = _checkpoint(_ephemeral_context(), info.action_dim, docs)
    run = checkpoint.run(batch_parameters={"dataframe": frame}, expectation_parameters=run_parameters(info))
    outcomes = []
    for vr in run.run_results.values():
        suite = vr.suite_name.removeprefix("arl_")
        outcomes += [_outcome(suite, r) for r in vr.results]
    index = docs / "index.html" if docs is not None else None
    return ValidationReport(
        path=str(path),
        success=bool(run.success),
        results=outcomes,
        num_rows=table.num_rows,
        seconds=time.perf_counter() - t0,
        data_docs=str(index) if index is not None and index.is_file() else None,
    )


def suites_digest() -> str:
    """sha256 of what judges a dataset: both suite files, the code that builds the frame, the GX version."""
    from importlib.metadata import version

    import expectations

    h = hashlib.sha256(version("great_expectations").encode())
    for name in SUITES:
        h.update(json.dumps(expectations.raw_suite(name), sort_keys=True).encode())
    for f in (Path(expectations.__file__), *(Path(__file__).with_name(n) for n in _VALIDATION_CODE)):
        h.update(f.read_bytes())
    return h.hexdigest()


def validation_key(path: str | Path, data_docs_dir: str | None = None) -> str:
    """Identical bytes judged by identical suites (and Data Docs built into the same place) get one
    verdict."""
    docs = hashlib.sha256(str(data_docs_dir or "").encode()).hexdigest()[:12]
    return f"arl-validate-{content_digest(path)}-{suites_digest()[:16]}-{docs}"


def _validation_key(context: Any, parameters: dict[str, Any]) -> str:
    return validation_key(parameters["path"], parameters.get("data_docs_dir"))


@task(
    name="validate_dataset",
    task_run_name="validate {path}",
    cache_key_fn=_validation_key,
    persist_result=True,
    result_serializer="json",  # a cache hit reads JSON back: a persisted result is never unpickled
    retries=0,
)
def validate_dataset(path: str, data_docs_dir: str | None = None) -> dict[str, Any]:
    """Prefect task: validate, log the verdict, raise :class:`DataValidationError` on failure.

    Returns a small serialisable summary (path, rows, expectations, data docs, when it was validated) for
    downstream tasks; a cache hit returns the summary recorded when these bytes passed.
    """
    logger = get_run_logger()
    try:
        report = validate_dataset_dir(path, data_docs_dir=data_docs_dir)
    except DatasetError as e:
        logger.error("dataset %s cannot be read: %s", path, e)
        raise
    if not report.success:
        logger.error(report.summary())
        raise DataValidationError(report)
    logger.info("%s (%.1f s)", report.summary(), report.seconds)
    return {
        "path": report.path,
        "num_rows": report.num_rows,
        "expectations": len(report.results),
        "data_docs": report.data_docs,
        "validated": True,
        "validated_at": datetime.now(UTC).isoformat(),
        "seconds": report.seconds,
    }
