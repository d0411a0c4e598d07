"""Environment workers as Ray actors (optional extra ``ray``): the same :class:`Collector` as a process.

``RayPool(spec, n)`` starts Ray on this machine when no address is given (a local Ray instance with
as many CPUs as the machine or the workers need, no dashboard), or attaches to a running cluster, a
KubeRay ``RayCluster`` included, with ``address="ray://<head>:10001"`` (or ``"auto"`` on a cluster
node). The project must be importable on the cluster's workers (the image of ``infra/``).

Each actor has one ``collect`` call in flight; :meth:`poll` takes whichever have finished (``ray.wait``
with a timeout) and submits the next at once. Weights go into the object store once per version
(``ray.put``) and travel by reference; an actor fetches them only when its version is behind. An
actor that died (``RayActorError``) is replaced by a new incarnation.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from arl_models.workers.collector import Chunk, Collector, WorkerSpec
from arl_models.workers.pool import WorkerPool

try:
    import ray
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the Ray backend needs the optional extra: pip install 'arl[ray]'") from e


class _Actor:
    """The body of a Ray actor: a :class:`Collector` that loads weights by reference when behind."""

    def __init__(self, spec: WorkerSpec, worker: int, incarnation: int):
        self.collector = Collector(spec, worker, incarnation)

    def collect(self, weights: list[Any], version: int) -> Chunk:
        if version != self.collector.version:
            self.collector.load(ray.get(weights[0]), version)
        return self.collector.collect()

    def pid(self) -> int:
        return os.getpid()


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Start local Ray (``address`` None) or connect to a cluster, once per process."""
    if ray.is_initialized():
        return
    os.environ.setdefault(
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0"
    )  # CPU workers: leave device variables alone
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address is None:
        kw["num_cpus"] = max(os.cpu_count() or 1, num_cpus or 1)
    ray.init(address=address, **kw)


class RayPool(WorkerPool):
    """Workers as Ray actors, local or on a cluster."""

    def __init__(
        self, spec: WorkerSpec, num_workers: int, address: str | None = None, max_workers: int | None = None
    ):
        super().__init__(spec, num_workers)
        ensure_ray(address, max(num_workers, max_workers or 0) + 1)
        self._remote = ray.remote(num_cpus=1)(_Actor)
        self._actors: dict[int, Any] = {}
        self._inflight: dict[Any, int] = {}
        self._weights: list[Any] = []

    def _submit(self, worker: int) -> None:
        ref = self._actors[worker].collect.remote(self._weights, self.version)
        self._inflight[ref] = worker

    def _start_worker(self, worker: int, incarnation: int) -> None:
        self._actors[worker] = self._remote.remote(self.spec, worker, incarnation)
        if self._weights:
            self._submit(worker)

    def _stop_worker(self, worker: int) -> None:
        actor = self._actors.pop(worker)
        for ref in [r for r, w in self._inflight.items() if w == worker]:
            del self._inflight[ref]
        ray.kill(actor, no_restart=True)

    def _publish(self, flat: np.ndarray, version: int) -> None:
        first = not self._weights
        self._weights = [ray.put(flat)]
        if first:
            for w in self._actors:
                self._submit(w)

    def _receive(self, timeout: float) -> tuple[list[Chunk], list[int]]:
        if not self._inflight:
            return [], []
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)  # the first, waiting at most `timeout`
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # and whatever else is done
        chunks, dead = [], []
        for ref in ready:
            w = self._inflight.pop(ref)
            try:
                chunks.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                dead.append(w)
                continue
            self._submit(w)
        return chunks, dead

    def kill(self, worker: int) -> None:
        """Kill a worker's actor outright (a crash, for tests); the next :meth:`poll` replaces it."""
        ray.kill(self._actors[worker], no_restart=True)
