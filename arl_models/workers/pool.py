"""Pools of environment workers with one interface: processes on this machine, or Ray actors.

The learner's side of a pool is four calls, none of which waits on a particular worker:

* :meth:`WorkerPool.broadcast` publishes the actor's weights as a new policy version; every worker
  picks up the newest version at its next chunk boundary (versions in between are skipped).
* :meth:`WorkerPool.poll` returns the chunks that have arrived (waiting at most ``timeout`` for the
  first), after replacing workers that died. Chunks are keyed ``(worker, incarnation, seq)`` and a
  key is delivered once: nothing a worker sent is counted twice, and a dead worker's unsent chunk is
  simply lost (its replacement is a new incarnation with its own random stream).
* :meth:`WorkerPool.resize` changes the number of workers (the rate tuner's lever).
* :meth:`WorkerPool.close` stops everything.

A worker runs at most a couple of chunks ahead of what the learner has read (credits for processes,
one call in flight for Ray): when the learner is the bottleneck the workers wait rather than pile up
data that is stale by the time it is read.

:class:`ProcessPool` runs each worker in a ``spawn`` process: weights live in one shared-memory float32
array guarded by a lock (the learner's write is a memcpy, never a blocking send), chunks come back on
a pipe per worker. :class:`~arl_models.workers.ray_pool.RayPool` (optional extra ``ray``) keeps one
``collect`` call in flight per actor.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from arl_models.workers.collector import Chunk, Collector, WorkerSpec, actor_size


class WorkerPool(ABC):
    """Bookkeeping shared by the backends: worker ids, incarnations, replacement and de-duplication."""

    def __init__(self, spec: WorkerSpec, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.spec = spec
        self.version = -1
        self.incarnations: dict[int, int] = {}
        """Current incarnation of every running worker."""
        self.replaced = 0
        self.duplicates = 0
        self._seen: set[tuple[int, int, int]] = set()
        self._started = False
        self._initial = num_workers

    # -- backend hooks
    @abstractmethod
    def _start_worker(self, worker: int, incarnation: int) -> None: ...

    @abstractmethod
    def _stop_worker(self, worker: int) -> None: ...

    @abstractmethod
    def _publish(self, flat: np.ndarray, version: int) -> None: ...

    @abstractmethod
    def _receive(self, timeout: float) -> tuple[list[Chunk], list[int]]:
        """Chunks that arrived and the ids of workers found dead."""

    # -- the learner's interface
    @property
    def num_workers(self) -> int:
        return len(self.incarnations)

    def start(self) -> WorkerPool:
        if not self._started:
            self._started = True
            for w in range(self._initial):
                self._spawn(w)
        return self

    def _spawn(self, worker: int) -> None:
        inc = self.incarnations.get(worker, -1) + 1
        self.incarnations[worker] = inc
        self._start_worker(worker, inc)

    def broadcast(self, flat: np.ndarray, version: int) -> None:
        if version <= self.version:
            raise ValueError(f"policy versions must increase: {version} after {self.version}")
        self.version = version
        self._publish(np.ascontiguousarray(flat, np.float32), version)

    def poll(self, timeout: float = 0.0) -> list[Chunk]:
        self.start()
        chunks, dead = self._receive(timeout)
        fresh = []
        for c in chunks:
            if c.key in self._seen or self.incarnations.get(c.worker) != c.incarnation:
                self.duplicates += c.key in self._seen
                continue  # a repeat, or a straggler from a worker that was stopped or replaced
            self._seen.add(c.key)
            fresh.append(c)
        for w in dead:  # after the filter: what a dead worker sent before dying still counts
            if w in self.incarnations:
                self._stop_worker(w)
                self.replaced += 1
                self._spawn(w)
        return fresh

    def resize(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a pool needs at least one worker, got {n}")
        self.start()
        while self.num_workers < n:
            self._spawn(max(self.incarnations, default=-1) + 1)
        while self.num_workers > n:
            w = max(self.incarnations)
            self._stop_worker(w)
            del self.incarnations[w]

    def close(self) -> None:
        for w in list(self.incarnations):
            self._stop_worker(w)
        self.incarnations.clear()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _process_main(
    spec: WorkerSpec,
    worker: int,
    incarnation: int,
    buf: Any,
    version: Any,
    lock: Any,
    conn: Connection,
    stop: Any,
    credits: Any,
) -> None:
    """A worker process: newest weights at every chunk boundary, chunks out on ``conn``, at most
    ``CREDITS`` of them not yet taken in by the learner (it releases one credit per chunk it reads)."""
    collector = Collector(spec, worker, incarnation)
    weights = np.frombuffer(buf, dtype=np.float32)
    try:
        while not stop.is_set():
            if version.value < 0 or not credits.acquire(timeout=0.05):
                continue
            if version.value != collector.version:
                with lock:
                    flat, v = weights.copy(), version.value
                collector.load(flat, v)
            conn.send(collector.collect())
    except (BrokenPipeError, EOFError, OSError, KeyboardInterrupt):
        pass
    finally:
        collector.close()


CREDITS = 2
"""Chunks a process worker may have produced that the learner has not read yet: it never runs further
ahead of the learner than this (backpressure), whatever the pipe could buffer."""


class ProcessPool(WorkerPool):
    """Workers as ``spawn`` processes on this machine."""

    def __init__(self, spec: WorkerSpec, num_workers: int):
        super().__init__(spec, num_workers)
        self._ctx = mp.get_context("spawn")
        self._buf = self._ctx.RawArray("f", actor_size(spec))
        self._version = self._ctx.RawValue("q", -1)
        self._lock = self._ctx.Lock()
        self._procs: dict[int, tuple[Any, Connection, Any, Any]] = {}
        """worker -> (process, read end of its pipe, stop event, credit semaphore)"""

    def _start_worker(self, worker: int, incarnation: int) -> None:
        recv, send = self._ctx.Pipe(duplex=False)
        stop, credits = self._ctx.Event(), self._ctx.Semaphore(CREDITS)
        p = self._ctx.Process(
            target=_process_main,
            name=f"arl-worker-{worker}.{incarnation}",
            daemon=True,
            args=(self.spec, worker, incarnation, self._buf, self._version, self._lock, send, stop, credits),
        )
        p.start()
        send.close()  # the child holds the write end: EOF here once it is gone
        self._procs[worker] = (p, recv, stop, credits)

    def _stop_worker(self, worker: int) -> None:
        p, conn, stop, _ = self._procs.pop(worker)
        stop.set()
        deadline = time.monotonic() + 5.0
        while p.is_alive() and time.monotonic() < deadline:
            try:  # unblock a worker stuck sending into a full pipe
                while conn.poll(0.01):
                    conn.recv()
            except (EOFError, OSError):
                break
        if p.is_alive():
            p.terminate()
        p.join(timeout=5.0)
        conn.close()

    def _publish(self, flat: np.ndarray, version: int) -> None:
        with self._lock:
            np.frombuffer(self._buf, dtype=np.float32)[:] = flat
            self._version.value = version

    def _receive(self, timeout: float) -> tuple[list[Chunk], list[int]]:
        by_conn = {proc[1]: w for w, proc in self._procs.items()}
        chunks: list[Chunk] = []
        dead: set[int] = set()
        for ready in wait(list(by_conn), timeout=timeout):
            conn = ready if isinstance(ready, Connection) else None
            if conn is None:
                continue
            try:
                while conn.poll():
                    chunks.append(conn.recv())
                    self._procs[by_conn[conn]][3].release()
            except (EOFError, OSError):
                dead.add(by_conn[conn])
        dead |= {w for w, proc in self._procs.items() if proc[0].exitcode is not None}
        return chunks, sorted(dead)

    def kill(self, worker: int) -> None:
        """Kill a worker's process outright (a crash, for tests); the next :meth:`poll` replaces it."""
        self._procs[worker][0].kill()
        self._procs[worker][0].join(timeout=5.0)


def make_pool(
    spec: WorkerSpec, num_workers: int, backend: str = "process", address: str | None = None
) -> WorkerPool:
    """A pool of the named backend: ``process``, or ``ray`` (local when ``address`` is None)."""
    if backend == "process":
        if address:
            raise ValueError("an address only makes sense with backend='ray'")
        return ProcessPool(spec, num_workers)
    if backend == "ray":
        from arl_models.workers.ray_pool import RayPool

        return RayPool(spec, num_workers, address=address)
    raise ValueError(f"backend must be 'process' or 'ray', got {backend!r}")
