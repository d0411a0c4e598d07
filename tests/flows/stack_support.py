"""Helpers of the stack tests: free ports, the ``arl`` and Prefect commands, plain HTTP calls that return errors."""

from __future__ import annotations

import base64
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(exe: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = str(Path(sys.executable).with_name(exe))
    return subprocess.run([path, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)


def arl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run("arl", "pipeline", *args, env=env)


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
