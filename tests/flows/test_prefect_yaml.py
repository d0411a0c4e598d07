"""prefect.yaml: schema, entrypoints that import, parameters that validate against the flows' models."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"offline-to-online", "retrain-on-new-data", "ingest", "dataset-watcher"}


@pytest.fixture(scope="module")
def spec() -> dict:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())


@pytest.fixture(scope="module")
def deployments(spec: dict) -> dict[str, dict]:
    return {d["name"]: d for d in spec["deployments"]}


def test_schema_and_names(spec: dict, deployments: dict[str, dict]) -> None:
    from prefect.cli.deploy._models import PrefectYamlModel

    model = PrefectYamlModel.model_validate(spec)
    assert {d.name for d in model.deployments} == NAMES
    for d in model.deployments:
        assert d.work_pool.name == "local"
        assert d.concurrency_limit.limit == 1 and d.concurrency_limit.collision_strategy == "ENQUEUE"


@pytest.mark.parametrize("name", sorted(NAMES))
def test_entrypoint_loads_and_parameters_validate(deployments: dict[str, dict], name: str) -> None:
    from prefect.flows import load_flow_from_entrypoint

    d = deployments[name]
    flow = load_flow_from_entrypoint(str(ROOT / d["entrypoint"]))
    params = dict(d.get("parameters") or {})
    if name == "retrain-on-new-data":  # the trigger supplies the dataset
        params["dataset"] = {"path": "tiny", "version": "0" * 32 + ".dir"}
    flow.validate_parameters(params)
    with pytest.raises(Exception):  # noqa: B017 - a wrong type must not slip through
        flow.validate_parameters({**params, "unknown_parameter": 1})


def test_schedules(deployments: dict[str, dict]) -> None:
    from prefect.cli.deploy._models import RawScheduleConfig

    weekly = [RawScheduleConfig.model_validate(s) for s in deployments["offline-to-online"]["schedules"]]
    assert len(weekly) == 1 and weekly[0].cron == "0 3 * * 1" and weekly[0].active is False  # paused
    watcher = [RawScheduleConfig.model_validate(s) for s in deployments["dataset-watcher"]["schedules"]]
    assert watcher[0].interval is not None
    assert "schedules" not in deployments["ingest"] and "schedules" not in deployments["retrain-on-new-data"]


def test_retrain_trigger_matches_the_pushed_event_and_templates_its_hash(
    deployments: dict[str, dict],
) -> None:
    import jinja2
    from prefect.events import DeploymentEventTrigger
    from prefect.events.schemas.events import Event

    from tasks.versioning import EVENT_PUSHED

    (raw,) = deployments["retrain-on-new-data"]["triggers"]
    trigger = DeploymentEventTrigger.model_validate(raw)
    assert trigger.expect == {EVENT_PUSHED} and trigger.threshold == 1
    md5 = "ab" * 16 + ".dir"
    event = Event(
        event=EVENT_PUSHED,
        resource={"prefect.resource.id": f"arl.dataset.{md5}", "arl.dataset.md5": md5},
        payload={"md5": md5, "path": "data/new", "remote": "/r", "git_rev": "f" * 40},
    )
    assert trigger.match.matches(event.resource)
    rendered = {k: jinja2.Template(v).render(event=event) for k, v in raw["parameters"]["dataset"].items()}
    assert rendered == {"path": "data/new", "version": md5}
