"""The house's shape, enforced: ruff's lint and format at line length 110, and modules and functions small
enough to read in one sitting (docs/design.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("arl_models", "arl_cli", "tasks", "flows")
LINTED = (*CODE, "tests", "benchmarks")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *LINTED], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_lint_and_format_pass() -> None:
    lint = _ruff("check", "--output-format", "concise")
    assert lint.returncode == 0, lint.stdout[-4000:]
    fmt = _ruff("format", "--check")
    assert fmt.returncode == 0, fmt.stdout[-4000:]


def test_modules_and_functions_fit_in_one_sitting() -> None:
    too_long = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            name = path.relative_to(ROOT)
            if text.count("\n") > MAX_MODULE_LINES:
                too_long.append(f"{name}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    if lines > MAX_FUNCTION_LINES:
                        too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, "\n".join(too_long)
