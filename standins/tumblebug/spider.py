"""The CB-Spider ``anycall`` stand-in: what single-cloud CB-Ladybug asks of Spider.

``POST /spider/anycall`` answers the four functions CB-Ladybug calls
(``src/core/service/cloud_provider.go`` of cloud-barista/cb-ladybug v0.7.2) the way Spider's
AWS and OpenStack drivers do, in Spider's JSON (``FID``, ``IKeyValueList``,
``OKeyValueList[{Key, Value}]``):

- ``getRegionInfo`` (AWS): the connection's ``Region`` and ``Zone``, each value encrypted as
  Spider stores credentials (``shared.spider.conceal``, a fresh IV per value);
- ``getConnectionInfo`` (OpenStack): Keystone's endpoint and a made-up user, password, project
  and domain, encrypted the same way;
- ``associateIamInstanceProfile``: ``Result: true``, or, like AWS, ``Result: false`` with an
  ``IncorrectState`` reason when the instance already has a profile (so a test sees a
  provisioner that associates twice);
- ``createTags``: ``Result: true``; the tag is recorded on the resource.

What was associated and tagged is in ``/_standin/state`` (``spider``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from shared.spider import conceal
from standins.tumblebug.model import Json, TbError
from standins.tumblebug.seed import Connection

#: the OpenStack credentials the stand-in's Spider holds (a test checks they reach the node)
OPENSTACK_USER = {"Username": "capibus", "Password": "stand-in's p@ss", "DomainName": "Default"}


@dataclass
class SpiderStub:
    profiles: dict[str, str] = field(default_factory=dict)
    tags: dict[str, list[Json]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def anycall(self, connection: Connection, fid: str, given: list[Any]) -> list[Json]:
        self.calls.append(fid)
        inputs = {str(_get(p, "key")): str(_get(p, "value")) for p in given if isinstance(p, dict)}
        if fid == "getRegionInfo":
            return _sealed({"Region": connection.region, "Zone": connection.zone})
        if fid == "getConnectionInfo":
            if connection.csp != "openstack":
                raise TbError(500, f"{connection.provider} driver: getConnectionInfo unsupported")
            return _sealed(
                {
                    "IdentityEndpoint": "http://keystone.standin.test:5000/v3",
                    "ProjectID": f"project-{connection.region.lower()}",
                    **OPENSTACK_USER,
                }
            )
        if fid == "associateIamInstanceProfile":
            return self._associate(inputs.get("InstanceId", ""), inputs.get("Role", ""))
        if fid == "createTags":
            tag = json.loads(inputs.get("Tag") or "{}")
            self.tags.setdefault(inputs.get("ResourceId", ""), []).append(tag)
            return _result(True)
        raise TbError(500, f"anycall: unknown function {fid!r}")

    def _associate(self, instance: str, role: str) -> list[Json]:
        if not instance or not role:
            return _result(False, "InvalidParameterValue: InstanceId and Role are required")
        if instance in self.profiles:
            return _result(
                False, f"IncorrectState: There is an existing association for instance {instance}"
            )
        self.profiles[instance] = role
        return _result(True)

    def summary(self) -> Json:
        return {"profiles": dict(self.profiles), "tags": dict(self.tags), "calls": list(self.calls)}


def _result(ok: bool, reason: str = "") -> list[Json]:
    pairs = [{"Key": "Result", "Value": "true" if ok else "false"}]
    return pairs + ([{"Key": "Reason", "Value": reason}] if reason else [])


def _sealed(values: dict[str, str]) -> list[Json]:
    return [{"Key": k, "Value": conceal(v, os.urandom(16))} for k, v in values.items()]


def _get(pair: dict[str, Any], name: str) -> Any:
    return pair.get(name, pair.get(name.capitalize(), ""))
