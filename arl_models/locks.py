"""Folders that one process at a time may write: checkpoint folders, the data repository.

A file lock beside the folder (``.<name>.lock``), so it holds across processes on one machine (and on
shared file systems that honour ``flock``), reentrant within a thread.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")


@contextmanager
def folder_lock(folder: str | Path) -> Iterator[None]:
    """Hold ``folder`` against every other process and thread that asks for it: a file lock beside it
    (``.<name>.lock``), reentrant within a thread. A checkpoint folder is written by one run at a time;
    a second run of the same stage waits, then finds the first one's checkpoint."""
    from filelock import FileLock

    folder = Path(folder).resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.parent / f".{folder.name}.lock", is_singleton=True):
        yield


def holding_out(fn: Callable[..., R]) -> Callable[..., R]:
    """Run ``fn`` holding :func:`folder_lock` on its ``out`` argument (a training stage's checkpoint
    folder)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> R:
        with folder_lock(sig.bind(*args, **kw).arguments["out"]):
            return fn(*args, **kw)

    return run
