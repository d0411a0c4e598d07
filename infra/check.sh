#!/usr/bin/env bash
# Offline checks of infra/: terraform fmt, checkov (own venv), and pytest tests/infra.
# Run from the repository root:  bash infra/check.sh
# VENV (default .venv) is the project's environment; checkov lives in .venv-checkov
# because it ships its own `hcl2` module that clashes with python-hcl2.
set -uo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
CHECKOV_VENV="${CHECKOV_VENV:-.venv-checkov}"
CHECKOV_VERSION="3.3.30"
PYTHON="${PYTHON:-python3.11}"
failed=0

step() { printf '\n== %s\n' "$*"; }

step "terraform fmt -check"
if command -v terraform >/dev/null 2>&1; then
  terraform fmt -check -recursive infra/terraform || { echo "FAIL: run 'terraform fmt -recursive infra/terraform'"; failed=1; }
else
  echo "SKIP: terraform not installed (only this step is skipped)"
fi

step "checkov ${CHECKOV_VERSION} on infra/terraform and infra/k8s"
if [ "$("$CHECKOV_VENV/bin/checkov" --version 2>/dev/null)" != "$CHECKOV_VERSION" ]; then
  "$PYTHON" -m venv "$CHECKOV_VENV" &&
    "$CHECKOV_VENV/bin/python" -m pip install -q --disable-pip-version-check "checkov==${CHECKOV_VERSION}" ||
    { echo "FAIL: could not install checkov"; failed=1; }
fi
if [ -x "$CHECKOV_VENV/bin/checkov" ]; then
  # BC_* variables keep checkov from calling home; the scan itself is local.
  for dir in infra/terraform infra/k8s; do
    BC_SKIP_MAPPING=TRUE "$CHECKOV_VENV/bin/checkov" --config-file infra/.checkov.yaml -d "$dir" 2>/dev/null ||
      { echo "FAIL: checkov reported failed checks in $dir"; failed=1; }
  done
fi

step "pytest tests/infra"
"$VENV/bin/python" -m pytest tests/infra -q || failed=1

if [ "$failed" -ne 0 ]; then
  echo "infra checks FAILED"
  exit 1
fi
echo "infra checks passed"
