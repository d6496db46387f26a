"""The control-plane provider's pure decisions: versions, names, shapes, status, registries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.baremetal.assisted_controlplane import logic
from shared.errors import PermanentError

Json = dict[str, Any]


def obj(name: str, **meta: Any) -> Json:
    return {"metadata": {"name": name, **meta}}


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("4.14.0", False),
        ("v4.16.3", False),
        ("4.15.0-rc.1+build.5", False),
        ("4.13.99", True),
        ("4.14.0-rc.1", True),  # a pre-release sorts before its release
        ("3.11.0", True),
    ],
)
def test_versions_below_4_14_are_refused_in_upstreams_words(version: str, refused: bool) -> None:
    message = logic.unsupported_version(version)
    assert (message is not None) is refused
    if refused:
        assert message == (
            f"version {version} is not supported, the minimum supported version is 4.14.0"
        )


@pytest.mark.parametrize("version", ["", "latest", "4.14", "4.14.0.1", "04.14.0"])
def test_a_version_that_is_not_semver_is_permanent(version: str) -> None:
    with pytest.raises(PermanentError) as refused:
        logic.unsupported_version(version)
    assert refused.value.reason == "InvalidVersion"


def test_holds_compares_what_an_apply_names_and_owner_references_by_uid() -> None:
    current = {
        "metadata": {
            "name": "x",
            "labels": {"a": "1", "b": "2"},
            "ownerReferences": [{"uid": "other"}, {"uid": "acp", "kind": "K"}],
            "finalizers": ["hive"],
        },
        "spec": {"x": [{"cidr": "10.0.0.0/8", "hostPrefix": 23}], "y": 1},
    }
    assert logic.holds(
        current,
        {
            "metadata": {"labels": {"a": "1"}, "ownerReferences": [{"uid": "acp"}]},
            "spec": {"x": [{"cidr": "10.0.0.0/8"}]},
        },
    )
    assert not logic.holds(current, {"metadata": {"labels": {"a": "2"}}})
    assert not logic.holds(current, {"metadata": {"ownerReferences": [{"uid": "new"}]}})
    assert not logic.holds(current, {"spec": {"x": []}})
    assert not logic.holds(current, {"spec": {"z": {"k": 1}}})


def test_pending_names_complete_a_dead_runs_parts_and_roll_back_adopted_or_going_ones() -> None:
    machine_owner = {"kind": "Machine", "apiVersion": "cluster.x-k8s.io/v1beta1", "name": "a-3"}
    machines = [obj("a-1")]
    parts = [
        obj("a-1"),  # has its Machine
        obj("a-2"),  # a dead run's OAC
        obj("a-2"),  # ... and its clone
        obj("a-3", ownerReferences=[machine_owner]),  # its Machine was deleted
        obj("a-4", deletionTimestamp="now"),
        obj("a-5"),
    ]
    assert logic.pending_names(machines, parts) == (["a-2", "a-5"], ["a-3", "a-4"])


def test_new_names_are_the_acp_name_and_five_characters() -> None:
    name = logic.new_name(obj("c1-control-plane"))
    prefix, suffix = name.rsplit("-", 1)
    assert prefix == "c1-control-plane"
    assert len(suffix) == 5
    assert set(suffix) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_status_changes_keep_only_what_the_status_lacks() -> None:
    current = {
        "replicas": 3,
        "conditions": [
            {"type": "MachinesCreated", "status": "True", "reason": "MachinesCreated"},
        ],
    }
    same = logic.condition("MachinesCreated", True, "MachinesCreated")
    other = logic.condition("ControlPlaneReady", False, "ControlPlaneInstalling", "m")
    patch, changed = logic.status_changes(current, {"replicas": 3, "ready": False}, [same, other])
    assert patch == {"ready": False}
    assert changed == [other]


def test_ready_replicas_count_machines_whose_ready_condition_is_true() -> None:
    acp = {"metadata": {"name": "cp"}, "spec": {"replicas": 3, "version": "4.16.0"}}
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    status = logic.replica_status(acp, "c1", [ready, not_ready])
    assert status["replicas"] == 2
    assert (status["readyReplicas"], status["unavailableReplicas"]) == (1, 2)
    assert logic.machines_created(acp, [ready, not_ready]).status == "False"
    assert logic.machines_created(acp, [ready, ready, ready]).status == "True"


def test_an_unset_machine_deployment_count_is_cluster_apis_default_of_one() -> None:
    assert (
        logic.worker_count([{"spec": {"replicas": 2}}, {"spec": {}}, {"spec": {"replicas": 0}}])
        == 3
    )


def test_the_control_plane_ready_condition_follows_the_aci_state() -> None:
    def aci(state: str, info: str = "") -> Json:
        return {"status": {"debugInfo": {"state": state, "stateInfo": info}}}

    assert logic.control_plane_ready(aci("adding-hosts")).status == "True"
    installing = logic.control_plane_ready(aci("finalizing"))
    assert installing.message == "Controlplane installing, status: finalizing"
    failed = logic.control_plane_ready(aci("error", "boom"))
    assert (failed.reason, failed.message) == ("InstallationFailed", "boom")


def test_admin_kubeconfig_secrets_are_recognised_by_hives_labels() -> None:
    labelled = {
        logic.CD_NAME_LABEL: "cp",
        logic.SECRET_TYPE_LABEL: "kubeconfig",
    }
    assert logic.is_admin_kubeconfig(obj("anything", labels=labelled)) == "cp"
    assert logic.is_admin_kubeconfig(obj("cp-admin-kubeconfig", labels={logic.CD_NAME_LABEL: "cp"}))
    password = {logic.CD_NAME_LABEL: "cp", logic.SECRET_TYPE_LABEL: "kubeadmincreds"}
    assert logic.is_admin_kubeconfig(obj("cp-admin-password", labels=password)) is None
    assert logic.is_admin_kubeconfig(obj("x")) is None


def registry(conf: str, **extra: str) -> Json:
    return {
        "metadata": {"name": "r", "namespace": "ns"},
        "data": {"registries.conf": conf, **extra},
    }


def test_a_registry_by_digest_alone_renders_only_its_mirror_set() -> None:
    conf = '[[registry]]\nlocation = "a.io"\n[[registry.mirror]]\nlocation = "m.local/a"\n'
    data = logic.registry_config_map(registry(conf), "ns")["data"]
    assert set(data) == {"image-digest-mirror-set.json"}
    rendered = json.loads(data["image-digest-mirror-set.json"])
    assert rendered == {
        "kind": "ImageDigestMirrorSet",
        "apiVersion": "config.openshift.io/v1",
        "metadata": {"name": "additional-registry"},
        "spec": {"imageDigestMirrors": [{"source": "a.io", "mirrors": ["m.local/a"]}]},
    }


@pytest.mark.parametrize(
    "conf",
    [
        "not toml = = =",
        'other = "x"',
        '[[registry]]\n[[registry.mirror]]\nlocation = "m"\n',
        '[[registry]]\nlocation = "a.io"\n',
        '[[registry]]\nlocation = "a.io"\n[[registry.mirror]]\ninsecure = true\n',
        '[[registry]]\nlocation = "a.io"\n[[registry.mirror]]\nlocation = "m"\n'
        'pull-from-mirror = "never"\n',
    ],
)
def test_a_malformed_registries_conf_is_permanent(conf: str) -> None:
    with pytest.raises(PermanentError) as refused:
        logic.registry_config_map(registry(conf), "ns")
    assert refused.value.reason == "InvalidImageRegistry"


def test_the_release_image_defaults_to_the_public_release_of_the_version() -> None:
    acp = {
        "spec": {"version": "v4.16.2", "openshiftAssistedConfigSpec": {"cpuArchitecture": "arm64"}}
    }
    assert logic.release_image(acp) == "quay.io/openshift-release-dev/ocp-release:4.16.2-arm64"
    acp["spec"]["config"] = {"releaseImage": "mirror/release:1"}
    assert logic.release_image(acp) == "mirror/release:1"
