"""Orchestration overhead: the same stages bare and through the pipeline, on the demo task.

    .venv/bin/python benchmarks/bench_orchestration.py [--task safe-pendulum] [--bc-steps N --cql-steps N]
        [--finetune-steps N (0 leaves stage 3 out of both sides)]

Bare: ``train_bc`` -> ``train_cql`` (from the BC actor) -> ``finetune`` (from CQL, the task's settings) ->
``evaluate_checkpoint``, plain function calls: the stages of ``make run``.
Pipeline: ``offline_to_online_flow`` on the same data and steps, with a Prefect server, MLflow on SQLite,
DVC versioning, Great Expectations validation, registration and the gate; stages retrained (no cache).
Both run in one process, bare first, in a temporary state directory; the dataset is generated (or taken
from the behaviour cache) beforehand and not timed. The Prefect server's start (once per ``arl up``, not
per run) and versioning the dataset (once per data version) are printed apart from the per-run overhead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _setup_env(home: Path) -> None:
    os.environ.update(
        {
            "ARL_HOME": str(home),
            "PREFECT_HOME": str(home / "prefect"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "GX_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="safe-pendulum")
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--bc-steps", type=int, default=None)
    ap.add_argument("--cql-steps", type=int, default=None)
    ap.add_argument("--finetune-steps", type=int, default=None, help="stage 3 env steps (default: the preset's)")
    ap.add_argument("--episodes", type=int, default=10, help="final evaluation episodes")
    ap.add_argument("--home", type=Path, default=None, help="state directory (default: a temporary one)")
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="arl-bench-"))
    _setup_env(home)

    from arl_models.data.generate import generate_dataset
    from arl_models.offline import evaluate_checkpoint, train_bc, train_cql

    repo = home / "data"
    name = f"{args.task}-medium-replay"
    generate_dataset(args.task, "medium-replay", repo / name, progress=False)

    t0 = time.perf_counter()
    bare = home / "bare"
    kw = {"preset": args.preset, "seed": 0, "progress": False}
    train_bc(repo / name, bare / "bc", steps=args.bc_steps, **kw)
    train_cql(repo / name, bare / "cql", steps=args.cql_steps, init_actor=bare / "bc", **kw)
    last = bare / "cql"
    if args.finetune_steps != 0:
        from arl_models.online import FinetuneConfig, finetune
        from arl_models.presets import get_preset

        p = get_preset(args.preset)
        # what tasks.train builds for the stage from the flow's defaults (4 sync envs, the preset's episodes)
        cfg = FinetuneConfig(
            seed=0, steps=args.finetune_steps or p.finetune_steps, vector="sync", eval_episodes=p.eval_episodes
        )
        finetune(last, bare / "finetune", data=repo / name, config=cfg, progress=False)
        last = bare / "finetune"
    evaluate_checkpoint(last, episodes=args.episodes)
    bare_s = time.perf_counter() - t0
    print(f"bare stages:         {bare_s:8.1f} s", flush=True)

    t0 = time.perf_counter()
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        server_s = time.perf_counter() - t0
        from flows.ingest import ingest_flow
        from flows.offline_to_online import offline_to_online_flow
        from flows.params import DatasetRef, GateConfig, IngestSource, TrainingConfig

        t0 = time.perf_counter()
        version = ingest_flow(IngestSource(task=args.task, quality="medium-replay"), emit_event=False)
        ingest_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = offline_to_online_flow(
            DatasetRef(path=version["path"], version=version["md5"]),
            TrainingConfig(
                preset=args.preset, seed=0, bc_steps=args.bc_steps, cql_steps=args.cql_steps,
                finetune_steps=args.finetune_steps,
            ),
            GateConfig(eval_episodes=args.episodes),
            refresh_cache=True,
        )
        pipeline_s = time.perf_counter() - t0

    overhead = pipeline_s - bare_s
    train_s = sum(s["metrics"]["wall_time_s"] for s in result["stages"].values())
    print(f"Prefect server start: {server_s:7.1f} s   (once per stack, not per run)")
    print(f"ingest (version+validate, once per data version): {ingest_s:.1f} s")
    print(f"pipeline run:        {pipeline_s:8.1f} s   (training loops inside it: {train_s:.1f} s)")
    print(
        f"orchestration overhead per run (Prefect, MLflow, validation, pull, registry, gate): "
        f"{overhead:.1f} s = {100 * overhead / pipeline_s:.1f}% of the pipeline's wall time"
    )
    print(f"gate: {result['decision']['alias']} ({result['decision']['reason']})")


if __name__ == "__main__":
    main()
