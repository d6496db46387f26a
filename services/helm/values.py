"""The Helm values of a Cluster's ``openstack-cluster`` release, computed without I/O.

Everything here is a pure function of its arguments (inputs are never mutated, results never
share structure with them), so the handler can recompute the values on every event and let
``helm`` decide whether anything changed. The pipeline is upstream's (azimuth-capi-operator
``generate_helm_values_for_release``), in upstream's order; see ``compose``.

Compatibility decisions, kept on purpose although they surprise:

* **Lists concatenate.** ``mergeconcat`` appends a later list to an earlier one instead of
  replacing it. A ``ClusterTemplate`` that sets ``nodeGroups`` therefore gets the Cluster's node
  groups *appended*, and a template that sets ``controlPlane.kubeadmConfigSpec.files`` keeps
  them with the Zenith files added after. Upstream behaves this way (undocumented there);
  existing templates and default values are written against it, so changing it would change
  the release of every migrated cluster.
* **``None`` never overrides.** A layer cannot delete a key set by an earlier layer; to turn
  something off, set it to ``false`` or an empty value.
* **Flavor overrides are shell globs, not regexes.** Upstream's setting description says
  "regex", its code calls ``fnmatch``: ``bm.*`` matches ``bm.gpu`` but not ``bmgpu``. We keep
  the glob (case-sensitive, ``fnmatchcase``, which equals ``fnmatch`` on Linux) so existing
  configuration matches the same node groups.
* **Same values as upstream for the same Cluster.** Key paths and value types follow upstream's
  ``templates/cluster-values.yaml`` exactly, and the text of the OIDC RBAC Manifests addon is
  the text that template renders, blank lines included, so a cluster migrated from the kopf
  operator gets no new Helm revision (``tests/integration/lifecycle/test_dropin.py``): a
  different text would be an upgrade, with the addon re-installed and the Cluster Reconciling
  meanwhile, and a change in the machine templates would roll its nodes. The one deliberate
  difference in behaviour: ``PolicyRule.apiGroups`` accepts ``""`` (the core group), which
  upstream's settings reject.

Defaults of the Cluster spec come from ``shared.models.azimuth.ClusterSpec`` (the one source of
truth for the CRD too), so a spec missing ``autohealing`` or ``addons`` renders as upstream's.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from shared.errors import PermanentError
from shared.models.azimuth import AddonsSpec, ClusterSpec, NodeGroupSpec, NonEmptyStr

Json = dict[str, Any]

RBAC_API_GROUP = "rbac.authorization.k8s.io"
RBAC_API_VERSION = f"{RBAC_API_GROUP}/v1"
OIDC_RBAC_ADDON = "oidc-default-rbac"
OIDC_RBAC_NAMESPACE = "oidc-system"


# --------------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------------


def mergeconcat(*layers: Mapping[str, Any] | None) -> Json:
    """Deep-merge ``layers`` left to right into a new dict.

    Dicts merge recursively, lists concatenate, and any other right-hand value wins unless it
    is ``None``. ``None`` layers are skipped.
    """
    result: Json = {}
    for layer in layers:
        if layer is not None:
            result = _merge(result, layer)
    return result


def _merge(left: Any, right: Any) -> Any:
    """Merge ``right`` over ``left``; ``left`` is already our own copy, ``right`` is not."""
    if isinstance(left, dict) and isinstance(right, Mapping):
        merged = dict(left)
        for key, value in right.items():
            merged[key] = _merge(left[key], value) if key in left else copy.deepcopy(value)
        return merged
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return [*left, *copy.deepcopy(list(right))]
    return left if right is None else copy.deepcopy(right)


# --------------------------------------------------------------------------------------------
# Settings (upstream's capi_helm.* and identity.* keys; camelCase or snake_case accepted)
# --------------------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


class PolicyRule(_Section):
    """One rule of a Kubernetes (Cluster)Role; empty lists are left out of the manifest."""

    # Unlike upstream, "" is allowed here: it is the core API group (pods, secrets, ...).
    api_groups: list[str] = Field(default_factory=list)
    resources: list[NonEmptyStr] = Field(default_factory=list)
    resource_names: list[NonEmptyStr] = Field(default_factory=list)
    non_resource_urls: list[NonEmptyStr] = Field(default_factory=list, alias="nonResourceURLs")
    verbs: list[NonEmptyStr] = Field(default_factory=list)

    def manifest(self) -> Json:
        return self.model_dump(by_alias=True, exclude_defaults=True)


class DefaultUserNamespaceRole(_Section):
    """A ClusterRole bound to the cluster's OIDC groups in each of ``namespaces``."""

    name: NonEmptyStr = "oidc:default-users-namespaced"
    namespaces: list[NonEmptyStr] = Field(default_factory=lambda: ["default"])
    rules: list[PolicyRule] = Field(default_factory=list)


class DefaultUserClusterRole(_Section):
    """A ClusterRole bound to the cluster's OIDC groups cluster-wide."""

    name: NonEmptyStr = "oidc:default-users-cluster"
    rules: list[PolicyRule] = Field(default_factory=list)


def _admin_equivalent() -> DefaultUserClusterRole:
    # Upstream chart default since PR #453: OIDC users administer their own clusters.
    return DefaultUserClusterRole(
        rules=[
            PolicyRule(api_groups=["*"], resources=["*"], verbs=["*"]),
            PolicyRule(non_resource_urls=["*"], verbs=["*"]),
        ]
    )


class ValuesSettings(_Section):
    """What an operator can configure about the values; the lead nests this in HelmSettings."""

    default_values: Json = Field(
        default_factory=dict, description="Lowest-precedence values for every cluster"
    )
    flavor_specific_node_group_overrides: dict[str, Json] = Field(
        default_factory=dict,
        description="Glob on a node group's machineFlavor -> values merged into that group",
    )
    default_user_namespace_role: DefaultUserNamespaceRole | None = Field(
        None, description="Namespaced role for OIDC users of a cluster (none by default)"
    )
    default_user_cluster_role: DefaultUserClusterRole | None = Field(
        default_factory=_admin_equivalent,
        description="Cluster-wide role for OIDC users of a cluster (admin-equivalent default)",
    )


@dataclass(frozen=True)
class OidcInputs:
    """What the identity step learned: the client to log in with and the groups to trust."""

    issuer_url: str
    client_id: str
    root_group: str
    platform_users_group: str | None = None


# --------------------------------------------------------------------------------------------
# The Cluster layer (upstream templates/cluster-values.yaml)
# --------------------------------------------------------------------------------------------


def cluster_values(
    spec: Mapping[str, Any], *, oidc: OidcInputs | None, settings: ValuesSettings
) -> Json:
    """The layer derived from the Cluster ``spec`` (API camelCase) and the identity outputs."""
    parsed = _parse_spec(spec)
    health = {"enabled": parsed.autohealing}
    values: Json = {"cloudCredentialsSecretName": parsed.cloud_credentials_secret_name}
    if oidc is not None:
        values["oidc"] = {
            "issuerUrl": oidc.issuer_url,
            "clientId": oidc.client_id,
            "usernameClaim": "preferred_username",
        }
    values["controlPlane"] = {
        "machineFlavor": parsed.control_plane_machine_size,
        "healthCheck": dict(health),
    }
    values["nodeGroupDefaults"] = {"healthCheck": dict(health)}
    values["nodeGroups"] = [_node_group(group) for group in parsed.node_groups]
    values["addons"] = _addons(parsed.addons)
    rbac = _oidc_default_rbac(oidc, settings) if oidc is not None else None
    if rbac is not None:
        values["addons"]["custom"] = {OIDC_RBAC_ADDON: rbac}
    return values


def _parse_spec(spec: Mapping[str, Any]) -> ClusterSpec:
    try:
        return ClusterSpec.model_validate(spec)
    except ValidationError as exc:
        # The API server enforces the same schema, so this is a stale or hand-made object.
        raise PermanentError(f"invalid Cluster spec: {exc}", reason="InvalidClusterSpec") from exc


def _node_group(group: NodeGroupSpec) -> Json:
    values: Json = {
        "name": group.name,
        "machineFlavor": group.machine_size,
        "autoscale": group.autoscale,
    }
    if group.autoscale:
        values["machineCountMin"] = group.min_count
        values["machineCountMax"] = group.max_count
    else:
        values["machineCount"] = group.count
    return values


def _addons(addons: AddonsSpec) -> Json:
    ingress: Json = {"enabled": addons.ingress}
    if addons.ingress_controller_load_balancer_ip is not None:
        ip = str(addons.ingress_controller_load_balancer_ip)
        # Both controllers get the IP; the chart decides which one is installed.
        ingress["nginx"] = _release_values({"controller": {"service": {"loadBalancerIP": ip}}})
        ingress["traefik"] = _release_values({"service": {"spec": {"loadBalancerIP": ip}}})
    monitoring: Json = {"enabled": addons.monitoring}
    if addons.monitoring:
        monitoring["kubePrometheusStack"] = _release_values(
            {
                "alertmanager": {
                    "alertmanagerSpec": {
                        "storage": _pvc(addons.monitoring_alertmanager_volume_size)
                    }
                },
                "prometheus": {
                    "prometheusSpec": {
                        "storageSpec": _pvc(addons.monitoring_prometheus_volume_size)
                    }
                },
            }
        )
        monitoring["lokiStack"] = _release_values(
            {"loki": {"persistence": {"size": _gibibytes(addons.monitoring_loki_volume_size)}}}
        )
    return {"ingress": ingress, "monitoring": monitoring}


def _release_values(values: Json) -> Json:
    return {"release": {"values": values}}


def _pvc(size: int) -> Json:
    requests = {"storage": _gibibytes(size)}
    return {"volumeClaimTemplate": {"spec": {"resources": {"requests": requests}}}}


def _gibibytes(size: int) -> str:
    return f"{size}Gi"


# --------------------------------------------------------------------------------------------
# OIDC default RBAC (a Manifests addon installed in the tenant cluster)
#
# The manifests are text in the values, so their text must be upstream's to the byte: any other
# text is a different release, which the first run after a migration would upgrade (and the
# addon provider re-install), for objects that did not change. Upstream renders them with Jinja
# (``templates/cluster-values.yaml``, no ``trim_blocks``), which leaves each line holding only a
# ``{% if %}`` or ``{% for %}`` tag behind as a blank line of the block's indentation (two
# spaces, or none), prints each rule as pydantic's compact ``model_dump_json`` and each name as
# it is, unquoted. ``tests/unit/test_helm_values.py`` holds the texts upstream renders.
# --------------------------------------------------------------------------------------------


def _oidc_default_rbac(oidc: OidcInputs, settings: ValuesSettings) -> Json | None:
    manifests: dict[str, str] = {}
    namespaced = settings.default_user_namespace_role
    if namespaced is not None:
        manifests["oidc-default-namespace-role.yaml"] = _role(namespaced.name, namespaced.rules)
        if namespaced.namespaces:
            manifests["oidc-default-role-binding.yaml"] = "".join(
                "\n---\n"
                + _binding(
                    "RoleBinding",
                    f"  name: {namespaced.name}-{namespace}\n  namespace: {namespace}\n",
                    namespaced.name,
                    oidc,
                )
                for namespace in namespaced.namespaces
            )
    clusterwide = settings.default_user_cluster_role
    if clusterwide is not None:
        manifests["oidc-default-cluster-role.yaml"] = _role(clusterwide.name, clusterwide.rules)
        manifests["oidc-default-cluster-role-binding.yaml"] = _binding(
            "ClusterRoleBinding", f"  name: {clusterwide.name}\n", clusterwide.name, oidc
        )
    if not manifests:
        return None
    return {
        "kind": "Manifests",
        "spec": {"namespace": OIDC_RBAC_NAMESPACE, "manifests": manifests},
    }


def _role(name: str, rules: list[PolicyRule]) -> str:
    text = f"apiVersion: {RBAC_API_VERSION}\nkind: ClusterRole\nmetadata:\n  name: {name}\n"
    if rules:
        text += "\nrules:\n  \n" + "".join(f"  - {_rule(rule)}\n  \n" for rule in rules)
    return text


def _rule(rule: PolicyRule) -> str:
    return rule.model_dump_json(by_alias=True, exclude_defaults=True)


def _binding(kind: str, metadata: str, role: str, oidc: OidcInputs) -> str:
    """A binding of ``role`` to the realm's platform users (everyone in the tenancy), if the
    Realm names them, and to the cluster's own group."""
    realm = oidc.platform_users_group
    subjects = "subjects:\n  \n"
    if realm:
        subjects += _group(realm) + "  \n"
    subjects += _group(oidc.root_group)
    role_ref = f"roleRef:\n  apiGroup: {RBAC_API_GROUP}\n  kind: ClusterRole\n  name: {role}\n"
    return (
        f"apiVersion: {RBAC_API_VERSION}\nkind: {kind}\nmetadata:\n{metadata}{subjects}{role_ref}"
    )


def _group(name: str) -> str:
    return f"  - apiGroup: {RBAC_API_GROUP}\n    kind: Group\n    name: oidc:{name}\n"


# --------------------------------------------------------------------------------------------
# Later stages of the pipeline
# --------------------------------------------------------------------------------------------


def apply_flavor_overrides(values: Mapping[str, Any], overrides: Mapping[str, Json]) -> Json:
    """Merge each override into every node group whose ``machineFlavor`` matches its glob.

    Patterns are tried in order and every match is merged (mergeconcat, so lists append).
    """
    result = copy.deepcopy(dict(values))
    groups = result.get("nodeGroups")
    if not overrides or not isinstance(groups, list):
        return result
    result["nodeGroups"] = [_override_group(group, overrides) for group in groups]
    return result


def _override_group(group: Any, overrides: Mapping[str, Json]) -> Any:
    flavor = group.get("machineFlavor") if isinstance(group, dict) else None
    if not isinstance(flavor, str):
        return group
    for pattern, override in overrides.items():
        if fnmatch.fnmatchcase(flavor, pattern):
            group = mergeconcat(group, override)
    return group


def remap_lease_flavors(values: Mapping[str, Any], size_name_map: Mapping[str, str]) -> Json:
    """Replace the control-plane and node-group flavors by the Lease's reserved ones.

    Flavors missing from the map are kept: a lease need not cover every size.
    """
    result = copy.deepcopy(dict(values))
    machines = [result.get("controlPlane"), *(result.get("nodeGroups") or [])]
    for machine in machines:
        if isinstance(machine, dict) and machine.get("machineFlavor") in size_name_map:
            machine["machineFlavor"] = size_name_map[machine["machineFlavor"]]
    return result


def compose(
    *,
    defaults: Mapping[str, Any],
    template_values: Mapping[str, Any],
    cluster_layer: Mapping[str, Any],
    overrides: Mapping[str, Json],
    size_name_map: Mapping[str, str] | None,
    zenith_layer: Mapping[str, Any] | None,
) -> Json:
    """The release values, in upstream's order.

    1. ``mergeconcat(defaults, template values, cluster layer)``;
    2. flavor overrides, matched against the flavors the user asked for;
    3. the Lease remap (``None`` when the Cluster has no Lease), so an override keyed on
       ``bm.*`` still applies once the flavor becomes a reservation's;
    4. the Zenith layer last; its ``kubeadmConfigSpec.files`` append to any the template set.
    """
    values = mergeconcat(defaults, template_values, cluster_layer)
    values = apply_flavor_overrides(values, overrides)
    if size_name_map is not None:
        values = remap_lease_flavors(values, size_name_map)
    return mergeconcat(values, zenith_layer)
