"""The Helm values pipeline, rule by rule, including upstream's own test example.

Upstream (azimuth-capi-operator ``tests/test_operator.py``) pins two cases: a plain cluster
and a ``bm.*`` flavor override that adds kubelet args and a taint to the matching node group
only. The rest pins what a migrated cluster must see unchanged: merge semantics (lists
concatenate, ``None`` never overrides), glob matching, the lease remap and the OIDC RBAC addon.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from services.helm.values import (
    DefaultUserClusterRole,
    DefaultUserNamespaceRole,
    OidcInputs,
    PolicyRule,
    ValuesSettings,
    apply_flavor_overrides,
    cluster_values,
    compose,
    mergeconcat,
    remap_lease_flavors,
)
from shared.errors import PermanentError

Json = dict[str, Any]

OIDC = OidcInputs(
    issuer_url="https://idp.test/realms/az-tenant",
    client_id="kube-demo",
    root_group="kube-demo",
    platform_users_group="platform-users",
)
NO_ROLES = ValuesSettings(default_user_cluster_role=None)

BM_OVERRIDE: Json = {
    "kubeadmConfigSpec": {
        "joinConfiguration": {
            "nodeRegistration": {
                "kubeletExtraArgs": {"cpu-manager-policy": "static"},
                "taints": [
                    {"effect": "NoSchedule", "key": "feature.node.kubernetes.io/gpu-dedicated"}
                ],
            }
        }
    }
}


def spec(**changes: Any) -> Json:
    base: Json = {
        "label": "test",
        "templateName": "template1.31",
        "cloudCredentialsSecretName": "secret1",
        "controlPlaneMachineSize": "vm.small",
        "nodeGroups": [
            {"name": "vms", "machineSize": "vm.small", "count": 2},
            {"name": "gpus", "machineSize": "bm.gpus", "count": 2},
        ],
    }
    return base | changes


def release(cluster_spec: Json, settings: ValuesSettings, **extra: Any) -> Json:
    """The values the way the helm handler composes them (no lease, no Zenith)."""
    arguments: Json = {"size_name_map": None, "zenith_layer": None} | extra
    return compose(
        defaults=settings.default_values,
        template_values={"kubernetesVersion": "v1.31.0", "machineImageId": "12456789"},
        cluster_layer=cluster_values(cluster_spec, oidc=None, settings=settings),
        overrides=settings.flavor_specific_node_group_overrides,
        **arguments,
    )


# --------------------------------------------------------------------------------------------
# mergeconcat
# --------------------------------------------------------------------------------------------


def test_mergeconcat_merges_dicts_recursively_and_right_scalars_win() -> None:
    left = {"a": {"b": 1, "c": {"d": 1}}, "e": "x"}
    right = {"a": {"c": {"d": 2, "f": 3}}, "e": "y", "g": True}
    assert mergeconcat(left, right) == {"a": {"b": 1, "c": {"d": 2, "f": 3}}, "e": "y", "g": True}


def test_mergeconcat_concatenates_lists() -> None:
    assert mergeconcat({"l": [1, 2]}, {"l": [3]}, {"l": [4]}) == {"l": [1, 2, 3, 4]}
    assert mergeconcat({"l": (1,)}, {"l": [2]}) == {"l": [1, 2]}


def test_mergeconcat_none_never_overrides_but_a_new_none_key_is_kept() -> None:
    assert mergeconcat({"a": 1, "b": {"c": 1}}, {"a": None, "b": None}) == {"a": 1, "b": {"c": 1}}
    assert mergeconcat({}, {"a": None}) == {"a": None}


def test_mergeconcat_type_mismatch_right_wins() -> None:
    assert mergeconcat({"a": {"b": 1}}, {"a": [1]}) == {"a": [1]}
    assert mergeconcat({"a": [1]}, {"a": "s"}) == {"a": "s"}
    assert mergeconcat({"a": 1}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert mergeconcat({"a": True}, {"a": False}) == {"a": False}


def test_mergeconcat_edge_layers() -> None:
    assert mergeconcat() == {}
    assert mergeconcat(None, {"a": 1}, None) == {"a": 1}


def test_mergeconcat_is_pure_and_shares_nothing_with_its_inputs() -> None:
    left: Json = {"a": {"l": [1]}, "d": {"x": 1}}
    right: Json = {"a": {"l": [2]}, "n": {"deep": [1]}}
    before = copy.deepcopy((left, right))
    result = mergeconcat(left, right)
    assert (left, right) == before
    result["a"]["l"].append(99)
    result["d"]["x"] = 2
    result["n"]["deep"].append(2)
    assert (left, right) == before


# --------------------------------------------------------------------------------------------
# Settings models
# --------------------------------------------------------------------------------------------


def test_settings_defaults_give_oidc_users_an_admin_equivalent_cluster_role() -> None:
    settings = ValuesSettings()
    assert settings.default_values == {}
    assert settings.flavor_specific_node_group_overrides == {}
    assert settings.default_user_namespace_role is None
    role = settings.default_user_cluster_role
    assert role is not None
    assert role.name == "oidc:default-users-cluster"
    assert [rule.manifest() for rule in role.rules] == [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"nonResourceURLs": ["*"], "verbs": ["*"]},
    ]
    assert DefaultUserNamespaceRole().name == "oidc:default-users-namespaced"
    assert DefaultUserNamespaceRole().namespaces == ["default"]


def test_settings_accept_upstream_camel_and_snake_case_keys() -> None:
    settings = ValuesSettings.model_validate(
        {
            "defaultValues": {"a": 1},
            "flavor_specific_node_group_overrides": {"bm.*": {"b": 2}},
            "defaultUserNamespaceRole": {
                "namespaces": ["default", "apps"],
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
            },
            "default_user_cluster_role": None,
        }
    )
    assert settings.default_values == {"a": 1}
    assert settings.flavor_specific_node_group_overrides == {"bm.*": {"b": 2}}
    assert settings.default_user_cluster_role is None
    namespaced = settings.default_user_namespace_role
    assert namespaced is not None
    assert namespaced.rules == [PolicyRule(api_groups=[""], resources=["pods"], verbs=["get"])]
    assert PolicyRule.model_validate({"non_resource_urls": ["/healthz"]}).manifest() == {
        "nonResourceURLs": ["/healthz"]
    }


def test_settings_reject_unknown_keys_and_are_frozen() -> None:
    with pytest.raises(ValidationError):
        ValuesSettings.model_validate({"defaultValue": {}})
    with pytest.raises(ValidationError):
        PolicyRule.model_validate({"verb": ["get"]})
    with pytest.raises(ValidationError):
        ValuesSettings().default_values = {}  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# The cluster layer and upstream's example
# --------------------------------------------------------------------------------------------


UPSTREAM_EXPECTED: Json = {
    "addons": {"ingress": {"enabled": False}, "monitoring": {"enabled": False}},
    "cloudCredentialsSecretName": "secret1",
    "controlPlane": {"healthCheck": {"enabled": True}, "machineFlavor": "vm.small"},
    "extra_things": {"enabled": True},
    "kubernetesVersion": "v1.31.0",
    "machineImageId": "12456789",
    "nodeGroupDefaults": {"healthCheck": {"enabled": True}},
    "nodeGroups": [
        {"autoscale": False, "machineCount": 2, "machineFlavor": "vm.small", "name": "vms"},
        {"autoscale": False, "machineCount": 2, "machineFlavor": "bm.gpus", "name": "gpus"},
    ],
}


def test_upstream_example_plain() -> None:
    # Upstream's expectation also has addons.kubernetesDashboard, retired in upstream PR #547.
    settings = ValuesSettings(default_values={"extra_things": {"enabled": True}})
    assert release(spec(), settings) == UPSTREAM_EXPECTED


def test_upstream_example_bm_override_touches_the_matching_group_only() -> None:
    settings = ValuesSettings(
        default_values={"extra_things": {"enabled": True}},
        flavor_specific_node_group_overrides={"bm.*": BM_OVERRIDE},
    )
    expected = copy.deepcopy(UPSTREAM_EXPECTED)
    expected["nodeGroups"][1] |= copy.deepcopy(BM_OVERRIDE)
    assert release(spec(), settings) == expected


def test_upstream_example_ingress_ip_and_monitoring_volumes() -> None:
    addons = {
        "ingress": True,
        "ingressControllerLoadBalancerIp": "172.24.4.10",
        "monitoring": True,
        "monitoringAlertmanagerVolumeSize": 5,
        "monitoringPrometheusVolumeSize": 50,
        "monitoringLokiVolumeSize": 20,
    }
    values = cluster_values(spec(addons=addons), oidc=None, settings=ValuesSettings())
    assert values["addons"] == {
        "ingress": {
            "enabled": True,
            "nginx": {
                "release": {
                    "values": {"controller": {"service": {"loadBalancerIP": "172.24.4.10"}}}
                }
            },
            "traefik": {
                "release": {"values": {"service": {"spec": {"loadBalancerIP": "172.24.4.10"}}}}
            },
        },
        "monitoring": {
            "enabled": True,
            "kubePrometheusStack": {
                "release": {
                    "values": {
                        "alertmanager": {
                            "alertmanagerSpec": {
                                "storage": {
                                    "volumeClaimTemplate": {
                                        "spec": {"resources": {"requests": {"storage": "5Gi"}}}
                                    }
                                }
                            }
                        },
                        "prometheus": {
                            "prometheusSpec": {
                                "storageSpec": {
                                    "volumeClaimTemplate": {
                                        "spec": {"resources": {"requests": {"storage": "50Gi"}}}
                                    }
                                }
                            }
                        },
                    }
                }
            },
            "lokiStack": {"release": {"values": {"loki": {"persistence": {"size": "20Gi"}}}}},
        },
    }


def test_spec_defaults_apply_when_keys_are_missing() -> None:
    minimal = {
        "label": "x",
        "templateName": "t",
        "cloudCredentialsSecretName": "creds",
        "controlPlaneMachineSize": "small",
    }
    assert cluster_values(minimal, oidc=None, settings=ValuesSettings()) == {
        "cloudCredentialsSecretName": "creds",
        "controlPlane": {"machineFlavor": "small", "healthCheck": {"enabled": True}},
        "nodeGroupDefaults": {"healthCheck": {"enabled": True}},
        "nodeGroups": [],
        "addons": {"ingress": {"enabled": False}, "monitoring": {"enabled": False}},
    }


def test_monitoring_volume_sizes_default_to_10_gibibytes() -> None:
    values = cluster_values(spec(addons={"monitoring": True}), oidc=None, settings=NO_ROLES)
    stack = values["addons"]["monitoring"]["kubePrometheusStack"]["release"]["values"]
    storage = stack["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]
    assert storage["spec"]["resources"]["requests"]["storage"] == "10Gi"
    loki = values["addons"]["monitoring"]["lokiStack"]["release"]["values"]
    assert loki["loki"]["persistence"]["size"] == "10Gi"


def test_autohealing_off_disables_both_health_checks() -> None:
    values = cluster_values(spec(autohealing=False), oidc=None, settings=NO_ROLES)
    assert values["controlPlane"]["healthCheck"] == {"enabled": False}
    assert values["nodeGroupDefaults"]["healthCheck"] == {"enabled": False}


def test_autoscaling_group_gets_min_and_max_instead_of_a_count() -> None:
    group = {"name": "auto", "machineSize": "m", "autoscale": True, "minCount": 1, "maxCount": 4}
    values = cluster_values(spec(nodeGroups=[group]), oidc=None, settings=NO_ROLES)
    assert values["nodeGroups"] == [
        {
            "name": "auto",
            "machineFlavor": "m",
            "autoscale": True,
            "machineCountMin": 1,
            "machineCountMax": 4,
        }
    ]


def test_an_invalid_spec_is_a_permanent_error() -> None:
    group = {"name": "auto", "machineSize": "m", "autoscale": True}
    with pytest.raises(PermanentError) as caught:
        cluster_values(spec(nodeGroups=[group]), oidc=None, settings=NO_ROLES)
    assert caught.value.reason == "InvalidClusterSpec"


# --------------------------------------------------------------------------------------------
# OIDC
# --------------------------------------------------------------------------------------------


def rbac_manifests(values: Json) -> dict[str, list[Json]]:
    addon = values["addons"]["custom"]["oidc-default-rbac"]
    assert addon["kind"] == "Manifests"
    assert addon["spec"]["namespace"] == "oidc-system"
    return {
        name: list(yaml.safe_load_all(text)) for name, text in addon["spec"]["manifests"].items()
    }


SUBJECTS = [
    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "oidc:platform-users"},
    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "oidc:kube-demo"},
]


def test_oidc_values_and_the_default_admin_cluster_role() -> None:
    values = cluster_values(spec(), oidc=OIDC, settings=ValuesSettings())
    assert values["oidc"] == {
        "issuerUrl": "https://idp.test/realms/az-tenant",
        "clientId": "kube-demo",
        "usernameClaim": "preferred_username",
    }
    assert rbac_manifests(values) == {
        "oidc-default-cluster-role.yaml": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "oidc:default-users-cluster"},
                "rules": [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                    {"nonResourceURLs": ["*"], "verbs": ["*"]},
                ],
            }
        ],
        "oidc-default-cluster-role-binding.yaml": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "oidc:default-users-cluster"},
                "subjects": SUBJECTS,
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "oidc:default-users-cluster",
                },
            }
        ],
    }


def test_namespace_role_binds_in_every_namespace() -> None:
    settings = ValuesSettings(
        default_user_namespace_role=DefaultUserNamespaceRole(
            namespaces=["default", "apps"],
            rules=[PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
        default_user_cluster_role=None,
    )
    manifests = rbac_manifests(cluster_values(spec(), oidc=OIDC, settings=settings))
    assert set(manifests) == {"oidc-default-namespace-role.yaml", "oidc-default-role-binding.yaml"}
    [role] = manifests["oidc-default-namespace-role.yaml"]
    assert role["kind"] == "ClusterRole"
    assert role["metadata"] == {"name": "oidc:default-users-namespaced"}
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    bindings = manifests["oidc-default-role-binding.yaml"]
    assert [b["metadata"] for b in bindings] == [
        {"name": "oidc:default-users-namespaced-default", "namespace": "default"},
        {"name": "oidc:default-users-namespaced-apps", "namespace": "apps"},
    ]
    assert all(b["kind"] == "RoleBinding" for b in bindings)
    assert all(b["subjects"] == SUBJECTS for b in bindings)
    assert all(b["roleRef"]["name"] == "oidc:default-users-namespaced" for b in bindings)


def test_both_roles_and_a_role_without_rules_or_namespaces() -> None:
    settings = ValuesSettings(
        default_user_namespace_role=DefaultUserNamespaceRole(namespaces=[]),
        default_user_cluster_role=DefaultUserClusterRole(name="custom"),
    )
    manifests = rbac_manifests(cluster_values(spec(), oidc=OIDC, settings=settings))
    assert set(manifests) == {
        "oidc-default-namespace-role.yaml",
        "oidc-default-cluster-role.yaml",
        "oidc-default-cluster-role-binding.yaml",
    }
    assert "rules" not in manifests["oidc-default-namespace-role.yaml"][0]
    assert manifests["oidc-default-cluster-role.yaml"][0]["metadata"] == {"name": "custom"}


def test_without_a_platform_users_group_only_the_cluster_group_is_bound() -> None:
    oidc = OidcInputs(issuer_url="https://idp", client_id="c", root_group="kube-demo")
    manifests = rbac_manifests(cluster_values(spec(), oidc=oidc, settings=ValuesSettings()))
    [binding] = manifests["oidc-default-cluster-role-binding.yaml"]
    assert binding["subjects"] == SUBJECTS[1:]


def test_no_rbac_addon_without_roles_or_without_oidc() -> None:
    with_oidc = cluster_values(spec(), oidc=OIDC, settings=NO_ROLES)
    assert "oidc" in with_oidc
    assert "custom" not in with_oidc["addons"]
    without = cluster_values(spec(), oidc=None, settings=ValuesSettings())
    assert "oidc" not in without
    assert "custom" not in without["addons"]


def test_rbac_yaml_has_no_anchors() -> None:
    settings = ValuesSettings(default_user_namespace_role=DefaultUserNamespaceRole())
    addon = cluster_values(spec(), oidc=OIDC, settings=settings)["addons"]["custom"]
    for text in addon["oidc-default-rbac"]["spec"]["manifests"].values():
        assert "&id" not in text
        assert "*id" not in text


def manifest_texts(values: Json) -> dict[str, str]:
    return dict(values["addons"]["custom"]["oidc-default-rbac"]["spec"]["manifests"])


# What upstream's ``templates/cluster-values.yaml`` renders (Jinja, no ``trim_blocks``) for the
# same settings and groups: a line that held only a tag stays as a blank one. Any other text is
# another release, so a Cluster taken over from upstream would be upgraded for nothing.
UPSTREAM_CLUSTER_ROLE = (
    "apiVersion: rbac.authorization.k8s.io/v1\n"
    "kind: ClusterRole\n"
    "metadata:\n"
    "  name: oidc:default-users-cluster\n"
    "\n"
    "rules:\n"
    "  \n"
    '  - {"apiGroups":["*"],"resources":["*"],"verbs":["*"]}\n'
    "  \n"
    '  - {"nonResourceURLs":["*"],"verbs":["*"]}\n'
    "  \n"
)
UPSTREAM_CLUSTER_ROLE_BINDING = (
    "apiVersion: rbac.authorization.k8s.io/v1\n"
    "kind: ClusterRoleBinding\n"
    "metadata:\n"
    "  name: oidc:default-users-cluster\n"
    "subjects:\n"
    "  \n"
    "  - apiGroup: rbac.authorization.k8s.io\n"
    "    kind: Group\n"
    "    name: oidc:platform-users\n"
    "  \n"
    "  - apiGroup: rbac.authorization.k8s.io\n"
    "    kind: Group\n"
    "    name: oidc:kube-demo\n"
    "roleRef:\n"
    "  apiGroup: rbac.authorization.k8s.io\n"
    "  kind: ClusterRole\n"
    "  name: oidc:default-users-cluster\n"
)


def upstream_role_binding(namespace: str) -> str:
    return (
        "\n"
        "---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\n"
        "kind: RoleBinding\n"
        "metadata:\n"
        f"  name: oidc:default-users-namespaced-{namespace}\n"
        f"  namespace: {namespace}\n"
        "subjects:\n"
        "  \n"
        "  - apiGroup: rbac.authorization.k8s.io\n"
        "    kind: Group\n"
        "    name: oidc:kube-demo\n"
        "roleRef:\n"
        "  apiGroup: rbac.authorization.k8s.io\n"
        "  kind: ClusterRole\n"
        "  name: oidc:default-users-namespaced\n"
    )


def test_rbac_texts_are_upstreams_byte_for_byte() -> None:
    values = cluster_values(spec(), oidc=OIDC, settings=ValuesSettings())
    assert manifest_texts(values) == {
        "oidc-default-cluster-role.yaml": UPSTREAM_CLUSTER_ROLE,
        "oidc-default-cluster-role-binding.yaml": UPSTREAM_CLUSTER_ROLE_BINDING,
    }


def test_namespaced_rbac_texts_are_upstreams_byte_for_byte() -> None:
    settings = ValuesSettings(
        default_user_namespace_role=DefaultUserNamespaceRole(
            namespaces=["default", "apps"],
            rules=[PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
        default_user_cluster_role=DefaultUserClusterRole(name="custom"),
    )
    oidc = OidcInputs(issuer_url="https://idp", client_id="c", root_group="kube-demo")
    texts = manifest_texts(cluster_values(spec(), oidc=oidc, settings=settings))
    assert texts == {
        "oidc-default-namespace-role.yaml": (
            "apiVersion: rbac.authorization.k8s.io/v1\n"
            "kind: ClusterRole\n"
            "metadata:\n"
            "  name: oidc:default-users-namespaced\n"
            "\n"
            "rules:\n"
            "  \n"
            '  - {"apiGroups":[""],"resources":["pods"],"verbs":["get","list"]}\n'
            "  \n"
        ),
        "oidc-default-role-binding.yaml": upstream_role_binding("default")
        + upstream_role_binding("apps"),
        "oidc-default-cluster-role.yaml": (
            "apiVersion: rbac.authorization.k8s.io/v1\n"
            "kind: ClusterRole\n"
            "metadata:\n"
            "  name: custom\n"
        ),
        "oidc-default-cluster-role-binding.yaml": (
            "apiVersion: rbac.authorization.k8s.io/v1\n"
            "kind: ClusterRoleBinding\n"
            "metadata:\n"
            "  name: custom\n"
            "subjects:\n"
            "  \n"
            "  - apiGroup: rbac.authorization.k8s.io\n"
            "    kind: Group\n"
            "    name: oidc:kube-demo\n"
            "roleRef:\n"
            "  apiGroup: rbac.authorization.k8s.io\n"
            "  kind: ClusterRole\n"
            "  name: custom\n"
        ),
    }


# --------------------------------------------------------------------------------------------
# Flavor overrides, lease remap, composition
# --------------------------------------------------------------------------------------------


def test_flavor_overrides_are_globs_not_regexes() -> None:
    values = {
        "nodeGroups": [
            {"name": "a", "machineFlavor": "bm.gpu"},
            {"name": "b", "machineFlavor": "bmxgpu"},  # a regex "bm.*" would match this
            {"name": "c", "machineFlavor": "BM.gpu"},
            {"name": "d", "machineFlavor": "vm.gpu.large"},
            {"name": "e"},
        ]
    }
    result = apply_flavor_overrides(values, {"bm.*": {"x": 1}, "*.gpu.*": {"y": 2}})
    assert [set(group) - {"name", "machineFlavor"} for group in result["nodeGroups"]] == [
        {"x"},
        set(),
        set(),
        {"y"},
        set(),
    ]


def test_every_matching_override_merges_and_lists_append() -> None:
    existing_taint = {"key": "a", "effect": "NoSchedule"}
    values = {
        "nodeGroups": [
            {
                "name": "g",
                "machineFlavor": "bm.gpus",
                "kubeadmConfigSpec": {
                    "joinConfiguration": {"nodeRegistration": {"taints": [existing_taint]}}
                },
            }
        ]
    }
    before = copy.deepcopy(values)
    result = apply_flavor_overrides(values, {"bm.*": BM_OVERRIDE, "*gpus": {"extra": True}})
    assert values == before
    [group] = result["nodeGroups"]
    registration = group["kubeadmConfigSpec"]["joinConfiguration"]["nodeRegistration"]
    assert registration["taints"] == [
        existing_taint,
        {"effect": "NoSchedule", "key": "feature.node.kubernetes.io/gpu-dedicated"},
    ]
    assert registration["kubeletExtraArgs"] == {"cpu-manager-policy": "static"}
    assert group["extra"] is True


def test_flavor_overrides_without_node_groups_or_overrides() -> None:
    assert apply_flavor_overrides({"a": 1}, {"*": {"x": 1}}) == {"a": 1}
    values = {"nodeGroups": [{"machineFlavor": "f"}]}
    assert apply_flavor_overrides(values, {}) == values


def test_lease_remap_maps_known_flavors_and_keeps_the_rest() -> None:
    values = {
        "controlPlane": {"machineFlavor": "vm.small", "machineCount": 3},
        "nodeGroups": [
            {"name": "a", "machineFlavor": "vm.small"},
            {"name": "b", "machineFlavor": "vm.large"},
            {"name": "c"},
        ],
    }
    before = copy.deepcopy(values)
    result = remap_lease_flavors(values, {"vm.small": "reservation-1", "unused": "x"})
    assert values == before
    assert result == {
        "controlPlane": {"machineFlavor": "reservation-1", "machineCount": 3},
        "nodeGroups": [
            {"name": "a", "machineFlavor": "reservation-1"},
            {"name": "b", "machineFlavor": "vm.large"},
            {"name": "c"},
        ],
    }
    assert remap_lease_flavors({}, {"a": "b"}) == {}


def test_overrides_match_the_requested_flavor_before_the_lease_remap() -> None:
    settings = ValuesSettings(flavor_specific_node_group_overrides={"bm.*": {"tagged": True}})
    values = release(spec(), settings, size_name_map={"bm.gpus": "lease-abc", "vm.small": "l-s"})
    assert values["controlPlane"]["machineFlavor"] == "l-s"
    vms, gpus = values["nodeGroups"]
    assert vms == {"name": "vms", "machineFlavor": "l-s", "autoscale": False, "machineCount": 2}
    assert gpus["machineFlavor"] == "lease-abc"
    assert gpus["tagged"] is True


def test_zenith_layer_comes_last_and_its_files_append_to_the_templates() -> None:
    template_file = {"path": "/etc/template", "content": "x"}
    zenith_file = {"path": "/etc/zenith/client.yaml", "content": "y"}
    values = compose(
        defaults={"apiServer": {"enableLoadBalancer": True, "port": 6443}},
        template_values={"controlPlane": {"kubeadmConfigSpec": {"files": [template_file]}}},
        cluster_layer=cluster_values(spec(), oidc=None, settings=NO_ROLES),
        overrides={},
        size_name_map=None,
        zenith_layer={
            "apiServer": {"enableLoadBalancer": False},
            "controlPlane": {"kubeadmConfigSpec": {"files": [zenith_file]}},
        },
    )
    assert values["apiServer"] == {"enableLoadBalancer": False, "port": 6443}
    assert values["controlPlane"]["kubeadmConfigSpec"]["files"] == [template_file, zenith_file]
    assert values["controlPlane"]["machineFlavor"] == "vm.small"


def test_template_node_groups_are_concatenated_not_replaced() -> None:
    # The documented upstream quirk: a template's node groups come first, the Cluster's follow.
    values = compose(
        defaults={},
        template_values={"nodeGroups": [{"name": "from-template", "machineCount": 1}]},
        cluster_layer=cluster_values(spec(), oidc=None, settings=NO_ROLES),
        overrides={},
        size_name_map=None,
        zenith_layer=None,
    )
    assert [group["name"] for group in values["nodeGroups"]] == ["from-template", "vms", "gpus"]


def test_compose_is_pure() -> None:
    settings = ValuesSettings(
        default_values={"nodeGroups": [{"name": "d", "machineFlavor": "bm.x"}]},
        flavor_specific_node_group_overrides={"bm.*": BM_OVERRIDE},
    )
    before = copy.deepcopy(settings.model_dump())
    release(spec(), settings, size_name_map={"bm.x": "y"}, zenith_layer={"a": [1]})
    assert settings.model_dump() == before
