"""Shared fixtures for the infra/ checks: one render of the example settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from infra_support import FAKE_TF_OUTPUTS

from arl_cli.infra import INFRA_DIR, render


@pytest.fixture(scope="session")
def settings() -> dict:
    return yaml.safe_load((INFRA_DIR / "settings.example.yaml").read_text())


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    outputs = out / "terraform-outputs.json"
    outputs.write_text(json.dumps(FAKE_TF_OUTPUTS))
    render(INFRA_DIR / "settings.example.yaml", out, outputs)
    return out
