"""Helpers of the tests that start real servers: free ports, the ``arl`` and Prefect commands, a process
group stopped as a whole, plain HTTP calls that return errors."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venv_exe(name: str) -> str:
    """The path of an executable installed beside this Python (``arl``, ``prefect``, ``python``)."""
    return str(Path(sys.executable).with_name(name))


def run(exe: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [venv_exe(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=420
    )


def arl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run("arl", "pipeline", *args, env=env)


@contextmanager
def process_group(
    args: list[str], log: Path, *, env: dict[str, str], cwd: Path = ROOT
) -> Iterator[subprocess.Popen]:
    """``args`` started in a session of its own, stdout and stderr to ``log``; on leaving, the whole group
    (a server's workers and children too) gets SIGTERM, and SIGKILL if it has not ended within 30 s."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        with suppress(ProcessLookupError):  # the group may have ended on its own
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def call(url: str, method: str = "GET", body: bytes | None = None, **headers: str) -> tuple[int, dict, bytes]:
    """Status, lower-cased headers and body of one request; an HTTP error is an answer, not an exception."""
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def basic(auth_string: str) -> str:
    return "Basic " + base64.b64encode(auth_string.encode()).decode()
