"""The Ladybug REST API as a user's ``curl`` would call it: each call printed as the equivalent
``curl`` line, then the answer's key fields.

Credentials never reach the screen: the ``curl`` line names the bearer token ``$LADYBUG_TOKEN``
(its value is in the file ``demo.ladybugsystem`` wrote), and an answer's ``clusterConfig``
(the cluster's admin kubeconfig, with its client key) is shown as its size only. Nodes carry
no ``credential`` in this API at all; the summary would say so if one ever appeared.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import httpx

from demo.feed import DemoTimeout
from demo.style import BOLD, CYAN, GREEN, RED, say

Json = dict[str, Any]
#: the base path of every route (upstream's ``BASE_URL`` default)
BASE = "/ladybug"
TIMEOUT = 90.0


class Rest:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self._client = httpx.AsyncClient(
            base_url=url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(
        self, method: str, path: str, body: Json | None = None, *, expect: int = 200
    ) -> Json:
        """One call, printed as ``curl``; its JSON answer, which must come with ``expect``."""
        say(f"   $ {curl_line(method, self.url + BASE + path, body)}", CYAN)
        response = await self._client.request(method, BASE + path, json=body)
        answer: Json = response.json() if response.content else {}
        ok = response.status_code == expect
        say(f"   ← {response.status_code} {response.reason_phrase}", BOLD, GREEN if ok else RED)
        for line in summary(answer):
            say(f"     {line}", BOLD)
        if not ok:
            raise RestFailed(f"{method} {path}: {response.status_code}, expected {expect}")
        return answer


class RestFailed(DemoTimeout):
    """The API answered other than the story expects: the effect the demo waits for never
    comes, so it is reported as a ``DemoTimeout`` is."""


def curl_line(method: str, url: str, body: Json | None) -> str:
    parts = [
        "curl -sS",
        *(["-X", method] if method != "GET" else []),
        # Double quotes so a shell expands the variable; the token itself is never printed.
        '-H "Authorization: Bearer $LADYBUG_TOKEN"',
    ]
    if body is not None:
        parts += ["-H", shlex.quote("Content-Type: application/json")]
        parts += ["-d", shlex.quote(json.dumps(body, separators=(",", ":")))]
    return " ".join([*parts, shlex.quote(url)])


def summary(answer: Json) -> list[str]:
    """The key fields of a Cluster, ClusterList, Node, NodeList or Status answer."""
    kind = answer.get("kind")
    if kind == "Cluster":
        return _cluster(answer)
    if kind == "ClusterList":
        items = answer.get("items") or []
        return [f"ClusterList: {len(items)} clusters"] + [
            f"  {c.get('name')}: {(c.get('status') or {}).get('phase')}" for c in items
        ]
    if kind == "NodeList":
        items = answer.get("items") or []
        return [f"NodeList: {len(items)} nodes"] + [_node(n) for n in items]
    if kind == "Node":
        return [_node(answer)]
    return [f"{k}: {v}" for k, v in answer.items() if k in ("kind", "code", "message")]


def _cluster(cluster: Json) -> list[str]:
    status = cluster.get("status") or {}
    config = str(cluster.get("clusterConfig") or "")
    shown = f"admin kubeconfig, {len(config)} bytes, not shown" if config else "none yet"
    lines = [
        f"Cluster {cluster.get('namespace')}/{cluster.get('name')}: phase {status.get('phase')}"
        + (f" ({status.get('reason')}: {status.get('message')})" if status.get("reason") else ""),
        f"mcis {cluster.get('mcis') or '-'} · k8sVersion {cluster.get('k8sVersion')}"
        f" · cpLeader {cluster.get('cpLeader') or '-'} · loadbalancer"
        f" {cluster.get('loadbalancer')} · etcd {cluster.get('etcd')}"
        f" · networkCni {cluster.get('networkCni')}",
        f"clusterConfig: {shown}",
    ]
    return lines + [_node(n) for n in cluster.get("nodes") or []]


def _node(node: Json) -> str:
    leaked = " · CREDENTIAL PRESENT" if node.get("credential") else ""
    return (
        f"  node {node.get('name'):<14} {node.get('role'):<13} public {node.get('publicIp')}"
        f" private {node.get('privateIp')} · {node.get('spec')} on {node.get('csp')}{leaked}"
    )
