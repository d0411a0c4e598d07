"""The asynchronous pipeline of stage 3: workers collect while the learner updates
(``arl_models/online/async_loop.py``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from arl_models.online import FinetuneConfig, WorkerConfig, finetune
from arl_models.rate_tuner import BOTTLENECKS, RateTargets

ASYNC = FinetuneConfig(
    steps=800,
    utd=0.05,
    eval_episodes=0,
    batch_size=32,
    pipeline="async",
    workers=WorkerConfig(num_workers=2, chunk_steps=25, sync_every=5, tune_interval_s=0.5),
)


def test_async_finetune_counts_every_episode_once_and_logs_the_pipeline(tiny_cql, pendulum_data, tmp_path):
    final = finetune(tiny_cql, tmp_path / "ft", data=pendulum_data, config=ASYNC, progress=False)
    episodes = [json.loads(ln) for ln in (tmp_path / "ft" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == final["online/episodes"] >= 4  # 200-step episodes, 800 steps: at least 4
    assert all(e["env_steps"] == 200 * e["episode"] for e in episodes)  # whole episodes, none twice
    assert final["online/env_steps_total"] == 200 * len(episodes) and final["online/updates"] > 0
    rounds = [json.loads(ln) for ln in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    rated = [r for r in rounds if "pipeline/env_steps_per_s" in r]
    assert rated and all(
        r["pipeline/env_steps_per_s"] > 0 and 0 <= r["pipeline/learner_utilization"] <= 1 for r in rated
    )
    assert all(BOTTLENECKS[int(r["pipeline/bottleneck"])] for r in rated)
    assert np.isfinite(final["online/lagrange_multiplier"])


def test_async_finetune_resumes_from_its_last_round(tiny_cql, pendulum_data, tmp_path):
    cfg = replace(ASYNC, steps=1000)
    first = finetune(
        tiny_cql, tmp_path / "ft", data=pendulum_data, config=cfg, progress=False, stop_after_rounds=1
    )
    assert first["online/episodes"] >= 2
    final = finetune(tiny_cql, tmp_path / "ft", data=pendulum_data, config=cfg, progress=False)
    episodes = [
        json.loads(ln)["episode"] for ln in (tmp_path / "ft" / "episodes.jsonl").read_text().splitlines()
    ]
    assert episodes == list(range(1, len(episodes) + 1)) and final["online/env_steps_total"] >= 1000


def test_the_tuner_adds_a_worker_when_the_learner_waits_on_data(tiny_cql, pendulum_data, tmp_path):
    # a learner at UTD 0.05 on tiny batches is idle almost always: the tuner must ask for more workers
    workers = replace(
        ASYNC.workers,
        num_workers=1,
        tune=True,
        tune_interval_s=0.3,
        targets=RateTargets(max_workers=2, settle_intervals=0, ema=1.0),
    )
    finetune(
        tiny_cql,
        tmp_path / "ft",
        data=pendulum_data,
        config=replace(ASYNC, steps=1200, workers=workers),
        progress=False,
    )
    rated = [json.loads(ln) for ln in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    workers_seen = [r["pipeline/num_workers"] for r in rated if "pipeline/num_workers" in r]
    assert workers_seen and max(workers_seen) == 2


@pytest.mark.parametrize("backend", ["ray"])
def test_async_finetune_on_ray_actors(tiny_cql, pendulum_data, tmp_path, backend):
    pytest.importorskip("ray")
    cfg = replace(ASYNC, steps=400, workers=replace(ASYNC.workers, backend=backend))
    final = finetune(tiny_cql, tmp_path / "ft", data=pendulum_data, config=cfg, progress=False)
    assert final["online/episodes"] >= 2 and final["online/updates"] > 0


def test_cli_finetune_async_pipeline(tiny_cql, pendulum_data, tmp_path):
    from typer.testing import CliRunner

    from arl_cli.online import app

    res = CliRunner().invoke(
        app,
        [
            "finetune",
            "--from",
            str(tiny_cql),
            "--out",
            str(tmp_path / "cli"),
            "--steps",
            "400",
            "--data",
            str(pendulum_data),
            "--eval-episodes",
            "0",
            "--utd",
            "0.05",
            "--pipeline",
            "async",
            "--workers",
            "2",
            "--sync-every",
            "5",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{\n") :])["online/env_steps_total"] >= 400
    bad = CliRunner().invoke(
        app,
        [
            "finetune",
            "--from",
            str(tiny_cql),
            "--out",
            str(tmp_path / "bad"),
            "--steps",
            "10",
            "--data",
            str(pendulum_data),
            "--pipeline",
            "asynch",
        ],
    )
    assert bad.exit_code == 2 and "pipeline must be 'sync' or 'async'" in bad.output
