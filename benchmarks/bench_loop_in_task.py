"""Is a training loop slower inside a Prefect task? The same fine-tuning run, bare and under Prefect.

``bench_orchestration.py`` measures the overhead outside the training loops, since the loops vary between
runs by more than the overhead. This checks that the loop itself does not pay for orchestration: stage 3
(safe-pendulum, the preset's steps) from one CQL checkpoint, run bare, with a Prefect test server
running and idle, as a task of a flow on that server, and bare again; the wall time and the loop's own
``wall_time_s`` of each are printed with the load average::

    .venv/bin/python benchmarks/bench_loop_in_task.py --from CQL_CHECKPOINT --data DATASET_DIR

(``bench_orchestration.py --home H`` leaves both under ``H/bare/cql`` and ``H/data``.)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="start", type=Path, required=True, help="CQL checkpoint directory")
    ap.add_argument("--data", type=Path, required=True, help="the dataset the checkpoint was trained on")
    ap.add_argument("--preset", default="demo")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="arl-loop-"))
    os.environ.update(
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
    )

    from arl_models.online import FinetuneConfig, finetune
    from arl_models.presets import get_preset

    p = get_preset(args.preset)
    cfg = FinetuneConfig(seed=0, steps=p.finetune_steps, vector="sync", eval_episodes=p.eval_episodes)

    def run(tag: str) -> None:
        t0 = time.perf_counter()
        m = finetune(args.start, home / tag, data=args.data, config=cfg, progress=False)
        print(
            f"{tag:<26} wall {time.perf_counter() - t0:6.1f} s   loop {m['wall_time_s']:6.1f} s   "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )

    run("bare")
    from prefect import flow, task
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        run("bare, server idle")
        flow(name="loop-in-task")(lambda: task(name="finetune")(run)("in a task of a flow"))()
        run("bare, server idle, again")
    run("bare, again")


if __name__ == "__main__":
    main()
