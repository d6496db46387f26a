"""Every admission rule on the pure functions of ``services.admission.logic``."""

from typing import Any

import pytest

from services.admission import logic
from services.admission.logic import Template, Version
from shared.models import ClusterSpec


def v(text: str) -> Version:
    return Version.parse(text)


def template(version: str | None, *, deprecated: bool = False, name: str = "t") -> Template:
    return Template(name, deprecated, v(version) if version else None)


def cluster_spec(**changes: Any) -> dict[str, Any]:
    spec = {
        "label": "c",
        "templateName": "t",
        "cloudCredentialsSecretName": "creds",
        "controlPlaneMachineSize": "small",
    }
    return {**spec, **changes}


def template_spec(version: str = "1.30.2", **changes: Any) -> dict[str, Any]:
    spec = {
        "label": "k8s",
        "description": "a template",
        "values": {"kubernetesVersion": version, "machineImageId": "img"},
    }
    return {**spec, **changes}


# --- SemVer -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.30.2", Version(1, 30, 2)),
        ("v1.29.0", Version(1, 29, 0)),
        ("1.30.0-rc.1", Version(1, 30, 0, ("rc", "1"))),
        ("1.30.0+build.5", Version(1, 30, 0)),
    ],
)
def test_versions_parse(text: str, expected: Version) -> None:
    assert v(text) == expected


@pytest.mark.parametrize("text", ["latest", "1.30", "1.30.x", "01.2.3", "", "1.2.3-"])
def test_non_semver_is_refused(text: str) -> None:
    assert logic.parse_version(text) is None
    with pytest.raises(ValueError, match="SemVer"):
        Version.parse(text)


def test_parse_version_tolerates_non_strings() -> None:
    assert logic.parse_version(None) is None
    assert logic.parse_version(130) is None


def test_semver_precedence() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta.2", "1.0.0-beta.11"]
    ordered += ["1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"]
    versions = [v(t) for t in ordered]
    assert sorted(reversed(versions)) == versions
    assert v("v1.2.3") == v("1.2.3")
    assert str(v("v1.2.3-rc.1+b")) == "1.2.3-rc.1"


# --- specs ------------------------------------------------------------------------------------


def test_valid_cluster_spec_has_no_problem() -> None:
    assert logic.spec_problem(ClusterSpec, cluster_spec()) is None


def test_cluster_spec_problems_name_the_field_and_the_rule() -> None:
    spec = cluster_spec(nodeGroups=[{"name": "md", "machineSize": "small"}])
    problem = logic.spec_problem(ClusterSpec, spec)
    assert problem == "spec.nodeGroups[0].count: count is required when autoscale is false"


def test_every_spec_problem_is_reported() -> None:
    problem = logic.spec_problem(ClusterSpec, {"label": ""})
    assert problem is not None
    assert "spec.label:" in problem
    assert "spec.templateName: Field required" in problem
    assert problem.count(";") >= 2


def test_missing_spec_is_a_problem() -> None:
    assert logic.spec_problem(ClusterSpec, None) is not None


def test_template_spec_must_validate() -> None:
    assert logic.template_spec_problem(template_spec()) is None
    problem = logic.template_spec_problem({"label": "x", "values": {}})
    assert problem is not None
    assert "spec.description: Field required" in problem
    assert "spec.values.kubernetesVersion: Field required" in problem


def test_template_kubernetes_version_must_be_semver() -> None:
    problem = logic.template_spec_problem(template_spec("latest"))
    assert problem == (
        "spec.values.kubernetesVersion: kubernetesVersion must be a SemVer version such as "
        "1.30.2, not 'latest'"
    )
    assert logic.template_spec_problem(template_spec("v1.30.2")) is None


def test_read_template() -> None:
    obj = {"metadata": {"name": "t1"}, "spec": template_spec("1.29.1", deprecated=True)}
    assert logic.read_template(obj) == Template("t1", True, Version(1, 29, 1))
    odd = {"metadata": {"name": "t2"}, "spec": template_spec("latest")}
    assert logic.read_template(odd) == Template("t2", False, None)
    broken = logic.read_template({"metadata": {"name": "t3"}, "spec": {"label": "x"}})
    assert isinstance(broken, str)
    assert broken.startswith("specified cluster template is invalid: t3: spec.")


def test_spec_unchanged() -> None:
    old = {"metadata": {"labels": {}}, "spec": cluster_spec()}
    new = {"metadata": {"labels": {"a": "b"}, "finalizers": []}, "spec": cluster_spec()}
    assert logic.spec_unchanged(old, new)
    assert not logic.spec_unchanged(old, {"spec": cluster_spec(label="d")})
    assert not logic.spec_unchanged(None, new)
    assert not logic.spec_unchanged(old, None)


# --- template changes -------------------------------------------------------------------------


def test_deprecated_target_is_refused() -> None:
    assert logic.deprecation_problem(template("1.30.0")) is None
    problem = logic.deprecation_problem(template("1.30.0", deprecated=True, name="old"))
    assert problem == "specified cluster template is deprecated: old"


def upgrade(target: str | None, current: str | None, kubelet: str | None = None) -> str | None:
    return logic.upgrade_problem(
        target=template(target, name="new"),
        current=template(current, name="cur") if current else None,
        oldest_kubelet=v(kubelet) if kubelet else None,
    )


def test_patch_and_one_minor_upgrades_are_allowed() -> None:
    assert upgrade("1.29.5", "1.29.1") is None
    assert upgrade("1.30.0", "1.29.9") is None
    assert upgrade("1.29.1", "1.29.1") is None


def test_downgrade_is_refused() -> None:
    assert upgrade("1.29.0", "1.29.1") == (
        "specified cluster template would be a downgrade (1.29.1 -> 1.29.0)"
    )
    assert upgrade("1.28.9", "1.29.0") is not None
    assert upgrade("1.30.0-rc.1", "1.30.0") is not None


def test_major_change_is_refused() -> None:
    assert upgrade("2.0.0", "1.30.0") == (
        "upgrading to a new major version is not supported (1.30.0 -> 2.0.0)"
    )


def test_minor_jump_of_two_is_refused() -> None:
    assert upgrade("1.31.0", "1.29.3") == (
        "upgrading by more than one minor version is not supported (1.29.3 -> 1.31.0)"
    )


def test_minor_above_oldest_kubelet_plus_one_is_refused() -> None:
    assert upgrade("1.30.0", "1.29.0", kubelet="1.29.4") is None
    assert upgrade("1.30.0", "1.29.0", kubelet="1.28.4") == (
        "upgrading to more than one minor version newer than the oldest node is not supported "
        "(oldest node 1.28.4, template 1.30.0)"
    )


def test_kubelet_rule_holds_when_the_current_template_is_unknown() -> None:
    assert upgrade("1.31.0", None) is None
    assert upgrade("1.31.0", None, kubelet="1.29.0") is not None
    unreadable = logic.upgrade_problem(
        target=template("1.31.0"), current=template(None), oldest_kubelet=None
    )
    assert unreadable is None


def test_target_without_semver_is_refused() -> None:
    problem = upgrade(None, "1.29.0")
    assert problem == "specified cluster template is invalid: new: kubernetesVersion is not SemVer"


def test_oldest_kubelet() -> None:
    cluster = {
        "status": {
            "nodes": {
                "a": {"kubeletVersion": "v1.29.3"},
                "b": {"kubeletVersion": "v1.28.10"},
                "c": {"kubeletVersion": None},
                "d": {"kubeletVersion": "garbage"},
                "e": {},
            }
        }
    }
    assert logic.oldest_kubelet(cluster) == Version(1, 28, 10)
    assert logic.oldest_kubelet({"status": {"nodes": {"a": {}}}}) is None
    assert logic.oldest_kubelet({"status": {}}) is None
    assert logic.oldest_kubelet(None) is None


# --- template deletion ------------------------------------------------------------------------


def test_in_use_selector() -> None:
    assert logic.in_use_selector("k8s-1-30") == "azimuth.stackhpc.com/cluster-template=k8s-1-30"
    assert logic.in_use_selector("a.b") == "azimuth.stackhpc.com/cluster-template=a.b"
    # Longer than a label value can be: no Cluster can carry it.
    assert logic.in_use_selector("x" * 64) is None
    assert logic.in_use_selector("") is None
