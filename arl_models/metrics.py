"""How the algorithms report metrics without knowing who listens.

The library calls ``sink.log(metrics, step)`` with flat ``{name: float}`` dicts (names namespaced
``train/loss_critic``, ``eval/return``...). The pipeline passes an MLflow-backed sink; a notebook can
pass :class:`ListSink` or nothing at all. The library never imports MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class MetricSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...


class NullSink:
    def log(self, metrics: dict[str, float], step: int) -> None:
        pass


class ListSink:
    """Keeps everything in memory: ``sink.history[name] -> [(step, value), ...]``."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.history.setdefault(k, []).append((step, float(v)))

    def last(self, name: str) -> float:
        return self.history[name][-1][1]


class JsonlSink:
    """Appends one JSON line per call to a file (the checkpoint directory's ``metrics.jsonl``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")


class FanoutSink:
    def __init__(self, *sinks: MetricSink | None):
        self.sinks = [s for s in sinks if s is not None]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for s in self.sinks:
            s.log(metrics, step)
