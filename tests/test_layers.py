"""The layering rule of DESIGN.md: arl_models never imports the orchestration libraries."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "prefect",
    "mlflow",
    "great_expectations",
    "dvc",
    "boto3",
    "botocore",
    "tasks",
    "flows",
    "arl_cli",
}


def test_arl_models_imports_no_orchestration():
    offenders = []
    for path in (ROOT / "arl_models").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert not offenders, offenders


def test_cli_help_is_fast_and_lazy():
    """`arl --help` must not pull in torch, mlflow or great_expectations."""
    code = (
        "import sys, arl_cli.main; "
        "print(sorted(m for m in ('torch','mlflow','great_expectations','prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
