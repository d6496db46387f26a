"""The generated CRDs are committed, structural, and carry what kubectl and the API server
need; the hand-written stand-in CRDs are well formed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import crdgen
from shared.models import RESOURCES as ALL_RESOURCES
from shared.models import azimuth as models

REPO = Path(__file__).resolve().parents[2]
DEPLOY_CRDS = REPO / "deploy" / "crds"
STANDIN_CRDS = REPO / "standins" / "crds"

# Schema keywords that may appear inside anyOf/oneOf/allOf/not of a structural schema: pure
# value validation, no types, descriptions, defaults or Kubernetes extensions.
VALUE_VALIDATION_ONLY = frozenset(
    {
        "enum",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
        "required",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "properties",
        "items",
    }
)
JUNCTORS = ("anyOf", "oneOf", "allOf", "not")


def _rendered() -> dict[str, dict[str, Any]]:
    return {name: yaml.safe_load(text) for name, text in crdgen.render_all().items()}


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _crd(kind: type[models.CustomResource]) -> dict[str, Any]:
    return _rendered()[f"{kind.resource.crd_name}.yaml"]


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def _junctor_problems(node: Any, path: str) -> Iterator[str]:
    """Inside a junctor only value validations are allowed, recursively."""
    if isinstance(node, list):
        for item in node:
            yield from _junctor_problems(item, path)
        return
    if not isinstance(node, dict):
        return
    for key in set(node) - VALUE_VALIDATION_ONLY:
        yield f"{path}: {key!r} is not allowed inside a junctor"
    for value in node.values():
        if isinstance(value, dict | list):
            yield from _junctor_problems(value, path)


def _structural_problems(schema: dict[str, Any]) -> Iterator[str]:
    for path, node in _walk(schema):
        where = path or "<root>"
        if "$ref" in node or "default" in node:
            yield f"{where}: $ref or default present"
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "type" not in node and not node.get("x-kubernetes-int-or-string") and not preserve:
            yield f"{where}: no type"
        if "properties" in node and "additionalProperties" in node:
            yield f"{where}: both properties and additionalProperties"
        extra = node.get("additionalProperties")
        if extra is not None and not isinstance(extra, dict):
            yield f"{where}: additionalProperties must be a schema"
        for junctor in JUNCTORS:
            if junctor in node:
                yield from _junctor_problems(node[junctor], f"{where}.{junctor}")


# --------------------------------------------------------------------------------------------
# Drift and the command line
# --------------------------------------------------------------------------------------------


def test_committed_crds_match_the_models() -> None:
    problems = crdgen.check(DEPLOY_CRDS)

    assert not problems, (
        "deploy/crds is out of date with shared/models: run `make crds` "
        "(uv run python -m shared.crdgen --write deploy/crds)\n" + "\n".join(problems)
    )


def test_render_all_is_deterministic_and_sorted() -> None:
    first, second = crdgen.render_all(), crdgen.render_all()

    assert first == second
    assert list(first) == sorted(first)
    assert set(first) == {f"{kind.resource.crd_name}.yaml" for kind in ALL_RESOURCES}
    assert all(text.startswith(crdgen.HEADER) for text in first.values())


def test_check_reports_a_diff_and_main_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crdgen.write(tmp_path)
    target = tmp_path / "clusters.azimuth.stackhpc.com.yaml"
    target.write_text(target.read_text().replace("minLength: 1", "minLength: 2", 1))

    assert crdgen.main(["--check", str(tmp_path)]) == 1

    err = capsys.readouterr().err
    assert "-                minLength: 2" in err
    assert "+                minLength: 1" in err
    assert "make crds" in err


def test_check_reports_missing_and_stale_files(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    (tmp_path / "apptemplates.azimuth.stackhpc.com.yaml").unlink()
    (tmp_path / "olds.azimuth.stackhpc.com.yaml").write_text(crdgen.HEADER + "kind: Old\n")

    problems = crdgen.check(tmp_path)

    assert any("olds.azimuth.stackhpc.com.yaml: stale" in p for p in problems)
    assert any("apptemplates.azimuth.stackhpc.com.yaml: missing" in p for p in problems)


def test_write_removes_stale_generated_files_only(tmp_path: Path) -> None:
    (tmp_path / "olds.azimuth.stackhpc.com.yaml").write_text(crdgen.HEADER + "kind: Old\n")
    (tmp_path / "hand-written.yaml").write_text("kind: Mine\n")

    assert crdgen.main(["--write", str(tmp_path)]) == 0

    assert not (tmp_path / "olds.azimuth.stackhpc.com.yaml").exists()
    assert (tmp_path / "hand-written.yaml").exists()
    assert crdgen.check(tmp_path) == []


def test_unions_without_a_structural_form_are_refused() -> None:
    with pytest.raises(crdgen.CrdGenerationError):
        crdgen.structural({"anyOf": [{"type": "string"}, {"type": "integer"}]})


def test_integer_exclusive_minimum_becomes_inclusive() -> None:
    assert crdgen.structural({"type": "integer", "exclusiveMinimum": 0}) == {
        "minimum": 1,
        "type": "integer",
    }
    assert crdgen.structural({"type": "number", "exclusiveMinimum": 0.5}) == {
        "exclusiveMinimum": True,
        "minimum": 0.5,
        "type": "number",
    }


# --------------------------------------------------------------------------------------------
# Shape of the generated CRDs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(crdgen.render_all()))
def test_generated_schema_is_structural(name: str) -> None:
    schema = _schema(_rendered()[name])

    assert list(_structural_problems(schema)) == []
    assert schema["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize("kind", models.RESOURCES, ids=lambda k: k.__name__)
def test_crd_envelope(kind: type[models.CustomResource]) -> None:
    crd = _crd(kind)
    info = kind.resource
    version = crd["spec"]["versions"][0]

    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == f"{info.plural}.azimuth.stackhpc.com"
    assert crd["spec"]["scope"] == info.scope.value
    assert crd["spec"]["names"]["categories"] == ["azimuth"]
    assert crd["spec"]["names"]["kind"] == info.kind
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert ("subresources" in version) is info.has_status
    assert ("status" in _schema(crd)["properties"]) is info.has_status


def test_scopes_and_status_subresources_match_upstream() -> None:
    assert _crd(models.Cluster)["spec"]["scope"] == "Namespaced"
    assert _crd(models.ClusterTemplate)["spec"]["scope"] == "Cluster"
    assert _crd(models.AppTemplate)["spec"]["scope"] == "Cluster"
    assert _crd(models.Cluster)["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert "subresources" not in _crd(models.ClusterTemplate)["spec"]["versions"][0]


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        (
            models.Cluster,
            [
                "Label",
                "Template",
                "Kubernetes Version",
                "Paused",
                "Phase",
                "Control Plane",
                "Node Count",
                "Addon Count",
                "Age",
            ],
        ),
        (models.ClusterTemplate, ["Label", "Kubernetes Version", "Deprecated", "Age"]),
        (
            models.AppTemplate,
            [
                "Chart name",
                "Version range",
                "Keep versions",
                "Sync freq.",
                "Label",
                "Last sync",
                "Age",
            ],
        ),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_printer_columns(kind: type[models.CustomResource], names: list[str]) -> None:
    columns = _crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"]

    assert [column["name"] for column in columns] == names
    assert all(column["jsonPath"].startswith(".") for column in columns)
    assert all(column["type"] in {"string", "integer", "boolean", "date"} for column in columns)


def test_node_group_cel_rules_use_the_model_messages() -> None:
    spec = _schema(_crd(models.Cluster))["properties"]["spec"]
    rules = spec["properties"]["nodeGroups"]["items"]["x-kubernetes-validations"]

    assert [(r["fieldPath"], r["message"]) for r in rules] == [
        (".count", models.COUNT_REQUIRED),
        (".minCount", models.MIN_COUNT_REQUIRED),
        (".maxCount", models.MAX_COUNT_REQUIRED),
        (".maxCount", models.MAX_COUNT_BELOW_MIN),
    ]
    assert all("has(self.autoscale)" in r["rule"] for r in rules)


def test_chart_name_is_checked_by_cel_not_by_pattern() -> None:
    spec = _schema(_crd(models.AppTemplate))["properties"]["spec"]
    name = spec["properties"]["chart"]["properties"]["name"]

    assert "pattern" not in name
    assert name["x-kubernetes-validations"] == [
        {"rule": "self.matches('^[a-z0-9-]+$')", "message": models.CHART_NAME_INVALID}
    ]


def test_free_form_fields_preserve_unknown_fields() -> None:
    template = _schema(_crd(models.ClusterTemplate))["properties"]["spec"]["properties"]
    app = _schema(_crd(models.AppTemplate))["properties"]
    cluster = _schema(_crd(models.Cluster))["properties"]

    for node in (
        template["values"],
        app["spec"]["properties"]["defaultValues"],
        app["status"],
        app["status"]["properties"]["versions"]["items"]["properties"]["valuesSchema"],
        cluster["status"],
    ):
        assert node["x-kubernetes-preserve-unknown-fields"] is True
        assert node["type"] == "object"
    assert template["values"]["required"] == ["kubernetesVersion", "machineImageId"]


def test_typed_maps_use_additional_properties() -> None:
    status = _schema(_crd(models.Cluster))["properties"]["status"]["properties"]

    for name, required in (("nodes", None), ("addons", None), ("services", ["subdomain"])):
        values = status[name]["additionalProperties"]
        assert values["type"] == "object"
        assert "properties" in values
        assert "x-kubernetes-preserve-unknown-fields" not in status[name]
        if required:
            assert set(required) <= set(values["required"])


def test_optional_fields_are_nullable_and_constraints_survive() -> None:
    spec = _schema(_crd(models.Cluster))["properties"]["spec"]["properties"]
    group = spec["nodeGroups"]["items"]["properties"]
    addons = spec["addons"]["properties"]

    assert group["count"] == {
        "description": "The fixed number of nodes when not autoscaling.",
        "minimum": 0,
        "nullable": True,
        "type": "integer",
    }
    assert addons["monitoringLokiVolumeSize"]["minimum"] == 1
    assert addons["ingressControllerLoadBalancerIp"]["format"] == "ipv4"
    assert spec["leaseName"]["nullable"] is True
    assert spec["leaseName"]["minLength"] == 1
    assert "nullable" not in spec["label"]


def test_enums_and_conditions_in_status() -> None:
    status = _schema(_crd(models.Cluster))["properties"]["status"]["properties"]

    assert status["phase"]["enum"] == [member.value for member in models.ClusterPhase]
    assert status["nodes"]["additionalProperties"]["properties"]["role"]["enum"] == [
        "control-plane",
        "worker",
        "Unknown",
    ]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["properties"]["status"]["enum"] == ["True", "False", "Unknown"]


# --------------------------------------------------------------------------------------------
# Stand-in CRDs of the peers
# --------------------------------------------------------------------------------------------

STANDIN_FILES = sorted(STANDIN_CRDS.glob("*.yaml"))
EXPECTED_STANDINS = {
    "realms.identity.azimuth.stackhpc.com",
    "oidcclients.identity.azimuth.stackhpc.com",
    "platforms.identity.azimuth.stackhpc.com",
    "leases.scheduling.azimuth.stackhpc.com",
    "reservations.zenith.stackhpc.com",
    "clients.zenith.stackhpc.com",
    "helmreleases.addons.stackhpc.com",
    "manifests.addons.stackhpc.com",
    "clusters.cluster.x-k8s.io",
    "machines.cluster.x-k8s.io",
    "machinedeployments.cluster.x-k8s.io",
    "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
    "openstackmachines.infrastructure.cluster.x-k8s.io",
    "openstackclusters.infrastructure.cluster.x-k8s.io",
    "kustomizations.kustomize.toolkit.fluxcd.io",
}


def test_every_needed_standin_exists() -> None:
    names = {path.name.removesuffix(".yaml") for path in STANDIN_FILES}

    assert names >= EXPECTED_STANDINS


@pytest.mark.parametrize("path", STANDIN_FILES, ids=lambda p: p.name)
def test_standin_crd_is_well_formed(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]
    names = spec["names"]

    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}" == path.stem
    assert names["listKind"] == f"{names['kind']}List"
    assert [v["name"] for v in spec["versions"] if v["storage"]] == [spec["versions"][0]["name"]]
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert list(_structural_problems(schema)) == []
        for part in ("spec", "status"):
            assert schema["properties"][part]["x-kubernetes-preserve-unknown-fields"] is True
        assert any(column["name"] == "Age" for column in version["additionalPrinterColumns"])


@pytest.mark.parametrize(
    "path",
    [p for p in STANDIN_FILES if p.stem.endswith("x-k8s.io")],
    ids=lambda p: p.name,
)
def test_cluster_api_standins_serve_v1beta1_only(path: Path) -> None:
    versions = yaml.safe_load(path.read_text())["spec"]["versions"]

    assert [(v["name"], v["served"], v["storage"]) for v in versions] == [("v1beta1", True, True)]


@pytest.mark.parametrize(
    "name",
    sorted(EXPECTED_STANDINS),
)
def test_watched_standins_have_a_status_subresource(name: str) -> None:
    crd = yaml.safe_load((STANDIN_CRDS / f"{name}.yaml").read_text())

    assert crd["spec"]["versions"][0]["subresources"]["status"] == {}
