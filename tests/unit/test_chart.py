"""The Helm chart (``deploy/chart/capibus``) as the real helm renders it, and the Dockerfile.

Every rendering goes through the pinned helm binary (``testenv/build.sh`` puts it in
``~/.cache/capibus/tools/bin``, or ``$CAPIBUS_TOOLS_DIR/bin``): ``helm lint --strict`` and
``helm template`` over the values sets an install uses (the default all-in-one; split with
every service; self-contained NATS and Redis; cert-manager; KEDA; NetworkPolicies; TLS to NATS
and Redis), with the assertions made on the parsed objects. Those tests are skipped, saying
why, only when helm has not been built. No cluster is needed:
``tests/integration/test_chart.py`` installs the chart into the real API server.

What the chart copies or restates is checked against its source here, so a change on one side
fails before it ships: the CRDs, the alerts and the webhook configuration (copied because
``.Files`` cannot reach outside the chart), and ``files/services.yaml`` (modules, all-in-one
component names, durable consumers) against the services' own code.

There is no Docker engine to build the image with, so the Dockerfile is read for its
invariants instead (pinned bases, frozen locked sync, non-root user, helm's version).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from services import allinone
from services.__main__ import routes
from shared import access
from shared.wiring import table

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart" / "capibus"
RELEASE, NAMESPACE = "demo", "capibus-system"
FULLNAME = "demo-capibus"
Json = dict[str, Any]

CATALOG: dict[str, Json] = yaml.safe_load((CHART / "files" / "services.yaml").read_text())
DEFAULT_ON = {
    "watcher", "writer", "identity", "lease", "helm", "monitor", "discovery", "admission",
    "catalog", "exporter",
}  # fmt: skip
ALL_ON = {"services": {name: {"enabled": True} for name in CATALOG}}
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "DoNotSchedule",
}
VERSIONS = dict(
    line.split("=", 1)
    for line in (ROOT / "testenv" / "versions.env").read_text().splitlines()
    if line and not line.startswith("#")
)


def _tools_bin() -> Path:
    """Where ``testenv/build.sh`` puts the pinned programs (its own rule, without building)."""
    if tools := os.environ.get("CAPIBUS_TOOLS_DIR"):
        return Path(tools) / "bin"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "capibus" / "tools" / "bin"


HELM = _tools_bin() / "helm"
needs_helm = pytest.mark.skipif(
    not HELM.is_file(), reason=f"helm is not built ({HELM}): run `bash testenv/build.sh helm`"
)


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def helm(*args: str, home: Path) -> str:
    env = {
        **os.environ,
        **{f"HELM_{d.upper()}_HOME": str(home / d) for d in ("cache", "config", "data")},
    }
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise HelmError(done.stderr.strip())
    return done.stdout


@pytest.fixture(scope="module")
def render(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``render(values, chart=CHART)``: the objects ``helm template`` makes, cached per values."""
    home = tmp_path_factory.mktemp("helm")
    seen: dict[str, list[Json]] = {}

    def run(values: Json, chart: Path = CHART) -> list[Json]:
        key = json.dumps([str(chart), values], sort_keys=True)
        if key not in seen:
            path = home / f"values-{len(seen)}.yaml"
            path.write_text(yaml.safe_dump(values))
            out = helm("template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(path), home=home)
            seen[key] = [doc for doc in yaml.safe_load_all(out) if doc]
        return seen[key]

    return run


def of_kind(objects: list[Json], kind: str) -> dict[str, Json]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(deployment: Json) -> Json:
    containers: list[Json] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(deployment: Json) -> dict[str, Json]:
    return {e["name"]: e for e in container(deployment)["env"]}


# --- lint and the schema --------------------------------------------------------------------

VALUE_SETS: dict[str, Json] = {
    "default": {},
    "split-all": {"mode": "split", **ALL_ON},
    "self-contained": {"nats": {"deploy": True, "replicas": 3}, "redis": {"deploy": True}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "keda": {"mode": "split", "keda": {"enabled": True}, "nats": {"deploy": True}},
    "network-policy": {"networkPolicy": {"enabled": True}, "nats": {"deploy": True}},
    "monitoring": {
        "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    },
    "access": {
        "mode": "split", **ALL_ON, "access": {"enabled": True},
        "nats": {"deploy": True}, "redis": {"deploy": True},
    },
    "tls": {
        "nats": {"deploy": True, "replicas": 3, "tls": {"enabled": True}},
        "redis": {"deploy": True, "tls": {"enabled": True}},
    },
}  # fmt: skip


#: every optional object at once (split mode, so KEDA may be on too)
EVERYTHING: Json = {
    **ALL_ON,
    "mode": "split",
    "nats": {"deploy": True, "replicas": 3, "tls": {"enabled": True}},
    "redis": {"deploy": True, "tls": {"enabled": True}},
    "webhook": {"certManager": {"enabled": True}},
    "keda": {"enabled": True},
    "networkPolicy": {"enabled": True},
    "podDisruptionBudget": {"enabled": True},
    "access": {"enabled": True},
    "topologySpreadConstraints": [SPREAD],
    **VALUE_SETS["monitoring"],
}


@needs_helm
@pytest.mark.parametrize(
    "values", [{}, VALUE_SETS["tls"], EVERYTHING], ids=["default", "tls", "everything"]
)
def test_helm_lint_strict_passes(values: Json, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm("lint", "--strict", str(CHART), "-f", str(path), home=tmp_path)


@needs_helm
@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"mode": "both"}, "/mode"),
        ({"services": {"writter": {"enabled": True}}}, "writter"),
        ({"services": {"writer": {"enabled": True, "replica": 2}}}, "replica"),
        ({"nats": {"deploy": True, "replicas": 2}}, "/nats/replicas"),
        ({"partitions": 0}, "/partitions"),
        ({"keda": {"maxReplicaCount": 2048}}, "/keda/maxReplicaCount"),
        ({"keda": {"minReplicaCount": 0}}, "/keda/minReplicaCount"),
        ({"config": {"ACK-WAIT": "1"}}, "ACK-WAIT"),
        ({"nats": {"url": "http://nats:4222"}}, "/nats/url"),
        ({"webhook": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "name"),
        ({"webhook": {"certManager": {"ca": {"duration": "10y"}}}}, "/webhook/certManager/ca"),
        ({"nats": {"tls": {"enabled": True, "caFile": "/ca.crt"}}}, "caFile"),
        ({"redis": {"tls": {"enabled": True, "secretName": "Bad_Name"}}}, "/redis/tls/secretName"),
    ],
)
def test_the_schema_refuses_invalid_values(render: Any, values: Json, complaint: str) -> None:
    with pytest.raises(HelmError, match="schema") as refused:
        render(values)
    assert complaint in str(refused.value)


# --- workloads ------------------------------------------------------------------------------


@needs_helm
def test_default_is_one_allinone_process_of_the_azimuth_services(render: Any) -> None:
    objects = render({})
    deployments = of_kind(objects, "Deployment")
    assert list(deployments) == [FULLNAME]
    main = container(deployments[FULLNAME])
    components = main["args"][2].split(",")
    assert main["args"][:2] == ["run", "--only"]
    assert "command" not in main  # the image's entry point: python -m services
    assert {n for n in CATALOG if CATALOG[n].get("component") in components} == DEFAULT_ON
    assert list(of_kind(objects, "ServiceAccount")) == [FULLNAME]
    assert deployments[FULLNAME]["spec"]["template"]["spec"]["serviceAccountName"] == FULLNAME
    assert {p["name"] for p in main["ports"]} == {"metrics", "webhook"}


@needs_helm
def test_split_runs_each_service_as_its_module_with_its_own_account(render: Any) -> None:
    services = {**ALL_ON["services"], "writer": {"enabled": True, "replicas": 3}}
    objects = render({"mode": "split", "services": services})
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {f"{FULLNAME}-{name}" for name in CATALOG}
    assert set(of_kind(objects, "ServiceAccount")) == set(deployments)
    for name, facts in CATALOG.items():
        deployment = deployments[f"{FULLNAME}-{name}"]
        assert container(deployment)["command"] == ["python", "-m", facts["module"]]
        assert importlib.util.find_spec(facts["module"] + ".__main__") is not None
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == f"{FULLNAME}-{name}"
    assert deployments[f"{FULLNAME}-writer"]["spec"]["replicas"] == 3


@needs_helm
def test_allinone_keeps_the_ladybug_api_apart(render: Any) -> None:
    deployments = of_kind(render({"services": {"ladybug-api": {"enabled": True}}}), "Deployment")
    assert set(deployments) == {FULLNAME, f"{FULLNAME}-ladybug-api"}
    api = deployments[f"{FULLNAME}-ladybug-api"]
    assert container(api)["command"] == ["python", "-m", "services.ladybug.api"]
    assert api["spec"]["template"]["spec"]["serviceAccountName"] == FULLNAME
    assert container(api)["readinessProbe"]["httpGet"]["path"] == "/ladybug/healthy"


def _pod_specs(objects: list[Json]) -> Iterator[tuple[str, Json]]:
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o["metadata"]["name"], o["spec"]


@needs_helm
@pytest.mark.parametrize("name", ["default", "split-all", "self-contained", "tls"])
def test_every_container_is_locked_down(render: Any, name: str) -> None:
    """Non-root, read-only root, no capabilities, no privilege escalation, RuntimeDefault."""
    specs = dict(_pod_specs(render(VALUE_SETS[name])))
    assert specs
    for pod_name, pod in specs.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, pod_name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, pod_name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, pod_name
            assert sc["allowPrivilegeEscalation"] is False, pod_name
            assert sc["capabilities"]["drop"] == ["ALL"], pod_name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, pod_name
            assert c["resources"].get("limits", {}).get("memory"), pod_name
            if c["name"] in ("capibus", "endpoints"):
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], pod_name


@needs_helm
def test_settings_reach_the_environment(render: Any) -> None:
    values = {
        "partitions": 32,
        "config": {"CONSUMER__ACK_WAIT": "15", "HELM__CHART": {"name": "c"}, "LOG_JSON": True},
        "services": {"writer": {"enabled": True, "config": {"CONSUMER__ACK_WAIT": 20}}},
        "env": [{"name": "CAPIBUS_PARTITIONS", "value": "64"}],
    }
    env = env_of(of_kind(render(values), "Deployment")[FULLNAME])
    assert env["CAPIBUS_CONSUMER__ACK_WAIT"]["value"] == "20"  # the service's config wins
    assert env["CAPIBUS_HELM__CHART"]["value"] == '{"name":"c"}'
    assert env["CAPIBUS_LOG_JSON"]["value"] == "true"
    assert env["CAPIBUS_PARTITIONS"]["value"] == "64"  # an env entry wins, and appears once
    assert env["CAPIBUS_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["CAPIBUS_RETENTION__MAX_BYTES"]["value"] == "1073741824"
    assert env["NATS_URL"]["value"] == "nats://nats:4222"
    assert "KUBECONFIG" not in env  # in-cluster configuration
    names = [e["name"] for e in container(of_kind(render(values), "Deployment")[FULLNAME])["env"]]
    assert len(names) == len(set(names))


@needs_helm
def test_credentials_come_from_existing_secrets(render: Any) -> None:
    secret = {"existingSecret": {"name": "creds", "urlKey": "url"}}
    env = env_of(of_kind(render({"nats": secret, "redis": secret}), "Deployment")[FULLNAME])
    for name in ("NATS_URL", "REDIS_URL"):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "creds", "key": "url"}
    token = {"existingSecret": {"name": "creds", "tokenKey": "token"}, "url": "nats://n:4222"}
    env = env_of(of_kind(render({"nats": token}), "Deployment")[FULLNAME])
    names = list(env)
    assert names.index("CAPIBUS_NATS_TOKEN") < names.index("NATS_URL")  # $(VAR) needs it first
    assert env["NATS_URL"]["value"] == "nats://$(CAPIBUS_NATS_TOKEN)@n:4222"


# --- NATS and Redis deployed by the chart -----------------------------------------------------


@needs_helm
def test_self_contained_nats_cluster_and_redis(render: Any, tmp_path: Path) -> None:
    objects = render(VALUE_SETS["self-contained"])
    nats = of_kind(objects, "StatefulSet")[f"{FULLNAME}-nats"]
    assert nats["spec"]["replicas"] == 3
    image = nats["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"nats:{VERSIONS['NATS_VERSION'].lstrip('v')}-alpine"  # the tested server
    redis = of_kind(objects, "Deployment")[f"{FULLNAME}-redis"]
    assert re.fullmatch(r"redis:7\.\d+\.\d+-alpine", container(redis)["image"])
    env = env_of(of_kind(objects, "Deployment")[FULLNAME])
    assert env["NATS_URL"]["value"] == f"nats://{FULLNAME}-nats:4222"
    assert env["REDIS_URL"]["value"] == f"redis://{FULLNAME}-redis:6379/0"
    config = of_kind(objects, "ConfigMap")[f"{FULLNAME}-nats"]["data"]["nats.conf"]
    assert config.count(f"-nats-headless.{NAMESPACE}.svc.cluster.local:6222") == 3
    _check_nats_config(config, tmp_path)


def _check_nats_config(config: str, tmp_path: Path, tls: dict[str, bytes] | None = None) -> None:
    """The pinned nats-server accepts the rendered configuration (``-t``), when built.

    ``tls``: the files of the mounted TLS Secret, which the server loads while checking.
    """
    server = _tools_bin() / "nats-server"
    if not server.is_file():
        return
    if tls is not None:
        (tmp_path / "tls").mkdir()
        for name, content in tls.items():
            (tmp_path / "tls" / name).write_bytes(content)
        config = config.replace("/etc/nats/tls/", f"{tmp_path}/tls/")
    path = tmp_path / "nats.conf"
    path.write_text(config)
    host = "demo-capibus-nats-0.demo-capibus-nats-headless"
    env = {
        **os.environ,
        "POD_NAME": "demo-capibus-nats-0",
        "CLIENT_ADVERTISE": f"{host}:4222",
        "CLUSTER_ADVERTISE": f"{host}:6222",
    }
    done = subprocess.run(
        [str(server), "-c", str(path), "-t"], env=env, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr


# --- the admission webhook ------------------------------------------------------------------


def _source_webhooks() -> list[Json]:
    text = (ROOT / "deploy" / "webhooks" / "validating-webhook-configuration.yaml").read_text()
    hooks: list[Json] = yaml.safe_load(text)["webhooks"]
    return hooks


@needs_helm
def test_webhooks_are_the_source_files_own_with_a_generated_ca(render: Any) -> None:
    objects = render({})
    config = of_kind(objects, "ValidatingWebhookConfiguration")[f"{FULLNAME}-admission"]
    source = _source_webhooks()
    assert [{k: v for k, v in w.items() if k != "clientConfig"} for w in config["webhooks"]] == [
        {k: v for k, v in w.items() if k != "clientConfig"} for w in source
    ]
    assert {w["failurePolicy"] for w in config["webhooks"]} == {"Fail"}
    secret = of_kind(objects, "Secret")[f"{FULLNAME}-admission-tls"]["data"]
    for hook, original in zip(config["webhooks"], source, strict=True):
        client = hook["clientConfig"]
        assert client["caBundle"] == secret["ca.crt"]
        assert client["service"] == {
            "namespace": NAMESPACE,
            "name": f"{FULLNAME}-admission",
            "path": original["clientConfig"]["service"]["path"],
            "port": 443,
        }
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{FULLNAME}-admission.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    pod = of_kind(objects, "Deployment")[FULLNAME]["spec"]["template"]
    assert "checksum/webhook-tls" in pod["metadata"]["annotations"]


@needs_helm
def test_cert_manager_issues_and_injects_the_certificate(render: Any) -> None:
    objects = render(VALUE_SETS["cert-manager"])
    service = f"{FULLNAME}-admission"
    config = of_kind(objects, "ValidatingWebhookConfiguration")[service]
    annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{NAMESPACE}/{service}"
    assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])
    certificate = of_kind(objects, "Certificate")[service]["spec"]
    assert certificate["secretName"] == f"{service}-tls"
    assert f"{service}.{NAMESPACE}.svc" in certificate["dnsNames"]
    # The injected ca.crt is the chart's CA, which the certificate's renewals keep.
    _assert_issued_by_the_chart_ca(objects, certificate)
    assert not of_kind(objects, "Secret")
    pod = of_kind(objects, "Deployment")[FULLNAME]["spec"]["template"]
    assert "checksum/webhook-tls" in pod["metadata"]["annotations"]  # of what lookup reads
    own = {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "ca"}}
    objects = render({"webhook": {"certManager": own}})
    assert not of_kind(objects, "Issuer")
    assert set(of_kind(objects, "Certificate")) == {service}  # no CA of the chart's
    assert of_kind(objects, "Certificate")[service]["spec"]["issuerRef"] == own["issuerRef"]


def _assert_issued_by_the_chart_ca(objects: list[Json], certificate: Json) -> None:
    """``certificate`` (a spec) comes from the chart's CA Issuer, whose CA Certificate alone
    a self-signed Issuer signs; the CA's Secret (its key) is mounted by no pod."""
    ca = f"{FULLNAME}-ca"
    assert certificate["issuerRef"] == {"kind": "Issuer", "name": ca}
    issuers = of_kind(objects, "Issuer")
    assert issuers[ca]["spec"] == {"ca": {"secretName": ca}}
    ca_certificate = of_kind(objects, "Certificate")[ca]["spec"]
    assert ca_certificate["isCA"] is True
    assert ca_certificate["secretName"] == ca
    assert (ca_certificate["duration"], ca_certificate["renewBefore"]) == ("87600h", "17520h")
    # A renewal keeping the key keeps verifying what the CA signed before it.
    assert ca_certificate["privateKey"]["rotationPolicy"] == "Never"
    self_signed = ca_certificate["issuerRef"]
    assert self_signed == {"kind": "Issuer", "name": f"{FULLNAME}-selfsigned"}
    assert issuers[self_signed["name"]]["spec"] == {"selfSigned": {}}
    signed_by_self = [
        name
        for name, c in of_kind(objects, "Certificate").items()
        if c["spec"]["issuerRef"]["name"] == self_signed["name"]
    ]
    assert signed_by_self == [ca]
    kinds_and_names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(kinds_and_names) == len(set(kinds_and_names))  # each rendered once
    for kind in ("Deployment", "StatefulSet"):
        for workload in of_kind(objects, kind).values():
            secrets = {v.get("secret", {}).get("secretName") for v in _volumes(workload).values()}
            assert ca not in secrets, workload["metadata"]["name"]


# --- metrics, scaling, disruption, network ----------------------------------------------------


@needs_helm
def test_metrics_services_monitor_and_the_shipped_alerts(render: Any) -> None:
    objects = render({"mode": "split", **VALUE_SETS["monitoring"]})
    services = of_kind(objects, "Service")
    metrics = {n for n, s in services.items() if "capibus.metrics" in s["metadata"]["labels"]}
    serving = {n for n in DEFAULT_ON if CATALOG[n]["serves"] == "metrics"}
    assert metrics == {f"{FULLNAME}-{n}-metrics" for n in serving}
    monitor = of_kind(objects, "ServiceMonitor")[FULLNAME]["spec"]
    assert monitor["selector"]["matchLabels"]["capibus.metrics"] == "true"
    rule = of_kind(objects, "PrometheusRule")[FULLNAME]
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    assert rule["spec"] == source["spec"]


@needs_helm
def test_keda_scales_each_consumer_on_its_durable_consumers(render: Any) -> None:
    values = {
        **VALUE_SETS["keda"],
        "partitions": 4,
        "keda": {"enabled": True, "maxReplicaCount": 4},
    }
    objects = render(values)
    scaled = of_kind(objects, "ScaledObject")
    consumers = {n for n in DEFAULT_ON if "consumer" in CATALOG[n]}
    assert set(scaled) == {f"{FULLNAME}-{n}" for n in consumers}
    helm_triggers = scaled[f"{FULLNAME}-helm"]["spec"]["triggers"]
    assert len(helm_triggers) == len(CATALOG["helm"]["subscriptions"]) * 4
    assert {t["metadata"]["consumer"] for t in helm_triggers} >= {
        "helm-clusters-p0",
        "helm-secrets-p3",
    }
    assert {t["type"] for t in helm_triggers} == {"nats-jetstream"}
    deployments = of_kind(objects, "Deployment")
    assert "replicas" not in deployments[f"{FULLNAME}-helm"]["spec"]  # the HPA owns it
    assert deployments[f"{FULLNAME}-watcher"]["spec"]["replicas"] == 1
    with pytest.raises(HelmError, match="above the partition count"):
        render({**values, "keda": {"enabled": True, "maxReplicaCount": 5}})
    with pytest.raises(HelmError, match="needs mode: split"):
        render({**values, "mode": "allinone"})


@needs_helm
def test_disruption_budgets_and_spread_when_asked(render: Any) -> None:
    values = {
        "mode": "split",
        "podDisruptionBudget": {"enabled": True},
        "topologySpreadConstraints": [SPREAD],
    }
    objects = render(values)
    deployments = of_kind(objects, "Deployment")
    budgets = of_kind(objects, "PodDisruptionBudget")
    assert set(budgets) == set(deployments)
    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert budgets[name]["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread == [{**SPREAD, "labelSelector": {"matchLabels": selector}}]
    assert not of_kind(render({"mode": "split"}), "PodDisruptionBudget")


@needs_helm
def test_network_policies_open_only_what_each_pod_serves(render: Any) -> None:
    objects = render({**VALUE_SETS["network-policy"], "mode": "split", **ALL_ON})
    policies = of_kind(objects, "NetworkPolicy")
    assert set(policies) == set(of_kind(objects, "Deployment")) | {f"{FULLNAME}-nats"}
    ports = {
        name: [port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]]
        for name, policy in policies.items()
    }
    assert ports[f"{FULLNAME}-writer"] == ["metrics"]
    assert ports[f"{FULLNAME}-admission"] == ["webhook"]
    assert ports[f"{FULLNAME}-ladybug-api"] == ["http"]
    assert ports[f"{FULLNAME}-nats"] == ["client", "cluster", "monitor"]
    webhook_rule = policies[f"{FULLNAME}-admission"]["spec"]["ingress"][0]
    assert "from" not in webhook_rule  # the API server has no pod labels


@needs_helm
def test_helm_test_pod_asks_every_workload(render: Any) -> None:
    objects = render({"mode": "split", **ALL_ON})
    pod = of_kind(objects, "Pod")[f"{FULLNAME}-test"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    targets = pod["spec"]["containers"][0]["args"]
    metrics = [n for n in CATALOG if CATALOG[n]["serves"] == "metrics"]
    assert len(targets) == len(metrics) + 2
    assert f"https://{FULLNAME}-admission.{NAMESPACE}.svc:443/healthz" in targets
    assert f"http://{FULLNAME}-ladybug-api:1470/ladybug/healthy" in targets


@needs_helm
def test_helm_test_script_passes_against_answering_endpoints(render: Any) -> None:
    script = of_kind(render({}), "Pod")[f"{FULLNAME}-test"]["spec"]["containers"][0]["command"]
    assert script[:2] == ["python", "-c"]

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"# EOF\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        done = subprocess.run(
            [sys.executable, "-c", script[2], url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{url}: 200" in done.stdout


@needs_helm
def test_helpers_the_rbac_template_relies_on(tmp_path: Path, render: Any) -> None:
    """``capibus.enabledServices`` and ``capibus.serviceAccountName``, through a probe template."""
    chart = tmp_path / "capibus"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\ndata:\n"
        '  enabled: {{ include "capibus.enabledServices" . | quote }}\n'
        '  {{- range include "capibus.enabledServices" . | fromJsonArray }}\n'
        '  {{ . }}: {{ include "capibus.serviceAccountName" (dict "root" $ "service" .) }}\n'
        "  {{- end }}\n"
    )
    for mode, account in (("split", f"{FULLNAME}-writer"), ("allinone", FULLNAME)):
        probe = of_kind(render({"mode": mode}, chart), "ConfigMap")["probe"]["data"]
        assert json.loads(probe["enabled"]) == sorted(DEFAULT_ON)
        assert probe["writer"] == account
        accounts = set(of_kind(render({"mode": mode}, chart), "ServiceAccount"))
        assert {probe[name] for name in DEFAULT_ON} == accounts


# --- what the chart copies or restates ------------------------------------------------------


@pytest.mark.parametrize(
    ("copy", "source"),
    [
        ("files/prometheus/alerts.yaml", "deploy/prometheus/alerts.yaml"),
        (
            "files/webhooks/validating-webhook-configuration.yaml",
            "deploy/webhooks/validating-webhook-configuration.yaml",
        ),
    ],
)
def test_copied_files_equal_their_sources(copy: str, source: str) -> None:
    assert (CHART / copy).read_bytes() == (ROOT / source).read_bytes(), (
        f"refresh the chart's copy: cp {source} deploy/chart/capibus/{copy}"
    )


def test_chart_crds_equal_the_generated_ones() -> None:
    sources = {p.name: p.read_bytes() for p in (ROOT / "deploy" / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    refresh = "rm deploy/chart/capibus/crds/*; cp deploy/crds/*.yaml deploy/chart/capibus/crds/"
    assert copies == sources, f"refresh the chart's copies: {refresh}"


def test_service_catalog_matches_the_services() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    schema_services = schema["properties"]["services"]["properties"]
    assert set(CATALOG) == set(values["services"]) == set(schema_services)
    components = {c.name for c in allinone.COMPONENTS}
    assert {f["component"] for f in CATALOG.values() if "component" in f} == components
    for facts in CATALOG.values():
        assert importlib.util.find_spec(facts["module"] + ".__main__") is not None, facts
    declared = {(r.service, r.subscription, r.stream) for r in table(routes())}
    charted = {
        (f["consumer"], subscription, stream)
        for f in CATALOG.values()
        if "consumer" in f
        for subscription, stream in f["subscriptions"].items()
    }
    assert charted == declared
    consumers = schema["definitions"]["consumerService"]["enum"]
    assert sorted(consumers) == sorted(n for n, f in CATALOG.items() if "consumer" in f)


def test_chart_readme_describes_every_top_level_value() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [key for key in values if f"`{key}" not in readme]
    assert not missing


# --- the Dockerfile -------------------------------------------------------------------------


def _dockerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped (heredoc bodies kept)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_dockerfile_pins_its_bases_and_runs_as_non_root() -> None:
    lines = _dockerfile()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", "\n".join(lines), re.MULTILINE))
    python = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", python)
    bases = [line.split()[1] for line in lines if line.startswith("FROM ")]
    for base in bases:
        image = args.get(base.strip("${}"), base)
        assert re.search(r":\d+\.\d+\.\d+", image), f"{image} is not pinned to a release"
    final = [line for line in lines if line.startswith("FROM ")][-1]
    assert final.split()[1] == "${PYTHON_IMAGE}"
    assert " AS " not in final
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] == "10001"
    assert args["HELM_VERSION"] == VERSIONS["HELM_VERSION"]


def test_dockerfile_installs_the_locked_runtime_dependencies_only() -> None:
    syncs = [line for line in _dockerfile() if "uv sync" in line]
    assert syncs
    assert all("--frozen" in s and "--no-dev" in s for s in syncs)
    lines = _dockerfile()
    assert 'ENTRYPOINT ["python", "-m", "services"]' in lines
    assert "/usr/local/bin/helm" in " ".join(lines)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*") + 1 :]  # an allow-list: nothing unlisted reaches the build


# --- bus access (shared/access.py) -----------------------------------------------------------


def _nats_conf_users(objects: list[Json]) -> dict[str, Json]:
    (config,) = [
        c["data"]["nats.conf"]
        for c in of_kind(objects, "ConfigMap").values()
        if "nats.conf" in c["data"]
    ]
    lines = [ln.strip() for ln in config.splitlines() if ln.strip().startswith('{"user"')]
    users = [json.loads(re.sub(r'"password": (\$\w+)', r'"password": "\1"', ln)) for ln in lines]
    return {u["user"]: u for u in users}


@needs_helm
def test_the_chart_renders_the_nats_users_shared_access_does(render: Any) -> None:
    from services.__main__ import accesses  # noqa: PLC0415 (imports every service)

    declared = accesses()
    refs = {user: access.env_password(user) for user in access.users(declared)}
    expected: dict[str, Any] = {
        str(u["user"]): json.loads(json.dumps(u)) for u in access.nats_users(declared, 16, refs)
    }
    rendered = _nats_conf_users(render(VALUE_SETS["access"]))
    assert set(rendered) == set(expected)
    for user, want in expected.items():
        got = rendered[user]
        assert got["password"] == want["password"]
        if "permissions" not in want:
            assert "permissions" not in got
            continue
        for side in ("publish", "subscribe"):
            for verdict in ("allow", "deny"):
                assert sorted(got["permissions"][side].get(verdict, [])) == sorted(
                    want["permissions"][side].get(verdict, [])
                ), (user, side, verdict)


@needs_helm
def test_each_service_mounts_its_own_credentials_only(render: Any) -> None:
    objects = render(VALUE_SETS["access"])
    secrets = of_kind(objects, "Secret")
    for name, deployment in of_kind(objects, "Deployment").items():
        mounts = {m["name"]: m for m in container(deployment).get("volumeMounts", [])}
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        env = env_of(deployment)
        for url in ("NATS_URL", "REDIS_URL"):
            assert "@" not in env.get(url, {}).get("value", ""), (name, url)
        if "bus-credentials" not in mounts:
            continue
        secret = volumes["bus-credentials"]["secret"]["secretName"]
        user = mounts["bus-credentials"]["mountPath"].rsplit("/", 1)[1]
        assert secret == f"{RELEASE}-capibus-bus-{user}" or secret.endswith(f"-bus-{user}")
        assert secret in secrets
        assert set(secrets[secret]["data"]) == {"nats-password", "redis-password"}
        assert env["CAPIBUS_CREDENTIALS__DIR"]["value"] == "/etc/capibus/credentials"
    users = {m.rsplit("-bus-", 1)[1] for m in secrets if "-bus-" in m}
    assert {"admin", "all", "writer", "watcher"} <= users


@needs_helm
def test_the_bundled_redis_gets_every_leasing_user(render: Any) -> None:
    objects = render(VALUE_SETS["access"])
    (redis,) = [d for n, d in of_kind(objects, "Deployment").items() if n.endswith("-redis")]
    args = container(redis)["args"]
    assert args[args.index("default") + 1] == "off"
    writer = args.index("writer")
    assert args[writer + 1 : writer + 4] == [
        "on",
        ">$(CAPIBUS_REDIS_PASSWORD_WRITER)",
        "resetkeys",
    ]
    assert "~capibus:writer:*" in args[writer:]
    assert "watcher" not in args  # it holds no leases


# --- TLS to NATS and Redis ------------------------------------------------------------------


def _secret_files(secret: Json) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def _volumes(workload: Json) -> dict[str, Json]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def _mounts(pod_container: Json) -> dict[str, Json]:
    return {m["name"]: m for m in pod_container.get("volumeMounts", [])}


def _assert_mounts_the_cas(deployment: Json, secrets: dict[str, str]) -> None:
    """The capibus pod mounts ca.crt (only) of each server's Secret and names the file."""
    env = env_of(deployment)
    volumes = _volumes(deployment)
    mounts = _mounts(container(deployment))
    for server, secret in secrets.items():
        assert volumes[f"{server}-ca"]["secret"] == {
            "secretName": secret,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }
        mount = mounts[f"{server}-ca"]
        assert mount["readOnly"] is True
        variable = f"CAPIBUS_TLS__{server.upper()}_CA_FILE"
        assert env[variable]["value"] == f"{mount['mountPath']}/ca.crt"
    assert "checksum/server-ca" in deployment["spec"]["template"]["metadata"]["annotations"]


def _dns_names(certificate: x509.Certificate) -> list[str]:
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName)


@needs_helm
@pytest.mark.parametrize("replicas", [1, 3])
def test_bundled_servers_serve_tls_with_a_generated_certificate(
    render: Any, replicas: int, tmp_path: Path
) -> None:
    values = {**VALUE_SETS["tls"], "mode": "split", **ALL_ON}
    values["nats"] = {**values["nats"], "replicas": replicas}
    objects = render(values)
    secrets = of_kind(objects, "Secret")
    nats_secret, redis_secret = f"{FULLNAME}-nats-tls", f"{FULLNAME}-redis-tls"
    headless = f"{FULLNAME}-nats-headless.{NAMESPACE}.svc.cluster.local"
    for secret, service in ((nats_secret, f"{FULLNAME}-nats"), (redis_secret, f"{FULLNAME}-redis")):
        assert secrets[secret]["type"] == "kubernetes.io/tls"
        files = _secret_files(secrets[secret])
        ca = x509.load_pem_x509_certificate(files["ca.crt"])
        cert = x509.load_pem_x509_certificate(files["tls.crt"])
        cert.verify_directly_issued_by(ca)
        names = _dns_names(cert)
        for name in (service, f"{service}.{NAMESPACE}", f"{service}.{NAMESPACE}.svc"):
            assert name in names, (secret, name)
        assert f"{service}.{NAMESPACE}.svc.cluster.local" in names
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        # NATS routes present the same certificate as clients of each other.
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    nats_names = _dns_names(
        x509.load_pem_x509_certificate(_secret_files(secrets[nats_secret])["tls.crt"])
    )
    assert {f"{FULLNAME}-nats-{i}.{headless}" for i in range(replicas)} <= set(nats_names)

    nats = of_kind(objects, "StatefulSet")[f"{FULLNAME}-nats"]
    assert _volumes(nats)["tls"]["secret"]["secretName"] == nats_secret
    nats_container = container(nats)
    assert _mounts(nats_container)["tls"]["mountPath"] == "/etc/nats/tls"
    assert nats_container["readinessProbe"]["httpGet"]["port"] == "monitor"  # plain HTTP
    config = of_kind(objects, "ConfigMap")[f"{FULLNAME}-nats"]["data"]["nats.conf"]
    assert "tls {\n  cert_file: /etc/nats/tls/tls.crt\n  key_file: /etc/nats/tls/tls.key\n}" in (
        config
    )
    assert "http_port: 8222" in config
    if replicas == 3:
        assert "ca_file: /etc/nats/tls/ca.crt" in config  # routes verify each other
        assert "advertise: $CLUSTER_ADVERTISE" in config
        assert "client_advertise: $CLIENT_ADVERTISE" in config
        advertised = {e["name"]: e.get("value") for e in nats_container["env"]}
        assert advertised["CLUSTER_ADVERTISE"] == f"$(POD_NAME).{headless}:6222"
        assert advertised["CLIENT_ADVERTISE"] == f"$(POD_NAME).{headless}:4222"
    else:
        assert "cluster {" not in config
        assert "advertise" not in config
    _check_nats_config(config, tmp_path, _secret_files(secrets[nats_secret]))

    redis = of_kind(objects, "Deployment")[f"{FULLNAME}-redis"]
    args = container(redis)["args"]
    assert args[args.index("--port") + 1] == "0"  # no plaintext port
    assert args[args.index("--tls-port") + 1] == "6379"
    assert args[args.index("--tls-auth-clients") + 1] == "no"
    for flag, file in (("cert", "tls.crt"), ("key", "tls.key"), ("ca-cert", "ca.crt")):
        assert args[args.index(f"--tls-{flag}-file") + 1] == f"/etc/redis/tls/{file}"
    for probe in ("livenessProbe", "readinessProbe"):
        command = container(redis)[probe]["exec"]["command"]
        assert command[:4] == ["redis-cli", "--tls", "--cacert", "/etc/redis/tls/ca.crt"]
    assert _volumes(redis)["tls"]["secret"]["secretName"] == redis_secret

    services = {
        name: d for name, d in of_kind(objects, "Deployment").items() if not name.endswith("-redis")
    }
    assert len(services) == len(CATALOG)
    for deployment in services.values():
        env = env_of(deployment)
        assert env["NATS_URL"]["value"] == f"tls://{FULLNAME}-nats:4222"
        assert env["REDIS_URL"]["value"] == f"rediss://{FULLNAME}-redis:6379/0"
        _assert_mounts_the_cas(deployment, {"nats": nats_secret, "redis": redis_secret})


@needs_helm
def test_tls_keeps_the_ports_of_services_and_network_policies(render: Any) -> None:
    plain = {"networkPolicy": {"enabled": True}, **VALUE_SETS["self-contained"]}
    tls = {"networkPolicy": {"enabled": True}, **VALUE_SETS["tls"]}
    for kind in ("Service", "NetworkPolicy"):
        assert [o["spec"] for o in of_kind(render(tls), kind).values()] == [
            o["spec"] for o in of_kind(render(plain), kind).values()
        ], kind


@needs_helm
def test_bundled_servers_use_a_given_tls_secret(render: Any) -> None:
    values = {
        "nats": {"deploy": True, "tls": {"enabled": True, "secretName": "nats-cert"}},
        "redis": {"deploy": True, "tls": {"enabled": True, "secretName": "redis-cert"}},
    }
    objects = render(values)
    assert set(of_kind(objects, "Secret")) == {f"{FULLNAME}-admission-tls"}  # none made
    nats = of_kind(objects, "StatefulSet")[f"{FULLNAME}-nats"]
    assert _volumes(nats)["tls"]["secret"]["secretName"] == "nats-cert"
    redis = of_kind(objects, "Deployment")[f"{FULLNAME}-redis"]
    assert _volumes(redis)["tls"]["secret"]["secretName"] == "redis-cert"
    allinone = of_kind(objects, "Deployment")[FULLNAME]
    _assert_mounts_the_cas(allinone, {"nats": "nats-cert", "redis": "redis-cert"})


@needs_helm
def test_external_servers_need_tls_urls_and_trust_the_given_ca(render: Any) -> None:
    with pytest.raises(
        HelmError, match=r"nats\.tls\.enabled needs a tls:// nats\.url, not nats://"
    ):
        render({"nats": {"tls": {"enabled": True}}})
    plain = {"url": "redis://:secret@redis:6379/0", "tls": {"enabled": True}}
    with pytest.raises(HelmError, match=r"needs a rediss:// redis\.url") as refused:
        render({"redis": plain})
    assert "secret" not in str(refused.value)  # the URL's credentials stay out of the message
    values = {
        "nats": {"url": "tls://nats.example:4222", "tls": {"enabled": True, "secretName": "ca"}},
        "redis": {"url": "rediss://redis.example:6379/0", "tls": {"enabled": True}},
    }
    objects = render(values)
    allinone = of_kind(objects, "Deployment")[FULLNAME]
    env = env_of(allinone)
    assert env["NATS_URL"]["value"] == "tls://nats.example:4222"
    assert env["REDIS_URL"]["value"] == "rediss://redis.example:6379/0"
    _assert_mounts_the_cas(allinone, {"nats": "ca"})
    assert "redis-ca" not in _volumes(allinone)  # no CA given: the system's
    assert "CAPIBUS_TLS__REDIS_CA_FILE" not in env
    assert not of_kind(objects, "StatefulSet")
    assert not of_kind(objects, "Certificate")


@needs_helm
def test_cert_manager_issues_the_bundled_servers_certificates(render: Any) -> None:
    values = {
        **VALUE_SETS["tls"],
        "webhook": {"certManager": {"enabled": True}},
        "services": {"admission": {"enabled": False}},
    }
    objects = render(values)
    assert not of_kind(objects, "Secret")
    certificates = of_kind(objects, "Certificate")
    nats = certificates[f"{FULLNAME}-nats"]["spec"]
    assert nats["secretName"] == f"{FULLNAME}-nats-tls"
    headless = f"{FULLNAME}-nats-headless.{NAMESPACE}.svc.cluster.local"
    assert f"{FULLNAME}-nats-2.{headless}" in nats["dnsNames"]
    assert {"server auth", "client auth"} <= set(nats["usages"])
    redis = certificates[f"{FULLNAME}-redis"]["spec"]
    assert redis["secretName"] == f"{FULLNAME}-redis-tls"
    # The chart's CA, though no webhook certificate needs it here: the servers' renewals
    # leave the ca.crt the services loaded as it is.
    for spec in (nats, redis):
        _assert_issued_by_the_chart_ca(objects, spec)
    assert set(certificates) == {f"{FULLNAME}-nats", f"{FULLNAME}-redis", f"{FULLNAME}-ca"}
    # cert-manager fills each Secret's ca.crt with the CA Issuer's CA: the services mount it.
    _assert_mounts_the_cas(
        of_kind(objects, "Deployment")[FULLNAME],
        {"nats": f"{FULLNAME}-nats-tls", "redis": f"{FULLNAME}-redis-tls"},
    )


@needs_helm
def test_cert_manager_gives_the_webhook_and_the_servers_one_ca(render: Any) -> None:
    objects = render({**VALUE_SETS["tls"], "webhook": {"certManager": {"enabled": True}}})
    certificates = of_kind(objects, "Certificate")
    leaves = {f"{FULLNAME}-{name}" for name in ("admission", "nats", "redis")}
    assert set(certificates) == {*leaves, f"{FULLNAME}-ca"}
    for name in leaves:
        _assert_issued_by_the_chart_ca(objects, certificates[name]["spec"])


@needs_helm
def test_cert_manager_issues_the_servers_certificates_from_a_given_issuer(render: Any) -> None:
    own = {"kind": "ClusterIssuer", "name": "internal-ca"}
    values = {
        **VALUE_SETS["tls"],
        "webhook": {"certManager": {"enabled": True, "issuerRef": own}},
        "services": {"admission": {"enabled": False}},
    }
    objects = render(values)
    assert not of_kind(objects, "Issuer")
    certificates = of_kind(objects, "Certificate")
    assert set(certificates) == {f"{FULLNAME}-nats", f"{FULLNAME}-redis"}
    assert all(c["spec"]["issuerRef"] == own for c in certificates.values())
    _assert_mounts_the_cas(
        of_kind(objects, "Deployment")[FULLNAME],
        {"nats": f"{FULLNAME}-nats-tls", "redis": f"{FULLNAME}-redis-tls"},
    )
