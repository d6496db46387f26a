"""The monitor's pure rules: every mapping row of upstream's H10-H16 (``docs/upstream.md`` §1),
in v1beta1 and v1beta2 shapes."""

from typing import Any

import pytest

from services.monitor import capi
from services.monitor.logic import (
    ClusterViews,
    control_plane_phase,
    difference,
    fragment,
    node_phase,
    owner,
)
from shared.kube import ResourceKind
from shared.mergepatch import apply as merge
from shared.messages import EventType
from shared.resources import (
    CAPI_CLUSTER,
    CLUSTER,
    CONTROL_PLANE,
    HELM_RELEASE,
    KUSTOMIZATION,
    MACHINE,
    MANIFESTS,
    SECRET,
)

Json = dict[str, Any]
V1 = "cluster.x-k8s.io/v1beta1"
V2 = "cluster.x-k8s.io/v1beta2"
CP_V1 = "controlplane.cluster.x-k8s.io/v1beta1"
CP_V2 = "controlplane.cluster.x-k8s.io/v1beta2"


def obj(api_version: str = V1, *, name: str = "x", labels: Json | None = None, **rest: Any) -> Json:
    metadata = {"name": name, "namespace": "ns", "labels": labels or {}}
    return {"apiVersion": api_version, "metadata": metadata, **rest}


def cond(kind: str, status: str = "True", reason: str = "", **extra: Any) -> Json:
    return {"type": kind, "status": status, "reason": reason, **extra}


def v1_status(*conditions: Json, **fields: Any) -> Json:
    return {"conditions": list(conditions), **fields}


def v2_status(*conditions: Json, **fields: Any) -> Json:
    """A v1beta2 status whose legacy view carries ``conditions``."""
    return {"deprecated": {"v1beta1": {"conditions": list(conditions)}}, **fields}


def one(
    kind: ResourceKind, o: Json, event: EventType = "MODIFIED", size: str | None = None
) -> Json:
    return fragment(kind, event, o, size=size)


# --- which Cluster ------------------------------------------------------------------------

LABELLED = {"capi.stackhpc.com/cluster": "demo"}


@pytest.mark.parametrize(
    "kind", [CAPI_CLUSTER, CONTROL_PLANE, MACHINE, HELM_RELEASE, MANIFESTS, KUSTOMIZATION]
)
def test_objects_belong_to_the_cluster_their_label_names(kind: ResourceKind) -> None:
    assert owner(kind, obj(labels=LABELLED)) == "demo"
    assert owner(kind, obj(labels={"cluster.x-k8s.io/cluster-name": "demo"})) is None
    assert owner(kind, obj()) is None


def test_only_kubeconfig_secrets_belong_to_a_cluster() -> None:
    capi_label = {"cluster.x-k8s.io/cluster-name": "demo"}
    assert owner(SECRET, obj("v1", name="demo-kubeconfig", labels=capi_label)) == "demo"
    assert owner(SECRET, obj("v1", name="demo-ca", labels=capi_label)) is None
    assert owner(SECRET, obj("v1", name="demo-etcd", labels=capi_label)) is None
    assert owner(SECRET, obj("v1", name="demo-kubeconfig-user", labels=capi_label)) is None
    assert owner(SECRET, obj("v1", name="demo-kubeconfig", labels=LABELLED)) is None


def test_kinds_the_monitor_does_not_follow_say_nothing() -> None:
    assert one(CLUSTER, obj(status={"phase": "Ready"})) == {}


# --- H10: CAPI Cluster → networkingPhase --------------------------------------------------


@pytest.mark.parametrize(
    "phase", ["Pending", "Provisioning", "Provisioned", "Deleting", "Failed", "Unknown"]
)
@pytest.mark.parametrize("api_version", [V1, V2])
def test_h10_networking_phase_mirrors_the_capi_cluster(phase: str, api_version: str) -> None:
    cluster = obj(api_version, status={"phase": phase})
    assert one(CAPI_CLUSTER, cluster) == {"networkingPhase": phase}


@pytest.mark.parametrize("status", [{}, {"phase": "Exploding"}, {"phase": ""}, None])
def test_h10_missing_or_unexpected_phase_is_unknown(status: Json | None) -> None:
    assert one(CAPI_CLUSTER, obj(status=status)) == {"networkingPhase": "Unknown"}


def test_h10_deleted_capi_cluster_is_unknown() -> None:
    cluster = obj(status={"phase": "Provisioned"})
    assert one(CAPI_CLUSTER, cluster, "DELETED") == {"networkingPhase": "Unknown"}


# --- H11: KubeadmControlPlane → controlPlanePhase, kubernetesVersion ------------------------


def kcp(status: Json, api_version: str = CP_V1, spec_version: str = "v1.31.2") -> Json:
    return obj(api_version, spec={"version": spec_version}, status=status)


@pytest.mark.parametrize(("api_version", "shape"), [(CP_V1, v1_status), (CP_V2, v2_status)])
@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], "Pending"),
        ([cond("Available")], "Pending"),
        ([cond("Ready"), cond("ControlPlaneComponentsHealthy")], "Ready"),
        ([cond("Ready"), cond("ControlPlaneComponentsHealthy", "False")], "Unhealthy"),
        ([cond("Ready")], "Unhealthy"),
        ([cond("Ready", "False", "ScalingUp")], "ScalingUp"),
        ([cond("Ready", "False", "ScalingDown")], "ScalingDown"),
        ([cond("Ready", "False", "WaitingForKubeadmInit")], "ScalingUp"),
        ([cond("Ready", "False", "WaitingForInfrastructure")], "ScalingUp"),
        ([cond("Ready", "False", "RollingUpdateInProgress")], "Upgrading"),
        ([cond("Ready", "False", "Deleting")], "Deleting"),
        ([cond("Ready", "False", "CertificatesGenerationFailed")], "Unhealthy"),
        ([cond("Ready", "Unknown", "")], "Unhealthy"),
    ],
)
def test_h11_control_plane_phase_from_the_legacy_ready_condition(
    api_version: str, shape: Any, conditions: list[Json], expected: str
) -> None:
    assert control_plane_phase(kcp(shape(*conditions), api_version)) == expected


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], "Pending"),
        ([cond("Initialized")], "Pending"),
        ([cond("Available"), cond("ControlPlaneComponentsHealthy")], "Ready"),
        ([cond("Available"), cond("ControlPlaneComponentsHealthy", "False")], "Unhealthy"),
        ([cond("Available", "False"), cond("Initialized", "False")], "ScalingUp"),
        ([cond("Available", "False"), cond("Initialized")], "Unhealthy"),
        ([cond("Available"), cond("ScalingUp")], "ScalingUp"),
        ([cond("Available"), cond("ScalingUp", "False"), cond("ScalingDown")], "ScalingDown"),
        ([cond("Available"), cond("RollingOut")], "Upgrading"),
        ([cond("Available", "False"), cond("Deleting"), cond("ScalingDown")], "Deleting"),
    ],
)
def test_h11_v1beta2_without_a_legacy_view_maps_its_own_conditions(
    conditions: list[Json], expected: str
) -> None:
    assert control_plane_phase(kcp({"conditions": conditions}, CP_V2)) == expected


def test_h11_v1beta1_view_prefers_legacy_conditions_over_its_v1beta2_block() -> None:
    status = v1_status(
        cond("Ready", "False", "ScalingUp"), v1beta2={"conditions": [cond("Available")]}
    )
    assert control_plane_phase(kcp(status)) == "ScalingUp"
    status = {"v1beta2": {"conditions": [cond("Available"), cond("RollingOut")]}}
    assert control_plane_phase(kcp(status)) == "Upgrading"


def test_h11_healthy_components_may_come_from_the_v1beta2_list() -> None:
    status = v1_status(
        cond("Ready"), v1beta2={"conditions": [cond("ControlPlaneComponentsHealthy")]}
    )
    assert control_plane_phase(kcp(status)) == "Ready"


@pytest.mark.parametrize(
    ("status", "spec_version", "expected"),
    [
        ({"version": "v1.31.2"}, "v1.32.0", "1.31.2"),
        ({}, "v1.32.0", "1.32.0"),
        ({"version": ""}, "1.32.0", "1.32.0"),
        ({}, "", None),
    ],
)
def test_h11_kubernetes_version_from_status_else_spec_without_v(
    status: Json, spec_version: str, expected: str | None
) -> None:
    assert one(CONTROL_PLANE, kcp(status, spec_version=spec_version))["kubernetesVersion"] == (
        expected
    )


def test_h11_deleted_control_plane_is_unknown_without_a_version() -> None:
    deleted = one(CONTROL_PLANE, kcp(v1_status(cond("Ready")), CP_V1), "DELETED")
    assert deleted == {"controlPlanePhase": "Unknown", "kubernetesVersion": None}


# --- H12: Machine → nodes.<name> ----------------------------------------------------------


def machine(phase: str | None, *conditions: Json, api_version: str = V1, **status: Any) -> Json:
    shape = v2_status if api_version == V2 else v1_status
    body = shape(*conditions, **status)
    if phase:
        body["phase"] = phase
    return obj(
        api_version,
        name="demo-md-0-abc",
        labels={
            "capi.stackhpc.com/cluster": "demo",
            "capi.stackhpc.com/component": "worker",
            "capi.stackhpc.com/node-group": "md-0",
        },
        spec={
            "version": "v1.31.2",
            "infrastructureRef": {
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "OpenStackMachine",
                "name": "demo-md-0-abc-xyz",
            },
        },
        status=body,
    )


@pytest.mark.parametrize("api_version", [V1, V2])
def test_h12_running_with_a_healthy_node_is_ready(api_version: str) -> None:
    assert node_phase(machine("Running", cond("NodeHealthy"), api_version=api_version)) == "Ready"


@pytest.mark.parametrize("api_version", [V1, V2])
@pytest.mark.parametrize("conditions", [[], [cond("NodeHealthy", "False")], [cond("Ready")]])
def test_h12_running_otherwise_is_unhealthy(api_version: str, conditions: list[Json]) -> None:
    assert node_phase(machine("Running", *conditions, api_version=api_version)) == "Unhealthy"


def test_h12_v1beta2_node_health_from_metav1_conditions() -> None:
    healthy = obj(V2, status={"phase": "Running", "conditions": [cond("NodeHealthy")]})
    assert node_phase(healthy) == "Ready"
    sick = obj(V2, status={"phase": "Running", "conditions": [cond("NodeHealthy", "False")]})
    assert node_phase(sick) == "Unhealthy"


def test_h12_v1beta2_updating_counts_as_running() -> None:
    assert node_phase(machine("Updating", cond("NodeHealthy"), api_version=V2)) == "Ready"
    assert node_phase(machine("Updating", api_version=V2)) == "Unhealthy"


def test_h12_provisioned_is_still_provisioning() -> None:
    assert node_phase(machine("Provisioned")) == "Provisioning"


@pytest.mark.parametrize(
    "phase", ["Pending", "Provisioning", "Deleting", "Deleted", "Failed", "Unknown"]
)
def test_h12_other_phases_map_one_to_one(phase: str) -> None:
    assert node_phase(machine(phase)) == phase


def test_h12_unexpected_phase_is_unknown() -> None:
    assert node_phase(machine("Exploding")) == "Unknown"


def test_h12_a_machine_not_yet_reconciled_is_pending_not_unknown() -> None:
    # Unknown would make the Cluster Unhealthy for a moment on every scale-up.
    assert node_phase(machine(None)) == "Pending"


def test_h12_node_entry_fields() -> None:
    addresses = [
        {"type": "Hostname", "address": "demo-md-0-abc"},
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "ExternalIP", "address": "203.0.113.9"},
        {"type": "InternalIP", "address": "10.0.1.5"},
    ]
    m = machine("Running", cond("NodeHealthy"), addresses=addresses)
    m["metadata"]["creationTimestamp"] = "2025-01-01T10:00:00Z"
    assert one(MACHINE, m, size="m1.small") == {
        "nodes": {
            "demo-md-0-abc": {
                "role": "worker",
                "phase": "Ready",
                "size": "m1.small",
                "ip": "10.0.0.5",
                "ips": ["10.0.0.5", "10.0.1.5"],
                "kubeletVersion": "1.31.2",
                "nodeGroup": "md-0",
                "created": "2025-01-01T10:00:00Z",
            }
        }
    }


def test_h12_missing_fields_are_none_and_odd_roles_unknown() -> None:
    m = obj(V1, name="m", labels={"capi.stackhpc.com/component": "etcd"})
    entry = one(MACHINE, m)["nodes"]["m"]
    assert entry == {
        "role": "Unknown",
        "phase": "Pending",
        "size": None,
        "ip": None,
        "ips": [],
        "kubeletVersion": None,
        "nodeGroup": None,
        "created": None,
    }


def test_h12_control_plane_role() -> None:
    m = obj(V1, name="cp", labels={"capi.stackhpc.com/component": "control-plane"})
    assert one(MACHINE, m)["nodes"]["cp"]["role"] == "control-plane"


def test_h12_deleted_machine_removes_its_node() -> None:
    assert one(MACHINE, machine("Running"), "DELETED") == {"nodes": {"demo-md-0-abc": None}}


def test_infrastructure_ref_in_both_shapes() -> None:
    v1 = machine("Running")
    assert capi.infrastructure_ref(v1) == capi.Reference(
        "infrastructure.cluster.x-k8s.io", "v1beta1", "OpenStackMachine", "demo-md-0-abc-xyz", "ns"
    )
    v1["spec"]["infrastructureRef"]["namespace"] = "elsewhere"
    assert capi.infrastructure_ref(v1).namespace == "elsewhere"  # type: ignore[union-attr]
    v2 = obj(
        V2, spec={"infrastructureRef": {"apiGroup": "infra.example", "kind": "M", "name": "n"}}
    )
    assert capi.infrastructure_ref(v2) == capi.Reference("infra.example", None, "M", "n", "ns")
    assert capi.infrastructure_ref(obj(spec={})) is None
    assert capi.infrastructure_ref(obj(spec={"infrastructureRef": {"kind": "M"}})) is None


# --- H13/H14: HelmRelease and Manifests → addons.<component> -------------------------------


def addon(api: str = "addons.stackhpc.com/v1alpha1", **status: Any) -> Json:
    labels = {"capi.stackhpc.com/cluster": "demo", "capi.stackhpc.com/component": "cni-calico"}
    return obj(api, name="demo-cni-calico", labels=labels, status=status)


@pytest.mark.parametrize("kind", [HELM_RELEASE, MANIFESTS])
@pytest.mark.parametrize(
    "phase",
    [
        "Unknown",
        "Pending",
        "Preparing",
        "Deployed",
        "Failed",
        "Installing",
        "Upgrading",
        "Uninstalling",
    ],
)
def test_h13_h14_addon_phase_and_revision(kind: ResourceKind, phase: str) -> None:
    assert one(kind, addon(phase=phase, revision=3)) == {
        "addons": {"cni-calico": {"phase": phase, "revision": 3}}
    }


@pytest.mark.parametrize("kind", [HELM_RELEASE, MANIFESTS])
def test_h13_h14_missing_status_is_unknown_revision_zero(kind: ResourceKind) -> None:
    expected = {"addons": {"cni-calico": {"phase": "Unknown", "revision": 0}}}
    assert one(kind, addon()) == expected
    assert one(kind, addon(phase="Exploding", revision=-1)) == expected


@pytest.mark.parametrize("kind", [HELM_RELEASE, MANIFESTS, KUSTOMIZATION])
def test_h13_to_h15_deleted_addon_is_removed(kind: ResourceKind) -> None:
    assert one(kind, addon(phase="Deployed"), "DELETED") == {"addons": {"cni-calico": None}}


@pytest.mark.parametrize("kind", [HELM_RELEASE, MANIFESTS, KUSTOMIZATION])
def test_addons_without_a_component_say_nothing(kind: ResourceKind) -> None:
    unlabelled = obj(labels=LABELLED, status={"phase": "Deployed"})
    assert one(kind, unlabelled) == {}
    assert one(kind, unlabelled, "DELETED") == {}


# --- H15: Flux Kustomization → addons.<component> -----------------------------------------

FLUX = "kustomize.toolkit.fluxcd.io/v1"


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([cond("Ready", observedGeneration=4)], {"phase": "Deployed", "revision": 4}),
        ([cond("Ready", "False", observedGeneration=2)], {"phase": "Failed", "revision": 2}),
        ([cond("Ready", "Unknown")], {"phase": "Failed", "revision": 0}),
        ([cond("Reconciling", observedGeneration=5)], {"phase": "Pending", "revision": 5}),
        ([cond("Healthy", "False"), cond("Ready")], {"phase": "Pending", "revision": 0}),
        ([], {"phase": "Unknown", "revision": 0}),
    ],
)
def test_h15_flux_first_condition_decides(conditions: list[Json], expected: Json) -> None:
    assert one(KUSTOMIZATION, addon(FLUX, conditions=conditions)) == {
        "addons": {"cni-calico": expected}
    }


def test_h15_flux_without_status_is_unknown() -> None:
    bare = obj(FLUX, labels={"capi.stackhpc.com/component": "c"})
    assert one(KUSTOMIZATION, bare) == {"addons": {"c": {"phase": "Unknown", "revision": 0}}}


# --- H16: kubeconfig Secret ---------------------------------------------------------------


def test_h16_kubeconfig_secret_names_itself() -> None:
    secret = obj("v1", name="demo-kubeconfig")
    assert one(SECRET, secret) == {"kubeconfigSecretName": "demo-kubeconfig"}
    assert one(SECRET, secret, "ADDED") == {"kubeconfigSecretName": "demo-kubeconfig"}
    assert one(SECRET, secret, "DELETED") == {}


def test_h16_with_oidc_only_the_user_kubeconfig_speaks_for_the_cluster() -> None:
    labels = {"cluster.x-k8s.io/cluster-name": "demo"}
    admin = obj("v1", name="demo-kubeconfig", labels=labels)
    user = obj("v1", name="demo-kubeconfig-user", labels=labels)
    assert owner(SECRET, admin, oidc=True) is None
    assert owner(SECRET, user, oidc=True) == "demo"
    assert owner(SECRET, obj("v1", name="demo-kubeconfig-user"), oidc=True) is None
    assert one(SECRET, user) == {"kubeconfigSecretName": "demo-kubeconfig-user"}
    # Without OIDC a leftover user kubeconfig (OIDC was on once) is not named.
    assert owner(SECRET, user) is None
    assert owner(SECRET, admin) == "demo"


# --- difference ---------------------------------------------------------------------------


def test_difference_keeps_only_what_differs() -> None:
    current = {"controlPlanePhase": "Ready", "kubernetesVersion": "1.31.2", "phase": "Ready"}
    wanted = {"controlPlanePhase": "Unhealthy", "kubernetesVersion": "1.31.2"}
    assert difference(current, wanted) == {"controlPlanePhase": "Unhealthy"}
    assert difference(current, {"controlPlanePhase": "Ready"}) == {}


def test_difference_treats_missing_phases_as_unknown() -> None:
    assert difference({}, {"networkingPhase": "Unknown", "controlPlanePhase": "Unknown"}) == {}
    assert difference({}, {"networkingPhase": "Pending"}) == {"networkingPhase": "Pending"}


def test_difference_keeps_a_created_time_written_in_another_spelling() -> None:
    # Upstream stored the instant as pydantic prints it; the Machine says it with a Z.
    upstream = {"nodes": {"m": {"created": "2026-05-01T10:00:00+00:00", "phase": "Ready"}}}
    same = {"nodes": {"m": {"created": "2026-05-01T10:00:00Z", "phase": "Ready"}}}
    assert difference(upstream, same) == {}
    later = {"nodes": {"m": {"created": "2026-05-01T10:00:01Z", "phase": "Ready"}}}
    assert difference(upstream, later) == {"nodes": {"m": {"created": "2026-05-01T10:00:01Z"}}}
    assert difference({"nodes": {"m": {"created": "soon"}}}, same) == same
    # Only timestamps: another key's strings still differ as text.
    assert difference({"size": "2026-05-01T10:00:00+00:00"}, {"size": "2026-05-01T10:00:00Z"}) == {
        "size": "2026-05-01T10:00:00Z"
    }


def test_difference_removes_only_what_is_there() -> None:
    assert difference({}, {"kubernetesVersion": None}) == {}
    assert difference({"kubernetesVersion": "1.2.3"}, {"kubernetesVersion": None}) == {
        "kubernetesVersion": None
    }
    assert difference({}, {"nodes": {"a": None}}) == {}
    assert difference({"nodes": {"b": {}}}, {"nodes": {"a": None}}) == {}
    assert difference({"nodes": {"a": {"phase": "Ready"}}}, {"nodes": {"a": None}}) == {
        "nodes": {"a": None}
    }


def test_difference_adds_new_entries_without_nulls() -> None:
    entry: Json = {"phase": "Ready", "size": None, "ips": []}
    assert difference({"nodes": {}}, {"nodes": {"a": entry}}) == {
        "nodes": {"a": {"phase": "Ready", "ips": []}}
    }
    assert difference({}, {"nodes": {"a": entry}}) == {
        "nodes": {"a": {"phase": "Ready", "ips": []}}
    }


def test_difference_within_an_entry_is_minimal() -> None:
    current = {"nodes": {"a": {"phase": "Ready", "size": "m1", "ips": ["1"], "ip": "1"}}}
    wanted: Json = {"nodes": {"a": {"phase": "Unhealthy", "size": "m1", "ips": [], "ip": None}}}
    assert difference(current, wanted) == {
        "nodes": {"a": {"phase": "Unhealthy", "ips": [], "ip": None}}
    }
    assert merge(current, difference(current, wanted)) == {
        "nodes": {"a": {"phase": "Unhealthy", "size": "m1", "ips": []}}
    }


# --- ClusterViews -------------------------------------------------------------------------


def cluster(uid: str, **status: Any) -> Json:
    return {"metadata": {"uid": uid}, "status": status}


def test_a_view_stands_for_its_ttl() -> None:
    views = ClusterViews(size=10, ttl=5, replay=30)
    assert views.get("ns/c", 0) is None
    views.read("ns/c", cluster("u1", networkingPhase="Pending"), 0)
    assert views.get("ns/c", 4.9) is not None
    assert views.get("ns/c", 5) is None


def test_sent_patches_fold_into_the_view_and_into_fresher_reads() -> None:
    views = ClusterViews(size=10, ttl=5, replay=30)
    view = views.read("ns/c", cluster("u1"), 0)
    views.record(view, {"nodes": {"a": {"phase": "Ready"}}}, 1)
    assert view.status == {"nodes": {"a": {"phase": "Ready"}}}
    # The patch has not landed yet when the Cluster is read again: the view still has it.
    again = views.read("ns/c", cluster("u1", networkingPhase="Pending"), 10)
    assert again.status == {"networkingPhase": "Pending", "nodes": {"a": {"phase": "Ready"}}}
    # Beyond the replay window the read is taken as it is.
    assert views.read("ns/c", cluster("u1"), 40).status == {}


def test_a_new_incarnation_starts_from_its_own_status() -> None:
    views = ClusterViews(size=10, ttl=5, replay=30)
    view = views.read("ns/c", cluster("u1"), 0)
    views.record(view, {"networkingPhase": "Provisioned"}, 0)
    fresh = views.read("ns/c", cluster("u2"), 1)
    assert (fresh.uid, fresh.status) == ("u2", {})


def test_views_are_bounded_and_can_be_forgotten() -> None:
    views = ClusterViews(size=2, ttl=5, replay=30)
    for name in "abc":
        views.read(f"ns/{name}", cluster(name), 0)
    assert len(views) == 2
    assert views.get("ns/a", 0) is None
    views.forget("ns/b")
    assert views.get("ns/b", 0) is None
    unbounded = ClusterViews(size=0, ttl=5, replay=30)
    unbounded.read("ns/a", cluster("a"), 0)
    assert len(unbounded) == 0
