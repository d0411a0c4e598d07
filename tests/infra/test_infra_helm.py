"""Helm values checked against schemas derived by hand from each chart's documented keys.

How honest this is: no chart is downloaded and `helm template` does not run here
(no network, no helm binary). The schemas below list only the keys these values set,
copied from the charts' values.yaml documentation (prefect-helm prefect-server and
prefect-worker, community-charts mlflow, kubernetes autoscaler cluster-autoscaler,
kuberay-operator), with additionalProperties false where we set keys, so a
misspelt or misplaced key fails. They cannot tell whether a chart version renamed a key.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import jsonschema
import pytest
import sqlalchemy
import yaml
from infra_support import load_all


def obj(required=(), **props):
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


ANY_MAP = {"type": "object"}
STR = {"type": "string", "minLength": 1}
NODE_SELECTOR = obj(["arl.dev/node-pool"], **{"arl.dev/node-pool": {"const": "system"}})
RESOURCES = obj(requests=ANY_MAP, limits=ANY_MAP)
PREFECT_IMAGE = obj(["repository", "prefectTag"], repository=STR, prefectTag=STR, pullPolicy=STR)
BASIC_AUTH_FROM_SECRET = obj(["enabled", "existingSecret"], enabled={"const": True}, existingSecret=STR)
ENV_LIST = {"type": "array", "items": obj(["name", "value"], name=STR, value={"type": "string"})}
SECRET_KEYS = obj(["name", "usernameKey", "passwordKey"], name=STR, usernameKey=STR, passwordKey=STR)

SCHEMAS = {
    "prefect-server.yaml": obj(
        ["server", "postgresql", "secret"],
        server=obj(
            ["image", "basicAuth", "uiConfig", "env"],
            image=PREFECT_IMAGE,
            basicAuth=BASIC_AUTH_FROM_SECRET,
            uiConfig=obj(["prefectUiApiUrl"], prefectUiApiUrl=STR),
            env=ENV_LIST,
            nodeSelector=NODE_SELECTOR,
            resources=RESOURCES,
        ),
        postgresql=obj(["enabled"], enabled={"const": False}),
        secret=obj(["create", "name"], create={"const": False}, name=STR),
    ),
    "prefect-worker.yaml": obj(
        ["fullnameOverride", "worker", "serviceAccount"],
        fullnameOverride={"type": "string", "pattern": "^prefect-worker-(gpu|epyc)$"},
        worker=obj(
            ["image", "apiConfig", "selfHostedServerApiConfig", "config"],
            image=PREFECT_IMAGE,
            clusterUid=STR,
            apiConfig={"const": "selfHostedServer"},
            selfHostedServerApiConfig=obj(
                ["apiUrl", "basicAuth"],
                apiUrl={"type": "string", "pattern": r"^http://.+:4200/api$"},
                basicAuth=BASIC_AUTH_FROM_SECRET,
            ),
            config=obj(["workPool", "type"], workPool=STR, type={"const": "kubernetes"}, installPolicy=STR),
            nodeSelector=NODE_SELECTOR,
            resources=RESOURCES,
        ),
        serviceAccount=obj(["create", "name"], create={"type": "boolean"}, name=STR),
        role=obj(create={"type": "boolean"}),
        rolebinding=obj(create={"type": "boolean"}),
    ),
    "mlflow.yaml": obj(
        ["backendStore", "artifactRoot", "extraArgs"],
        serviceAccount=obj(create={"type": "boolean"}, name=STR),
        nodeSelector=NODE_SELECTOR,
        backendStore=obj(
            ["postgres", "existingDatabaseSecret"],
            databaseMigration={"type": "boolean"},
            databaseConnectionCheck={"type": "boolean"},
            postgres=obj(
                ["enabled", "host", "port", "database"],
                enabled={"const": True},
                host=STR,
                port={"type": "integer"},
                database={"const": "mlflow"},
            ),
            existingDatabaseSecret=obj(["name"], name=STR, usernameKey=STR, passwordKey=STR),
        ),
        artifactRoot=obj(
            ["s3"],
            proxiedArtifactStorage={"type": "boolean"},
            s3=obj(["enabled", "bucket"], enabled={"const": True}, bucket=STR, path={"type": "string"}),
        ),
        auth=obj(
            ["enabled", "appName", "existingAdminSecret", "postgres"],
            enabled={"type": "boolean"},
            appName=STR,
            authorizationFunction=STR,
            defaultPermission={"enum": ["READ", "EDIT", "MANAGE", "NO_PERMISSIONS"]},
            existingAdminSecret=SECRET_KEYS,
            postgres=obj(
                ["enabled", "host", "port", "database", "existingSecret"],
                enabled={"type": "boolean"},
                host=STR,
                port={"type": "integer"},
                database=STR,
                existingSecret=SECRET_KEYS,
            ),
        ),
        extraArgs=obj(["allowedHosts"], allowedHosts=STR),
        extraEnvVars=ANY_MAP,
        resources=RESOURCES,
    ),
    "cluster-autoscaler.yaml": obj(
        ["autoDiscovery", "awsRegion"],
        autoDiscovery=obj(["clusterName"], clusterName=STR),
        awsRegion=STR,
        rbac=obj(serviceAccount=obj(create={"type": "boolean"}, name={"const": "cluster-autoscaler"})),
        extraArgs=ANY_MAP,
        nodeSelector=NODE_SELECTOR,
    ),
    "kuberay-operator.yaml": obj(nodeSelector=NODE_SELECTOR, resources=RESOURCES),
}


def _schema_for(name: str) -> dict:
    return SCHEMAS["prefect-worker.yaml" if name.startswith("prefect-worker-") else name]


def test_every_values_file_has_a_schema(rendered):
    names = sorted(p.name for p in (rendered / "helm").glob("*.yaml"))
    assert names and all(_schema_for(n) for n in names)


@pytest.mark.parametrize(
    "name",
    [
        "prefect-server.yaml",
        "prefect-worker-gpu.yaml",
        "prefect-worker-epyc.yaml",
        "mlflow.yaml",
        "cluster-autoscaler.yaml",
        "kuberay-operator.yaml",
    ],
)
def test_values_match_the_chart_keys(rendered, name):
    values = yaml.safe_load((rendered / "helm" / name).read_text())
    jsonschema.validate(values, _schema_for(name))


def test_a_misplaced_key_is_caught(rendered):
    values = yaml.safe_load((rendered / "helm/mlflow.yaml").read_text())
    values["backendStore"]["postgres"]["existingDatabaseSecret"] = values["backendStore"].pop(
        "existingDatabaseSecret"
    )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, SCHEMAS["mlflow.yaml"])


def test_workers_poll_the_two_pools(rendered, settings):
    pools = {
        yaml.safe_load((rendered / f"helm/prefect-worker-{p}.yaml").read_text())["worker"]["config"][
            "workPool"
        ]
        for p in ("gpu", "epyc")
    }
    assert pools == {settings["gpu_pool"]["name"], settings["epyc_pool"]["name"]}


def test_mlflow_allowed_hosts_cover_the_in_cluster_name(rendered, settings):
    hosts = yaml.safe_load((rendered / "helm/mlflow.yaml").read_text())["extraArgs"]["allowedHosts"].split(
        ","
    )
    assert f"mlflow.{settings['namespace']}.svc.cluster.local:5000" in hosts


def _mlflow_values(rendered) -> dict:
    return yaml.safe_load((rendered / "helm/mlflow.yaml").read_text())


def test_mlflow_runs_its_basic_auth_app_with_the_admin_from_a_secret(rendered):
    auth = _mlflow_values(rendered)["auth"]
    assert auth["enabled"] is True and auth["appName"] == "basic-auth"  # mlflow server --app-name basic-auth
    assert auth["existingAdminSecret"] == {
        "name": "mlflow-auth",
        "usernameKey": "username",
        "passwordKey": "password",
    }
    # By reference only: the chart would otherwise put these values into a Secret of its own.
    assert not {"adminUsername", "adminPassword"} & set(auth)


def test_mlflow_user_store_is_a_database_of_its_own_on_the_tracking_servers_postgres(rendered):
    values = _mlflow_values(rendered)
    users, tracking = values["auth"]["postgres"], values["backendStore"]
    assert users["enabled"] is True
    assert (users["host"], users["port"]) == (tracking["postgres"]["host"], tracking["postgres"]["port"])
    assert users["database"] != tracking["postgres"]["database"]
    assert users["existingSecret"] == {
        "name": "mlflow-db",
        "usernameKey": "username",
        "passwordKey": "password",
    }
    assert not {"user", "password"} & set(users)
    job = next(d for d in load_all(rendered / "k8s/db-init-job.yaml") if d["kind"] == "Job")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert f"CREATE DATABASE {users['database']} OWNER mlflow" in script


def _mlflow_auth_module(name: str):
    """A module of mlflow/server/auth loaded from its file: the package's __init__ builds the Flask app."""
    import mlflow

    path = Path(mlflow.__file__).parent / "server" / "auth" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_mlflow_auth_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chart_auth_ini(auth: dict, db_user: str, db_password: str, admin: str, admin_password: str) -> str:
    """The ini file the mlflow chart hands MLFLOW_AUTH_CONFIG_PATH with auth.postgres on: its
    templates/auth_ini_configmap.yaml (chart 1.11.5, mirrored by hand), after the init container's
    sed has put the Secrets' values in."""
    pg = auth["postgres"]
    driver = f"+{pg['driver']}" if pg.get("driver") else ""
    server = f"{pg['host']}:{pg['port']}/{pg['database']}"
    return (
        "[mlflow]\n"
        f"default_permission = {auth['defaultPermission']}\n"
        f"database_uri = postgresql{driver}://{db_user}:{db_password}@{server}\n"
        f"admin_username = {admin}\nadmin_password = {admin_password}\n"
        f"authorization_function = {auth['authorizationFunction']}\n"
    )


def test_mlflow_reads_the_auth_config_the_chart_writes(rendered, tmp_path, monkeypatch):
    config, permissions = _mlflow_auth_module("config"), _mlflow_auth_module("permissions")
    auth = _mlflow_values(rendered)["auth"]
    ini = tmp_path / "basic_auth.ini"
    ini.write_text(_chart_auth_ini(auth, "mlflow", "0123abcd" * 6, "arl", "fedc3210" * 6))
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(ini))
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    read = config.read_auth_config()
    assert permissions.get_permission(read.default_permission) == permissions.NO_PERMISSIONS
    assert read.authorization_function == config.DEFAULT_AUTHORIZATION_FUNCTION
    assert (read.admin_username, read.admin_password) == ("arl", "fedc3210" * 6)
    url = sqlalchemy.engine.make_url(read.database_uri)
    assert url.get_backend_name() == "postgresql"
    assert (url.host, url.port, url.database) == (
        auth["postgres"]["host"],
        auth["postgres"]["port"],
        auth["postgres"]["database"],
    )


def _server_env(rendered) -> dict[str, str]:
    server = yaml.safe_load((rendered / "helm/prefect-server.yaml").read_text())["server"]
    return {e["name"]: e["value"] for e in server["env"]}


def test_prefect_server_checks_csrf_and_answers_its_own_ui_only(rendered):
    env = _server_env(rendered)
    assert env["PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED"] == "true"
    origins = env["PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS"].split(",")
    assert "*" not in origins and all(re.fullmatch(r"https?://[^/*]+", o) for o in origins)
    ui_api = yaml.safe_load((rendered / "helm/prefect-server.yaml").read_text())["server"]["uiConfig"]
    assert ui_api["prefectUiApiUrl"].removesuffix("/api") in origins


def test_server_and_workers_share_one_auth_string_secret(rendered):
    server = yaml.safe_load((rendered / "helm/prefect-server.yaml").read_text())["server"]["basicAuth"]
    workers = [
        yaml.safe_load((rendered / f"helm/prefect-worker-{p}.yaml").read_text())["worker"]
        for p in ("gpu", "epyc")
    ]
    secrets = {server["existingSecret"]} | {
        w["selfHostedServerApiConfig"]["basicAuth"]["existingSecret"] for w in workers
    }
    assert secrets == {"prefect-api-auth"}
    assert "authString" not in server and all(
        "authString" not in w["selfHostedServerApiConfig"]["basicAuth"] for w in workers
    )


SECRET_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"(?i)(password|secret_?key|api_?key|token)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{8,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
]


def test_no_credentials_in_infra_files():
    from arl_cli.infra import INFRA_DIR

    for path in INFRA_DIR.rglob("*"):
        if (
            path.is_file()
            and ".rendered" not in path.parts
            and path.suffix in {".tf", ".yaml", ".json", ".md", ".sh"}
        ):
            text = path.read_text()
            for pattern in SECRET_PATTERNS:
                assert not pattern.search(text), (path, pattern.pattern)
