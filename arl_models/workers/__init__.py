"""Environment workers for the asynchronous online pipeline: processes or Ray actors, one interface."""

from arl_models.workers.collector import Chunk, Collector, WorkerSpec, actor_size, flatten
from arl_models.workers.pool import ProcessPool, WorkerPool, make_pool

__all__ = [
    "Chunk",
    "Collector",
    "ProcessPool",
    "WorkerPool",
    "WorkerSpec",
    "actor_size",
    "flatten",
    "make_pool",
]
