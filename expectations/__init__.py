"""Great Expectations suites for arl datasets, kept as data (JSON) beside this loader.

Two suites: ``metadata`` (the data-version columns every row carries) and ``transitions`` (the file's
schema, each row's vector widths, finite numbers, non-negative costs, actions inside the task's action
space, boolean flags, episodes that start at step 0 and count up by one, a sidecar naming a registered
task version with that task's spaces). Several expectations look at *derived* columns (``obs_finite``,
``episode_runs``, ``sidecar_spaces``...) that ``tasks.frames`` computes with numpy before validation;
each suite's ``meta`` documents them.

Values known only at validation time are suite parameters (``{"$PARAMETER": name}``), passed to GX as
``expectation_parameters``: the current time for "not in the future" and the action bounds from
``dataset.json``. An expectation marked ``meta.for_each_action_dim`` is a template: ``{i}`` in its
column and parameter names is expanded once per action dimension by :func:`suite_dict`.

This module imports only the standard library; :func:`build_suite` imports Great Expectations lazily.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any

SUITE_FILES = {"metadata": "metadata_suite.json", "transitions": "transitions_suite.json"}
TEMPLATE_FLAG = "for_each_action_dim"


def raw_suite(name: str) -> dict[str, Any]:
    """The suite file ``name`` (``metadata`` or ``transitions``) as parsed JSON, templates unexpanded."""
    if name not in SUITE_FILES:
        raise KeyError(f"unknown suite {name!r}; known: {sorted(SUITE_FILES)}")
    text = resources.files(__package__).joinpath(SUITE_FILES[name]).read_text()
    return json.loads(text)


def _fill(value: Any, i: int) -> Any:
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, dict):
        return {k: _fill(v, i) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, i) for v in value]
    return value


def suite_dict(name: str, *, action_dim: int = 0) -> dict[str, Any]:
    """The suite with per-action-dimension templates expanded for ``action_dim`` dimensions."""
    raw = raw_suite(name)
    expanded: list[dict[str, Any]] = []
    for exp in raw["expectations"]:
        meta = exp.get("meta", {})
        if not meta.get(TEMPLATE_FLAG):
            expanded.append(exp)
            continue
        for i in range(action_dim):
            one = _fill(copy.deepcopy(exp), i)
            one["meta"] = {k: v for k, v in one.get("meta", {}).items() if k != TEMPLATE_FLAG}
            one["meta"]["action_dim_index"] = i
            expanded.append(one)
    return {**raw, "expectations": expanded}


def suite_parameters(name: str, *, action_dim: int = 0) -> list[str]:
    """Names of the ``$PARAMETER`` values the expanded suite needs at validation time."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "$PARAMETER" in value:
                found.append(value["$PARAMETER"])
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for exp in suite_dict(name, action_dim=action_dim)["expectations"]:
        walk(exp.get("kwargs", {}))
    return sorted(set(found))


def build_suite(name: str, *, action_dim: int = 0) -> Any:
    """A ``great_expectations.core.ExpectationSuite`` built from the expanded suite file."""
    from great_expectations.core import ExpectationSuite

    d = suite_dict(name, action_dim=action_dim)
    return ExpectationSuite(name=d["name"], expectations=d["expectations"], meta=d.get("meta"))


__all__ = ["SUITE_FILES", "build_suite", "raw_suite", "suite_dict", "suite_parameters"]
