"""Orchestration overhead: the same stages bare and through the pipeline, on the demo task.

    .venv/bin/python benchmarks/bench_orchestration.py [--task safe-pendulum] [--bc-steps N --cql-steps N]
        [--finetune-steps N (0 leaves stage 3 out of both sides)]

Bare: ``train_bc`` -> ``train_cql`` (from the BC actor) -> ``finetune`` (from CQL, the task's settings) ->
``evaluate_checkpoint``, plain function calls: the stages of ``make run``.
Pipeline: ``offline_to_online_flow`` on the same data and steps, with a Prefect server, MLflow on SQLite,
DVC versioning, Great Expectations validation, registration and the gate; stages retrained (no cache).
Both run in one process, bare first, in a temporary state directory; the dataset is generated (or taken
from the behaviour cache) beforehand and not timed. The Prefect server's start and the creation of the
MLflow store's schema (both once per ``arl up``, not per run; the store is created in a child process, so
the flow still pays MLflow's import in its own) and versioning the dataset (once per data version) are
printed apart from the per-run overhead, which is the time each side spends outside its training loops
(pipeline minus bare): the loops themselves vary by more than the overhead between two runs.
After the run, the flow run's task runs are read back from the Prefect API and printed by duration (for a
training stage, also the part outside its training loop), with the flow's time outside any task.
"""

from __future__ import annotations

import argparse
import json
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
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        }
    )


def _create_mlflow_store() -> float:
    """What ``arl up``'s MLflow server does once: create the SQLite store's schema (in a child process)."""
    import subprocess
    import sys

    t0 = time.perf_counter()
    code = (
        "import os; from mlflow import MlflowClient; "
        "MlflowClient(os.environ['MLFLOW_TRACKING_URI']).search_experiments()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def _task_breakdown(flow_run_id: object, pipeline_s: float, loops: dict[str, float]) -> None:
    """Each task run of the flow run, longest first; the flow's own time between and around tasks."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])), limit=200
        )
    rows = []
    for tr in runs:
        ran = tr.start_time is not None and tr.end_time is not None  # a cache hit never runs
        seconds = (tr.end_time - tr.start_time).total_seconds() if ran else 0.0
        stage = tr.name.removeprefix("train ") if tr.name.startswith("train ") else None
        nested = bool(tr.task_inputs.get("__parents__"))
        rows.append((seconds, tr.name, loops.get(stage or ""), nested, tr.state_name))
    rows.sort(reverse=True)
    print("where the flow's time goes (Prefect task runs, longest first; a nested one is inside its parent):")
    for seconds, name, loop, nested, state in rows:
        note = f"   (training loop {loop:.1f} s, outside it {seconds - loop:.1f} s)" if loop else ""
        note += "   (nested)" if nested else ""
        note += f"   [{state}]" if state != "Completed" else ""
        print(f"  {name[:48]:<48} {seconds:8.2f} s{note}")
    tasks_s = sum(r[0] for r in rows if not r[3])
    flow_s = (flow_run.end_time - flow_run.start_time).total_seconds()
    print(f"  {'sum of (top-level) task runs':<48} {tasks_s:8.2f} s")
    print(f"  {'flow run, outside its tasks':<48} {flow_s - tasks_s:8.2f} s")
    print(f"  {'call, outside the flow run':<48} {pipeline_s - flow_s:8.2f} s   (engine start, run creation)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="safe-pendulum")
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--bc-steps", type=int, default=None)
    ap.add_argument("--cql-steps", type=int, default=None)
    ap.add_argument(
        "--finetune-steps", type=int, default=None, help="stage 3 env steps (default: the preset's)"
    )
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
    # the pipeline's stage names: OUT/bc, OUT/offline, OUT/finetune (their training loops are compared)
    train_cql(repo / name, bare / "offline", steps=args.cql_steps, init_actor=bare / "bc", **kw)
    last = bare / "offline"
    if args.finetune_steps != 0:
        from arl_models.online import FinetuneConfig, finetune
        from arl_models.presets import get_preset

        p = get_preset(args.preset)
        # what tasks.stages builds from the flow's empty form (the library's 4 sync envs, the preset's
        # episodes)
        cfg = FinetuneConfig(
            seed=0,
            steps=args.finetune_steps or p.finetune_steps,
            vector="sync",
            eval_episodes=p.eval_episodes,
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
        store_s = _create_mlflow_store()
        from flows.ingest import ingest_flow
        from flows.offline_to_online import offline_to_online_flow
        from flows.params import DatasetRef, GateConfig, IngestSource, TrainingConfig

        t0 = time.perf_counter()
        version = ingest_flow(IngestSource(task=args.task, quality="medium-replay"), emit_event=False)
        ingest_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        state = offline_to_online_flow(
            DatasetRef(path=version["path"], version=version["md5"]),
            TrainingConfig(
                preset=args.preset,
                seed=0,
                bc_steps=args.bc_steps,
                cql_steps=args.cql_steps,
                finetune_steps=args.finetune_steps,
            ),
            GateConfig(eval_episodes=args.episodes),
            refresh_cache=True,
            return_state=True,
        )
        pipeline_s = time.perf_counter() - t0
        result = state.result()
        loops = {k: s["metrics"].get("wall_time_s", 0.0) for k, s in result["stages"].items()}
        _task_breakdown(state.state_details.flow_run_id, pipeline_s, loops)

    train_s = sum(loops.values())
    bare_loops = 0.0
    for stage, loop in loops.items():
        f = bare / stage / "metrics.json"
        if f.is_file():
            bare_loop = json.loads(f.read_text())["wall_time_s"]
            bare_loops += bare_loop
            print(f"training loop {stage:<9} bare {bare_loop:7.1f} s   in the flow {loop:7.1f} s")
    print(f"Prefect server start: {server_s:7.1f} s   (once per stack, not per run)")
    print(f"MLflow store creation: {store_s:6.1f} s   (once per stack, not per run; a child process)")
    print(f"ingest (version+validate, once per data version): {ingest_s:.1f} s")
    print(f"bare stages:         {bare_s:8.1f} s   (training loops inside them: {bare_loops:.1f} s)")
    print(f"pipeline run:        {pipeline_s:8.1f} s   (training loops inside it: {train_s:.1f} s)")
    # The same loops differ by several seconds between two runs on a shared machine (noise larger than
    # the overhead itself), so the overhead is what each side spends outside its training loops.
    overhead = (pipeline_s - train_s) - (bare_s - bare_loops)
    print(
        f"orchestration overhead per run (Prefect, MLflow, validation, pull, registry, gate), outside the "
        f"training loops: {overhead:.1f} s = {100 * overhead / pipeline_s:.1f}% of the pipeline's wall time "
        f"(the plain difference of the two wall times, loops' noise included: {pipeline_s - bare_s:+.1f} s)"
    )
    print(f"gate: {result['decision']['alias']} ({result['decision']['reason']})")


if __name__ == "__main__":
    main()
