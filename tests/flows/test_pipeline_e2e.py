"""The offline-to-online flow end to end: Prefect test server, MLflow on SQLite, DVC on a temporary repo."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from flow_data import GATE, TINY, ingest_pendulum

from arl_models.presets import get_preset
from flows.offline_to_online import offline_to_online_flow
from flows.params import DatasetRef, GateConfig, TrainingConfig
from tasks import registry, tracking
from tasks.settings import state_paths

pytestmark = pytest.mark.e2e
MODEL = "arl-safe-pendulum"


def _run(version: dict, seed: int = 0, training: dict | None = None, **gate: Any):
    return offline_to_online_flow(
        DatasetRef(path=version["path"], version=version["md5"]),
        TrainingConfig(seed=seed, **{**TINY, **(training or {})}),
        GateConfig(**{**GATE, **gate}),
    )


def _uri() -> str:
    return state_paths().mlflow_uri


def _children(run_id: str) -> dict[str, object]:
    c = tracking.client(_uri())
    parent = c.get_run(run_id)
    runs = c.search_runs([parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    return {r.data.tags["arl.stage"]: r for r in runs}


def test_pipeline_registers_a_champion_and_a_worse_run_does_not_replace_it(demo_version: dict) -> None:
    first = _run(demo_version)
    assert first["decision"]["alias"] == "champion"
    champion = first["decision"]["version"]
    c = tracking.client(_uri())

    # MLflow: one parent run, one nested run per stage, the dataset as an input with its DVC hash
    parent = c.get_run(first["run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["arl.dataset.md5"] == demo_version["md5"]
    assert [d.dataset.digest for d in parent.inputs.dataset_inputs] == [demo_version["md5"]]
    stages = _children(first["run_id"])
    assert set(stages) == {"validate", "bc", "offline", "finetune", "evaluate"}
    # the bytes ingest_flow validated (pulled here by DVC) are not judged again: the recorded pass is reused
    validate = stages["validate"].data
    assert validate.tags["arl.validation.reused"] == "true" and validate.metrics["validate/expectations"] > 0
    finetune = stages["finetune"]
    assert {"online/lagrange_multiplier", "online/cumulative_cost"} <= set(finetune.data.metrics)
    offline = stages["offline"]
    assert {"train/loss_critic", "train/lagrange_multiplier", "train/q_data"} <= set(offline.data.metrics)
    assert len(c.get_metric_history(offline.info.run_id, "train/loss_critic")) >= 1
    plots = {a.path for a in c.list_artifacts(offline.info.run_id, "plots")}
    assert plots == {"plots/learning_curve.png", "plots/cost_curve.png"}
    # stage 2 ran the preset's algorithm for the task; its run and the parent's name it
    assert offline.data.tags["arl.algo"] == get_preset("demo").stage2_algo("safe-pendulum")
    assert parent.data.tags["arl.offline_algo"] == offline.data.tags["arl.algo"]
    assert parent.data.tags["arl.offline_steps"] == str(TINY["offline_steps"])
    assert offline.data.params["seed"] == "0" and offline.data.params["algo.hidden"]
    # 1.0.0 observes no plant: the trained networks are unconditioned, and the run says so
    assert offline.data.params["algo.context_dim"] == "task" and offline.data.tags["arl.context_dim"] == "0"

    # the registry: every stage's policy, with its trace tags, loadable for inference
    mv = c.get_model_version(MODEL, champion)
    tags = mv.tags
    assert tags["arl.stage"] == "finetune" and tags["arl.dataset_hash"] == demo_version["md5"]
    assert (
        tags["arl.env_version"] == "1.0.0"
        and tags["arl.policy_hash"] == "ab" * 32
        and tags["arl.seed"] == "0"
    )
    assert tags["arl.git_commit"]
    assert {v["stage"] for v in first["versions"]} == {"bc", "offline", "finetune"}
    import mlflow.pyfunc
    import numpy as np

    mlflow.set_tracking_uri(_uri())
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    actions = model.predict(np.zeros((4, 3), dtype=np.float32))
    assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 2.0)

    # a second, worse run becomes the challenger: cloned long enough to copy the data's pumping at 1.6 N m,
    # its policy pays the overload (0.6 a step at 1.6 N m) on most steps and breaks the budget; without
    # fine-tuning the gate judges that copy itself (200 online steps can as well unlearn the pumping)
    second = _run(demo_version, seed=1, training={"bc_steps": 300, "finetune_steps": 0}, cost_budget=0.5)
    assert second["decision"]["alias"] == "challenger"
    assert registry.alias_version(MODEL, "champion", tracking_uri=_uri()) == champion
    loser = c.get_model_version(MODEL, second["decision"]["version"])
    assert (
        loser.tags["arl.promotion"] == "challenger" and "exceeds budget" in loser.tags["arl.promotion.reason"]
    )
    assert c.get_run(second["run_id"]).data.tags["arl.promotion"] == "challenger"


def test_the_gate_judges_and_the_registry_serves_what_fine_tuning_hands_over(demo_version: dict) -> None:
    """With evaluations during fine-tuning the stage keeps ``best/``: the final evaluation, the gate and the
    registered model use that policy; the stage's own weights stay what training continues from."""
    import mlflow.pyfunc
    import numpy as np

    from arl_models.checkpoint import load_policy

    # a budget every evaluation meets, so that best/ exists whatever the tiny policy pays
    result = _run(demo_version, seed=4, training={"eval_episodes": 2, "finetune_budget": 1e9})
    finetune = result["stages"]["finetune"]
    best = Path(finetune["checkpoint"]) / "best"
    assert (best / "config.json").is_file() and finetune["metrics"]["best/episodes"] == 2
    assert json.loads((Path(finetune["checkpoint"]) / "config.json").read_text())["env"]["cost_budget"] == 1e9
    assert _children(result["run_id"])["evaluate"].data.params["policy"] == str(best)
    mlflow.set_tracking_uri(_uri())
    version = result["versions"][-1]
    assert version["stage"] == "finetune"
    # the stages' policies registered beside the candidate are not gated
    for other in result["versions"][:-1]:
        tags = tracking.client(_uri()).get_model_version(MODEL, other["version"]).tags
        assert (
            tags["arl.promotion"] == "not gated"
            and f"version {version['version']}" in tags["arl.promotion.reason"]
        )
    served = {
        v["stage"]: tracking.client(_uri()).get_model_version(MODEL, v["version"]).tags["arl.served_policy"]
        for v in result["versions"]
    }
    assert served == {"bc": "last", "offline": "last", "finetune": "best"}
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version['version']}").predict(obs)
    np.testing.assert_allclose(served, load_policy(best).act(obs), rtol=1e-6)


def test_broken_metadata_stops_the_flow_before_training(demo_version: dict, tmp_path: Path) -> None:
    from flow_data import write_pendulum
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from tasks.validate import DataValidationError
    from tasks.versioning import version_dataset

    repo = state_paths().data_repo
    write_pendulum(repo / "broken", broken_policy_hash=True)
    bad = version_dataset(repo / "broken", repo)
    c = tracking.client(_uri())
    versions_before = len(c.search_model_versions(f"name = '{MODEL}'"))
    champion_before = registry.alias_version(MODEL, "champion", tracking_uri=_uri())

    state = offline_to_online_flow(
        DatasetRef(path=bad.path, version=bad.md5),
        TrainingConfig(**TINY),
        GateConfig(**GATE),
        return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(DataValidationError) as err:
        state.result()
    assert "expect_column_values_to_match_regex on column 'policy_hash'" in str(err.value)
    assert "NOT-A-HASH" in str(err.value)

    # the Prefect log names the expectation and shows the values (logs reach the server in batches)
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    flow_run_id = state.state_details.flow_run_id
    deadline, found = time.monotonic() + 20, False
    while not found and time.monotonic() < deadline:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        found = any("policy_hash" in log.message and "NOT-A-HASH" in log.message for log in logs)
        time.sleep(0 if found else 1)
    assert found

    # nothing trained, nothing registered, the champion untouched
    failed = c.search_runs(
        [c.get_experiment_by_name("arl-safe-pendulum").experiment_id],
        filter_string=f"tags.`arl.dataset.md5` = '{bad.md5}' and tags.`arl.task` = 'safe-pendulum'",
    )
    assert len(failed) == 1 and failed[0].info.status == "FAILED"
    assert failed[0].data.tags["arl.failed_stage"] == "validate"
    assert set(_children(failed[0].info.run_id)) == {"validate"}
    assert len(c.search_model_versions(f"name = '{MODEL}'")) == versions_before
    assert registry.alias_version(MODEL, "champion", tracking_uri=_uri()) == champion_before


def test_a_failed_and_retried_run_reuses_the_finished_stages(
    demo_version: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import arl_models.offline as offline

    calls = {"bc": 0, "offline": 0, "evaluate": 0}
    real = {
        "bc": offline.train_bc,
        "offline": offline.train_offline_algo,
        "evaluate": offline.evaluate_checkpoint,
    }

    def counting(name):
        def fn(*args, **kwargs):
            calls[name] += 1
            if name == "evaluate" and calls[name] == 1:
                raise ConnectionError("simulated: the evaluation environment went away")
            return real[name](*args, **kwargs)

        return fn

    monkeypatch.setattr(offline, "train_bc", counting("bc"))
    monkeypatch.setattr(offline, "train_offline_algo", counting("offline"))
    monkeypatch.setattr(offline, "evaluate_checkpoint", counting("evaluate"))

    with pytest.raises(ConnectionError):
        _run(demo_version, seed=7)
    assert calls == {"bc": 1, "offline": 1, "evaluate": 1}
    failed = tracking.client(_uri()).search_runs(
        [tracking.client(_uri()).get_experiment_by_name("arl-safe-pendulum").experiment_id],
        filter_string="attributes.status = 'FAILED' and tags.`arl.failed_stage` = 'evaluate'",
    )
    assert failed and "simulated: the evaluation environment went away" in failed[0].data.tags["arl.error"]

    retried = _run(demo_version, seed=7)
    assert calls == {"bc": 1, "offline": 1, "evaluate": 2}  # stages 1 and 2 were not retrained
    stages = _children(retried["run_id"])
    for name in ("bc", "offline"):
        assert stages[name].data.tags["arl.reused_from_run"] == retried["stages"][name]["run_id"]

    # without Prefect's result cache, the finished checkpoint on disk is reused as well
    shutil.rmtree(Path(state_paths().home).parent / "prefect" / "storage", ignore_errors=True)
    again = offline_to_online_flow(
        DatasetRef(path=demo_version["path"], version=demo_version["md5"]),
        TrainingConfig(seed=7, **TINY),
        GateConfig(**GATE),
        refresh_cache=True,
    )
    assert calls["bc"] == 1 and calls["offline"] == 1
    assert _children(again["run_id"])["offline"].data.tags["arl.reused_checkpoint"] == "true"


def test_a_new_data_version_continues_the_champion_with_ewc(demo_version: dict, tmp_path: Path) -> None:
    import json
    import math

    from arl_models.algos.ewc import EWCConfig

    if registry.alias_version(MODEL, "champion", tracking_uri=_uri()) is None:
        _run(demo_version)
    c = tracking.client(_uri())
    champion = c.get_model_version(MODEL, registry.alias_version(MODEL, "champion", tracking_uri=_uri()))
    chain_before = json.loads(champion.tags["arl.dataset_chain"])
    assert demo_version["md5"] in {v["md5"] for v in chain_before}

    new = ingest_pendulum(tmp_path / "second", seed=5)
    result = _run(new, training={"rehearsal": 0.5, "eval_episodes": 2}, max_forgetting=1e9, cost_budget=1e9)

    # stage 4 ran from the champion, over the versions the champion had learned, rehearsing them; its
    # policy fits bounds this wide, so nothing trained from scratch
    assert list(result["stages"]) == ["ewc"]
    ewc = result["stages"]["ewc"]
    offline_part = Path(ewc["checkpoint"]) / "offline"  # then fine-tuned on the new version, as stage 3 is
    assert (Path(ewc["checkpoint"]) / "best").is_dir() or (Path(ewc["checkpoint"]) / "train_state").is_dir()
    continual_config = json.loads((offline_part / "config.json").read_text())["continual_config"]
    assert continual_config["online_steps"] == TINY["finetune_steps"] == ewc["online_steps"]  # the summary's
    assert continual_config["rehearsal"] == 0.5
    # the form's empty weight: the library's default
    assert continual_config["ewc"]["weight"] == EWCConfig.weight
    forgetting = ewc["metrics"]["continual/ewc_mean_forgetting"]
    assert math.isfinite(forgetting)
    run = _children(result["run_id"])["ewc"]
    assert run.data.params["init_from"] == c.get_run(champion.run_id).data.params["checkpoint"]
    assert "continual/ewc_new_score" in run.data.metrics

    # the gate judged the candidate the retraining rule named, its forgetting included; EWC's chain names
    # every version it learned
    gated = c.get_model_version(MODEL, result["decision"]["version"])
    assert gated.tags["arl.stage"] == "ewc"
    assert result["decision"]["reason"].startswith("candidate ewc: the best")
    gated_forgetting = float(gated.tags["arl.gate.forgetting"])
    assert gated_forgetting == forgetting
    mv = c.get_model_version(MODEL, next(v["version"] for v in result["versions"] if v["stage"] == "ewc"))
    assert json.loads(mv.tags["arl.dataset_chain"]) == [*chain_before, {"path": "second", "md5": new["md5"]}]

    # the parent run says at a glance what the stage scored, what the gated policy forgot, per version
    parent = c.get_run(result["run_id"])
    assert {"ewc/score", "ewc/cost", "score", "forgetting"} <= set(parent.data.metrics)
    assert parent.data.metrics["forgetting"] == gated_forgetting
    assert any(k.startswith("ewc/forgetting/safe-pendulum-") for k in parent.data.metrics)
    assert "plots/forgetting.png" in {a.path for a in c.list_artifacts(result["run_id"], "plots")}
    from rich.console import Console

    from arl_cli.pipeline import compare_table

    console = Console(width=400, record=True)
    console.print(compare_table("safe-pendulum", limit=1, tracking_uri=_uri()))
    text = console.export_text()
    assert f"second@{new['md5'][:8]}" in text and "ewc score" in text and "forgetting safe-pendulum-" in text
    assert re.search(r"offline algo\s*│\s*cql\s*│", text), text  # stage 2 as resolved for the task
    assert result["decision"]["reason"][-40:] in text.replace("\n", "")

    # on another machine (no local checkpoint) stage 4 starts from the registry's copy
    from tasks.continual import _local_checkpoint

    local = Path(ewc["checkpoint"])
    local.rename(local.with_name(local.name + ".away"))
    try:
        copy = _local_checkpoint(MODEL, mv, tmp_path / "runs", _uri())
    finally:
        local.with_name(local.name + ".away").rename(local)
    assert copy.is_relative_to(tmp_path / "runs" / "registry") and (copy / "train_state").is_dir()
    assert (copy / "config.json").read_text() == (local / "config.json").read_text()

    # the same version again: stage 4 runs only if the champion has not learned it
    again = _run(new, seed=1, max_forgetting=1e9)
    assert ("ewc" in again["stages"]) is not result["decision"]["promoted"]


def test_a_retraining_run_hands_the_gate_the_candidate_its_rule_names(
    demo_version: dict, tmp_path: Path
) -> None:
    """Stage 4's policy outside the gate's bounds: stages 1-3 train the new version from scratch and the
    rule weighs both; whichever it names is the version gated, with the forgetting measured for it."""
    if registry.alias_version(MODEL, "champion", tracking_uri=_uri()) is None:
        _run(demo_version)
    new = ingest_pendulum(tmp_path / "third", seed=9)
    # no forgetting and no cost allowed: stage 4's policy fits only if it forgets nothing and pays nothing
    result = _run(new, max_forgetting=0.0, cost_budget=0.0)
    reason = result["decision"]["reason"]
    ewc = result["stages"]["ewc"]["metrics"]["continual/ewc_mean_forgetting"]
    mv = tracking.client(_uri()).get_model_version(MODEL, result["decision"]["version"])
    chosen = mv.tags["arl.stage"]
    assert reason.startswith(f"candidate {chosen}: ")
    if list(result["stages"]) == ["ewc"]:  # it fitted: nothing trained from scratch
        assert chosen == "ewc" and ewc <= 0.0 and "finetune" not in reason
    else:  # it did not: the version trained from scratch too, and the rule weighed both
        assert list(result["stages"]) == ["ewc", "bc", "offline", "finetune"]
        assert f"ewc forgets {ewc:.4g}" in reason and "finetune forgets" in reason
        assert chosen in ("ewc", "finetune")
    forgetting = ewc if chosen == "ewc" else float(mv.tags["arl.gate.forgetting"])
    assert float(mv.tags["arl.gate.forgetting"]) == forgetting
    if chosen == "finetune":  # within both bounds, as the rule demands
        assert forgetting <= 0.0


def test_a_diverging_stage_hands_the_gate_the_last_good_policy(demo_version: dict, tmp_path: Path) -> None:
    """Rewards of 1e12 are finite (they pass validation) but run stage 2's critic away at once: the run
    stops training, registers only what was good, and gates BC's policy, saying why."""
    new = ingest_pendulum(tmp_path / "huge-rewards", reward_scale=1e12)
    result = _run(new, model_name="arl-diverging")
    assert list(result["stages"]) == ["bc"]
    assert [v["stage"] for v in result["versions"]] == ["bc"]
    reason = result["decision"]["reason"]
    assert reason.startswith("stage offline diverged (") and "loss_critic" in reason
    assert "the gate judges bc: " in reason
    offline = _children(result["run_id"])["offline"]
    assert offline.info.status == "FAILED"
    parent = tracking.client(_uri()).get_run(result["run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["arl.diverged_stage"] == "offline"
    assert "arl.failed_stage" not in parent.data.tags
