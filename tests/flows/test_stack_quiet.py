"""A command run without ``arl up`` ends with its own summary: the temporary Prefect server it started is
stopped before, its queued logs sent first (slow: a real temporary server)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from stack_support import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = """
from prefect import flow, get_run_logger

from tasks.stack import stop_temporary_server

print("before:", stop_temporary_server())  # no server yet: nothing to stop


@flow
def tiny() -> int:
    for i in range(3):
        get_run_logger().info("working %d", i)
    return 3


tiny()
print("stopped:", stop_temporary_server())
print("SUMMARY")
"""


def test_the_summary_is_the_last_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PYTHONUNBUFFERED": "1",  # one stream, in the order it was written
        "OMP_NUM_THREADS": "1",
    }
    (tmp_path / "prefect").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=420,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, done.stdout
    assert "before: False" in lines and "stopped: True" in lines, lines
    assert lines[-1] == "SUMMARY" and any("Stopping temporary server" in line for line in lines), lines
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:  # the flow's logs reached the server
        logged = [m for (m,) in db.execute("select message from log")]
    assert [m for m in logged if m.startswith("working")] == ["working 0", "working 1", "working 2"]
