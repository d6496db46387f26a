"""The bootstrap provider's pure rules: pool names, the day-2 gate, the Agent's binding patch,
the ISO URL rewrite and status comparison."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.baremetal.assisted_bootstrap import logic
from shared.errors import PermanentError

Json = dict[str, Any]


def machine(**labels: str) -> Json:
    return {"metadata": {"name": "m", "namespace": "ns", "labels": labels}, "spec": {}}


def test_pools_are_named_after_the_cluster_and_the_control_plane_or_deployment() -> None:
    cp = machine(**{logic.CONTROL_PLANE_LABEL: ""})
    assert logic.infra_env_name("c1", cp) == "c1-control-plane"
    assert logic.infra_env_name("c1", machine(**{logic.DEPLOYMENT_LABEL: "md-0"})) == "c1-md-0"
    with pytest.raises(PermanentError) as failed:
        logic.infra_env_name("c1", machine())
    assert failed.value.reason == logic.INFRA_ENV_FAILED


@pytest.mark.parametrize(
    ("state", "open_"),
    [
        ("", True),
        ("insufficient", True),
        ("pending-for-input", True),
        ("adding-hosts", True),
        ("ready", False),
        ("installing", False),
        ("installed", False),
        ("error", False),
    ],
)
def test_the_day2_gate(state: str, open_: bool) -> None:
    assert logic.day2_open(state) is open_


def test_an_aci_without_status_reads_as_the_empty_state_and_a_malformed_one_fails() -> None:
    assert logic.aci_state({"metadata": {"name": "a"}}) == ""
    assert logic.aci_state({"status": {"debugInfo": {"state": "installing"}}}) == "installing"
    broken = {"metadata": {"name": "a", "namespace": "ns"}, "status": {"debugInfo": ["x"]}}
    with pytest.raises(PermanentError):
        logic.aci_state(broken)
    assert logic.lenient_aci_state(broken) is None


def test_hosts_match_agents_by_mac_whatever_the_case() -> None:
    hosts = [
        {"metadata": {"name": "h0"}, "spec": {"bootMACAddress": "AA:BB:CC:DD:EE:00"}},
        {"metadata": {"name": "h1"}, "spec": {}},
    ]
    agent = {"status": {"inventory": {"interfaces": [{"macAddress": "aa:bb:cc:dd:ee:00"}]}}}
    found = logic.host_for(logic.macs(agent), hosts)
    assert found is not None
    assert found["metadata"]["name"] == "h0"
    assert logic.host_for(["11:22:33:44:55:66"], hosts) is None
    assert logic.macs({"status": {}}) == []


def agent(**spec: Any) -> Json:
    return {"metadata": {"name": "a", "namespace": "ns"}, "spec": spec}


def test_the_binding_patch_is_one_and_none_once_bound() -> None:
    patch = logic.agent_patch(agent(approved=False), role="master", host_uid="u1", cluster="c1")
    assert patch is not None
    assert patch["metadata"] == {"labels": {logic.CLUSTER_NAME_LABEL: "c1"}}
    assert patch["spec"]["role"] == "master"
    assert patch["spec"]["approved"] is True
    assert patch["spec"]["nodeLabels"] == {"metal3.io/uuid": "u1"}
    ignition = json.loads(patch["spec"]["ignitionConfigOverrides"])
    assert ignition["ignition"]["version"] == "3.1.0"
    (sentinel,) = ignition["storage"]["files"]
    assert sentinel["path"] == "/run/cluster-api/bootstrap-success.complete"
    assert (sentinel["mode"], sentinel["overwrite"], sentinel["user"]) == (
        420,
        True,
        {"name": "root"},
    )

    bound = agent(**patch["spec"])
    bound["metadata"]["labels"] = {logic.CLUSTER_NAME_LABEL: "c1"}
    assert logic.bound(bound)
    assert logic.agent_patch(bound, role="master", host_uid="u1", cluster="c1") is None


def test_another_valid_override_is_replaced_and_the_other_role_refused() -> None:
    other = json.dumps({"ignition": {"version": "3.1.0"}})
    patch = logic.agent_patch(
        agent(ignitionConfigOverrides=other), role="worker", host_uid="u", cluster="c1"
    )
    assert patch is not None
    assert patch["spec"]["ignitionConfigOverrides"] == logic.ignition_override()
    with pytest.raises(PermanentError) as refused:
        logic.agent_patch(
            agent(approved=True, role="master"), role="worker", host_uid="u", cluster="c1"
        )
    assert refused.value.reason == logic.ROLE_CONFLICT
    with pytest.raises(PermanentError):
        logic.agent_patch(
            agent(ignitionConfigOverrides="[]"), role="worker", host_uid="u", cluster="c1"
        )


def test_the_internal_url_keeps_path_and_query_and_counts_as_the_same_image() -> None:
    url = "https://image-service.sim/images/abc?arch=x86_64&type=full-iso"
    internal = logic.internal_url(url, "10.0.0.1", 8080)
    assert internal == "http://10.0.0.1:8080/images/abc?arch=x86_64&type=full-iso"
    assert logic.same_image(internal, url, internal=True)
    assert not logic.same_image(internal, url, internal=False)
    assert not logic.same_image("", url, internal=True)
    assert logic.same_image(url, url, internal=False)


def test_status_holds_compares_fields_and_conditions() -> None:
    available, ready = logic.summary(logic.condition(logic.DATA_SECRET, True, "DataSecretCreated"))
    assert ready.type == logic.READY
    assert ready.status == "True"
    obj = {
        "status": {
            "ready": True,
            "conditions": [
                {"type": "DataSecretAvailable", "status": "True", "reason": "DataSecretCreated"},
                {"type": "Ready", "status": "True", "reason": "DataSecretCreated"},
            ],
        }
    }
    assert logic.holds(obj, {"ready": True, "agentRef": None}, [available, ready])
    assert not logic.holds(obj, {"dataSecretName": "x"}, [])
    assert not logic.holds(obj, {}, [logic.condition(logic.DATA_SECRET, False, "X")])
