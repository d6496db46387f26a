"""``python -m services``: which service consumes which subject, from the services' own tables.

Every consuming service declares its subscriptions in one ``Routes`` table
(``shared.wiring``); this command reads those tables, without connecting to anything, and
prints one map of the system (stream, subject filter for any partition, message model,
service and subscription). ``--asyncapi`` writes the same map as an AsyncAPI 3.0 document,
with the JSON schema of every message model, for tools that draw or check event flows.

``python -m services run --all`` (or ``--only writer,lease``) runs services in one process
instead (``services.allinone``); without either, the ``CAPIBUS_SERVICES`` setting chooses.

``python -m services rbac --write DIR`` (``--check DIR``, ``--doc FILE``) renders every
service's declared Kubernetes permissions (``services/<svc>/rbac.py``) for the chart
(``shared.rbac``).

``python -m services access`` prints what every service may do on NATS and Redis
(``services/<svc>/access.py``, ``shared.access``): ``--nats`` the nats-server
``authorization`` block (passwords as ``$CAPIBUS_NATS_PASSWORD_<USER>`` references), ``--redis``
the Redis ACL rules, default a matrix for ``docs/permissions.md``.

It lives beside the services rather than in ``shared``: it and ``services.allinone`` are the
modules that import them all, and no service imports them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from services import allinone
from shared import access, messages, rbac
from shared.wiring import Consumed, Routes, table

#: every service with a subscription table, by package
CONSUMERS = (
    "baremetal.assisted_bootstrap",
    "baremetal.assisted_controlplane",
    "baremetal.metalstack",
    "catalog",
    "discovery",
    "helm",
    "identity",
    "ladybug.provisioner",
    "lease",
    "monitor",
    "writer",
)


#: every service's declared permissions, by its name in the chart, then its package
PERMISSIONS = (
    ("watcher", "watcher"),
    ("writer", "writer"),
    ("identity", "identity"),
    ("lease", "lease"),
    ("helm", "helm"),
    ("monitor", "monitor"),
    ("discovery", "discovery"),
    ("admission", "admission"),
    ("catalog", "catalog"),
    ("exporter", "exporter"),
    ("metalstack", "baremetal.metalstack"),
    ("assisted-bootstrap", "baremetal.assisted_bootstrap"),
    ("assisted-controlplane", "baremetal.assisted_controlplane"),
    ("ladybug-api", "ladybug.api"),
    ("ladybug-provisioner", "ladybug.provisioner"),
)


#: every service that connects to NATS, by package (its user is its name on the bus)
BUS_USERS = (
    "watcher",
    "writer",
    "identity",
    "lease",
    "helm",
    "monitor",
    "discovery",
    "catalog",
    "exporter",
    "baremetal.metalstack",
    "baremetal.assisted_bootstrap",
    "baremetal.assisted_controlplane",
    "ladybug.provisioner",
)


def accesses() -> list[access.Access]:
    """Every service's declared bus and Redis access (``services/<svc>/access.py``)."""
    return [importlib.import_module(f"services.{package}.access").ACCESS for package in BUS_USERS]


def bus_users() -> dict[str, str]:
    """The NATS and Redis user of each chart service that connects to them."""
    chart_names = {package: name for name, package in PERMISSIONS}
    return {chart_names[p]: a.user for p, a in zip(BUS_USERS, accesses(), strict=True)}


def permissions() -> list[rbac.Service]:
    declared = ((name, f"services.{package}.rbac") for name, package in PERMISSIONS)
    return [
        rbac.Service(name, module, importlib.import_module(module).RULES)
        for name, module in declared
    ]


def routes() -> list[Routes[Any]]:
    return [importlib.import_module(f"services.{name}.app").ROUTES for name in CONSUMERS]


def render(rows: list[Consumed]) -> str:
    header = ("STREAM", "SUBJECT", "MODEL", "SERVICE", "SUBSCRIPTION")
    lines = [header, *((r.stream, r.subject, r.model, r.service, r.subscription) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def asyncapi(rows: list[Consumed]) -> dict[str, Any]:
    """An AsyncAPI 3.0 document: a channel per subject filter, a receive operation per
    (service, subscription, filter), a message per model."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    models = sorted({r.model for r in rows})
    for row in rows:
        channel = row.subject.replace("*", "_any_").replace(">", "_rest_").replace(".", "-")
        channels[channel] = {
            "address": row.subject,
            "messages": {row.model: {"$ref": f"#/components/messages/{row.model}"}},
            "bindings": {"nats": {"stream": row.stream}},
        }
        operations[f"{row.service}.{row.subscription}.{channel}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": f"{row.service} consumes {row.model} ({row.subscription})",
        }
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "capibus", "version": "1", "description": __doc__.split("\n")[0]},
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": {
                name: {"name": name, "payload": getattr(messages, name).model_json_schema()}
                for name in models
            }
        },
    }


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services run", description=allinone.__doc__.split("\n")[0]
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--all", action="store_true", help="every service but the optional ones")
    chosen.add_argument("--only", metavar="A,B", help="these services (names as in the map)")
    args = parser.parse_args(argv)
    names = ["all"] if args.all else args.only.split(",") if args.only else None
    return allinone.main(names)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:1] == ["rbac"]:
        return rbac.main(argv[1:], permissions())
    if argv[:1] == ["access"]:
        return access.main(argv[1:], accesses(), bus_users())
    parser = argparse.ArgumentParser(prog="python -m services", description=__doc__)
    parser.add_argument("--asyncapi", action="store_true", help="print an AsyncAPI 3.0 document")
    args = parser.parse_args(argv)
    rows = table(routes())
    text = json.dumps(asyncapi(rows), indent=2) if args.asyncapi else render(rows)
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
