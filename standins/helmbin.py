"""A stand-in for the ``helm`` binary: the commands ``shared.helm`` runs, answered as Helm v4
answers them, with releases kept in Helm's own storage Secrets and no chart object applied.

Why it exists: the real helm is CPU-bound on a small machine (a first install is ~0.15 s of
CPU and most of a core while it applies 31 objects, ``bench/ANALYSIS.md``, "s: first step"),
so a benchmark that scales the helm *service* out on two cores would measure the cores. This
program costs ~0.05 s of CPU per command (a Python start, one TLS connection, a few requests)
and instead *waits* ``STANDIN_HELM_LATENCY`` seconds in every install, upgrade, rollback and
uninstall, as helm waits for the API server: the helm service's slots and replicas, not the
machine, bound how many releases move at once.

What it keeps exactly as Helm does (helm.sh/helm/v4 ``pkg/storage/driver/secrets.go``,
``util.go``), because the helm service and ``capibus replay`` read it: one Secret per revision,
``sh.helm.release.v1.<release>.v<revision>``, type ``helm.sh/release.v1``, labels ``owner=helm``,
``name``, ``status``, ``version`` (and ``createdAt`` / ``modifiedAt``), ``data.release`` the
base64 of the gzipped release JSON (name, namespace, version, info, chart metadata, config).
Statuses move as Helm moves them: an install writes ``pending-install`` first and ``deployed``
after the wait; an upgrade or rollback adds ``pending-upgrade`` / ``pending-rollback``, then
marks the old deployed revision ``superseded``; an uninstall marks the latest ``uninstalling``
and, after the wait, deletes every revision; ``--history-max`` prunes the oldest. A release
left ``pending-*`` (its helm was killed) makes the next ``upgrade --install`` fail with
Helm's "another operation (install/upgrade/rollback) is in progress", which ``shared.helm``
classifies as temporary and repairs, as with the real binary.

What it leaves out: nothing of the chart is rendered or applied (``template`` prints no
object), so no CAPI object exists and no Cluster reaches Ready; ``--wait``, hooks and OCI or
repository downloads (a repository chart's name and ``--version`` are taken as given).

The commands and output formats (``tests/unit/test_helm_standin.py`` holds them to
``shared.helm``'s parsers and to ``Helm.ensure_release`` end to end):

==========================================================  =================================
``upgrade --install R CHART -n NS ... -o json --values -``  the release JSON; values on stdin
``get metadata R -n NS -o json``                             name, chart, version, appVersion,
                                                             namespace, revision, status,
                                                             deployedAt
``history R -n NS -o json``                                  revision, updated, status,
                                                             chart (``name-version``),
                                                             app_version, description
``get values R -n NS -o json [--revision N]``                the values given (``null``: none)
``rollback R N -n NS``                                       ``Rollback was a success! ...``
``uninstall R -n NS``                                        ``release "R" uninstalled``
``show chart CHART``                                         Chart.yaml's fields, as YAML
``template R CHART -n NS --values -``                        nothing (no objects)
==========================================================  =================================

A missing release is ``Error: release: not found`` on stderr and exit 1, as helm says it.
Knobs (environment; ``write_wrapper`` bakes them into an executable for
``CAPIBUS_HELM__EXECUTABLE``):

- ``STANDIN_HELM_LATENCY``: seconds each install, upgrade, rollback and uninstall waits
  (default 0);
- ``STANDIN_HELM_READ_LATENCY``: seconds every other command waits (default 0);
- ``STANDIN_HELM_RECORD``: a file to which every command appends one JSON line when it starts
  and one when it ends (time, verb, release, namespace, ``CAPIBUS_REPLICA`` of the calling
  service, pid, outcome): a command killed with its service has a start and no end, which is
  how a benchmark tells which replica ran what, and when.

Only the standard library and PyYAML are imported (the kubeconfig and ``Chart.yaml`` are
YAML), so a command starts in ~40 ms.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import os
import shlex
import ssl
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

Json = dict[str, Any]

SECRET_TYPE = "helm.sh/release.v1"
DEPLOYED, SUPERSEDED, FAILED = "deployed", "superseded", "failed"
PENDING_INSTALL, PENDING_UPGRADE, PENDING_ROLLBACK = (
    "pending-install",
    "pending-upgrade",
    "pending-rollback",
)
UNINSTALLING = "uninstalling"
PENDING = frozenset({PENDING_INSTALL, PENDING_UPGRADE, PENDING_ROLLBACK, UNINSTALLING})
#: verbs that wait ``STANDIN_HELM_LATENCY`` (the others wait ``STANDIN_HELM_READ_LATENCY``)
WRITES = frozenset({"upgrade", "install", "rollback", "uninstall"})
#: flags that take a value; any other flag is a switch
VALUED = frozenset(
    {
        "-n", "--namespace", "--kubeconfig", "--history-max", "--timeout", "-o", "--output",
        "-f", "--values", "--repo", "--version", "--revision", "--kube-context",
    }
)  # fmt: skip
NOT_FOUND = "release: not found"
IN_PROGRESS = "another operation (install/upgrade/rollback) is in progress"


class HelmbinError(Exception):
    """A command that fails: printed as helm prints errors (``Error: <message>``), exit 1."""


class Store(Protocol):
    """Where release Secrets live: the API server (``ApiStore``), or a test's memory."""

    def list(self, namespace: str, selector: str) -> list[Json]: ...

    def create(self, namespace: str, secret: Json) -> None: ...

    def replace(self, namespace: str, secret: Json) -> None: ...

    def delete(self, namespace: str, name: str) -> None: ...


# --- the command line -------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One helm command line, parsed: positional words and flag values."""

    words: tuple[str, ...]
    flags: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, argv: Sequence[str]) -> Command:
        words: list[str] = []
        flags: dict[str, str] = {}
        args = iter(argv)
        for arg in args:
            if arg.startswith("-") and arg != "-":
                name, eq, value = arg.partition("=")
                if eq:
                    flags[name] = value
                elif name in VALUED:
                    flags[name] = next(args, "")
                else:
                    flags[name] = "true"
            else:
                words.append(arg)
        return cls(tuple(words), flags)

    def flag(self, *names: str, default: str = "") -> str:
        return next((self.flags[n] for n in names if n in self.flags), default)

    @property
    def namespace(self) -> str:
        return self.flag("-n", "--namespace", default="default")

    @property
    def verb(self) -> str:
        """``get metadata``, ``show chart``, ``upgrade``, ...: what the record names."""
        if self.words and self.words[0] in ("get", "show") and len(self.words) > 1:
            return " ".join(self.words[:2])
        return self.words[0] if self.words else ""

    @property
    def release(self) -> str | None:
        skip = 2 if self.verb in ("get metadata", "get values") else 1
        if self.verb in ("show chart",) or len(self.words) <= skip:
            return None
        return self.words[skip]


@dataclass(frozen=True)
class Answer:
    code: int
    stdout: str = ""
    stderr: str = ""


@dataclass
class Knobs:
    latency: float = 0.0
    read_latency: float = 0.0
    record: str | None = None
    replica: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Knobs:
        return cls(
            latency=float(env.get("STANDIN_HELM_LATENCY") or 0),
            read_latency=float(env.get("STANDIN_HELM_READ_LATENCY") or 0),
            record=env.get("STANDIN_HELM_RECORD") or None,
            replica=env.get("CAPIBUS_REPLICA", ""),
        )


# --- releases as Helm stores them ------------------------------------------------------------


def secret_name(release: str, revision: int) -> str:
    return f"sh.helm.release.v1.{release}.v{revision}"


def selector(release: str) -> str:
    """The selector ``shared.helm.release_selector`` lists a release's revisions with."""
    return f"owner=helm,name={release}"


def encode_release(doc: Json) -> str:
    """``data.release`` as Helm writes it: base64 of the gzipped JSON (the API server's own
    base64 of Secret data comes on top)."""
    packed = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=9)
    return base64.b64encode(base64.b64encode(packed)).decode()


def decode_release(secret: Json) -> Json:
    raw = base64.b64decode(base64.b64decode(secret["data"]["release"]))
    doc: Json = json.loads(gzip.decompress(raw))
    return doc


def release_secret(doc: Json, *, now: float) -> Json:
    stamp = str(int(now))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(doc["name"], doc["version"]),
            "namespace": doc["namespace"],
            "labels": {
                "name": doc["name"],
                "owner": "helm",
                "status": doc["info"]["status"],
                "version": str(doc["version"]),
                "createdAt": stamp,
            },
        },
        "type": SECRET_TYPE,
        "data": {"release": encode_release(doc)},
    }


def _timestamp(now: float) -> str:
    return (
        datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


@dataclass
class Releases:
    """One release's stored revisions, read from and written to a ``Store``."""

    store: Store
    namespace: str
    name: str
    clock: Callable[[], float] = time.time

    def load(self) -> list[tuple[Json, Json]]:
        """(secret, release document) per stored revision, oldest first."""
        secrets = self.store.list(self.namespace, selector(self.name))
        pairs = [(s, decode_release(s)) for s in secrets]
        return sorted(pairs, key=lambda pair: int(pair[1]["version"]))

    def latest(self) -> Json:
        stored = self.load()
        if not stored:
            raise HelmbinError(NOT_FOUND)
        return stored[-1][1]

    def write(self, doc: Json, *, new: bool) -> None:
        secret = release_secret(doc, now=self.clock())
        if new:
            self.store.create(self.namespace, secret)
        else:
            secret["metadata"]["labels"]["modifiedAt"] = str(int(self.clock()))
            self.store.replace(self.namespace, secret)

    def set_status(self, doc: Json, status: str, description: str) -> Json:
        doc = {**doc, "info": {**doc["info"], "status": status, "description": description}}
        if status == DEPLOYED:
            doc["info"]["last_deployed"] = _timestamp(self.clock())
        self.write(doc, new=False)
        return doc

    def prune(self, keep: int) -> None:
        """Helm's ``--history-max``: the oldest revisions beyond ``keep`` go."""
        stored = self.load()
        for secret, _ in stored[: max(0, len(stored) - keep)]:
            self.store.delete(self.namespace, secret["metadata"]["name"])


# --- charts -------------------------------------------------------------------------------------


def chart_metadata(command: Command, chart: str) -> Json:
    """Chart.yaml of a local chart; for a repository or OCI chart, its name and --version."""
    path = Path(chart)
    if (path / "Chart.yaml").is_file():
        doc = _yaml((path / "Chart.yaml").read_text()) or {}
        return {
            k: doc[k] for k in ("apiVersion", "name", "version", "appVersion", "type") if k in doc
        }
    if chart.startswith((".", "/")):
        raise HelmbinError(f'path "{chart}" not found')
    return {
        "apiVersion": "v2",
        "name": chart.rsplit("/", 1)[-1],
        "version": command.flag("--version"),
    }


def chart_string(metadata: Json) -> str:
    return f"{metadata.get('name', '')}-{metadata.get('version', '')}"


# --- the commands -------------------------------------------------------------------------------


@dataclass
class Helmbin:
    """Answers one command; ``sleep`` and ``clock`` are the test's to replace."""

    store_for: Callable[[Command], Store]
    knobs: Knobs
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time

    def run(self, argv: Sequence[str], stdin: bytes = b"") -> Answer:
        command = Command.parse(argv)
        with self._recorded(command) as outcome:
            try:
                answer = self._answer(command, stdin)
            except HelmbinError as exc:
                answer = Answer(1, stderr=f"Error: {exc}\n")
            outcome.append("ok" if answer.code == 0 else f"exit {answer.code}")
        return answer

    def _answer(self, command: Command, stdin: bytes) -> Answer:
        verb = command.verb
        if verb not in WRITES:
            self.sleep(self.knobs.read_latency)  # a write waits once its pending record is stored
        if verb in ("show chart", "template"):
            return self._chart_command(command, verb)
        handler = {
            "upgrade": self._upgrade,
            "install": self._upgrade,
            "get metadata": self._metadata,
            "get values": self._values,
            "history": self._history,
            "rollback": self._rollback,
            "uninstall": self._uninstall,
        }.get(verb)
        if handler is None or command.release is None:
            raise HelmbinError(f"unknown command {shlex.join(command.words)!r} for the stand-in")
        releases = Releases(self.store_for(command), command.namespace, command.release, self.clock)
        return handler(command, releases, stdin)

    def _chart_command(self, command: Command, verb: str) -> Answer:
        if verb == "template":
            return Answer(0, "")  # no objects: the stand-in applies nothing either
        if len(command.words) < 3:
            raise HelmbinError('"helm show chart" requires 1 argument')
        return Answer(0, yaml.safe_dump(chart_metadata(command, command.words[2]), sort_keys=False))

    # -- writes ----------------------------------------------------------------------------------

    def _upgrade(self, command: Command, releases: Releases, stdin: bytes) -> Answer:
        if len(command.words) < 3:
            raise HelmbinError('"helm upgrade" requires 2 arguments')
        metadata = chart_metadata(command, command.words[2])
        values = _values_from(stdin) if command.flag("-f", "--values") == "-" else {}
        stored = [doc for _, doc in releases.load()]
        if stored and stored[-1]["info"]["status"] in PENDING:
            raise HelmbinError(f"UPGRADE FAILED: {IN_PROGRESS}")
        installing = not stored or all(d["info"]["status"] == "uninstalled" for d in stored)
        version = (int(stored[-1]["version"]) if stored else 0) + 1
        now = _timestamp(self.clock())
        status, description = (
            (PENDING_INSTALL, "Initial install underway")
            if installing
            else (PENDING_UPGRADE, "Preparing upgrade")
        )
        doc: Json = {
            "name": releases.name,
            "namespace": releases.namespace,
            "version": version,
            "info": {"first_deployed": now, "last_deployed": now, "status": status,
                     "description": description},
            "chart": {"metadata": metadata},
            "config": values,
            "manifest": "",
            "apply_method": "ssa",
        }  # fmt: skip
        releases.write(doc, new=True)
        self.sleep(self.knobs.latency)
        doc = self._deploy(
            releases, doc, stored, "Install complete" if installing else "Upgrade complete"
        )
        releases.prune(int(command.flag("--history-max", default="10") or 10))
        if command.flag("-o", "--output") == "json":
            return Answer(0, json.dumps(doc) + "\n")
        return Answer(0, f'Release "{releases.name}" has been upgraded. Happy Helming!\n')

    def _deploy(self, releases: Releases, doc: Json, before: list[Json], description: str) -> Json:
        for old in before:
            if old["info"]["status"] == DEPLOYED:
                releases.set_status(old, SUPERSEDED, "Superseded")
        return releases.set_status(doc, DEPLOYED, description)

    def _rollback(self, command: Command, releases: Releases, _: bytes) -> Answer:
        stored = [doc for _, doc in releases.load()]
        if not stored:
            raise HelmbinError(NOT_FOUND)
        wanted = int(command.words[2]) if len(command.words) > 2 else 0
        target = next((d for d in stored if int(d["version"]) == wanted), None)
        if target is None:
            raise HelmbinError(NOT_FOUND)
        doc = {
            **target,
            "version": int(stored[-1]["version"]) + 1,
            "info": {**target["info"], "status": PENDING_ROLLBACK,
                     "description": f"Rollback to {wanted}"},
        }  # fmt: skip
        releases.write(doc, new=True)
        self.sleep(self.knobs.latency)
        # Helm marks the revision it rolled back from superseded, whatever it was.
        if stored[-1]["info"]["status"] != DEPLOYED:
            releases.set_status(stored[-1], SUPERSEDED, "Superseded")
        self._deploy(releases, doc, stored, f"Rollback to {wanted}")
        releases.prune(int(command.flag("--history-max", default="10") or 10))
        return Answer(0, "Rollback was a success! Happy Helming!\n")

    def _uninstall(self, _: Command, releases: Releases, __: bytes) -> Answer:
        stored = releases.load()
        if not stored:
            raise HelmbinError(f"uninstall: Release not loaded: {releases.name}: {NOT_FOUND}")
        releases.set_status(
            stored[-1][1], UNINSTALLING, "Deletion in progress (or silently failed)"
        )
        self.sleep(self.knobs.latency)
        for secret, _doc in releases.load():
            releases.store.delete(releases.namespace, secret["metadata"]["name"])
        return Answer(0, f'release "{releases.name}" uninstalled\n')

    # -- reads -----------------------------------------------------------------------------------

    def _metadata(self, _: Command, releases: Releases, __: bytes) -> Answer:
        doc = releases.latest()
        chart = doc["chart"]["metadata"]
        out = {
            "name": doc["name"],
            "chart": chart.get("name", ""),
            "version": chart.get("version", ""),
            "appVersion": chart.get("appVersion", ""),
            "namespace": doc["namespace"],
            "revision": int(doc["version"]),
            "status": doc["info"]["status"],
            "deployedAt": doc["info"].get("last_deployed", ""),
            "applyMethod": doc.get("apply_method", ""),
        }
        return Answer(0, json.dumps(out) + "\n")

    def _values(self, command: Command, releases: Releases, __: bytes) -> Answer:
        wanted = command.flag("--revision")
        stored = [doc for _, doc in releases.load()]
        chosen = [d for d in stored if not wanted or str(d["version"]) == wanted]
        if not chosen:
            raise HelmbinError(NOT_FOUND)
        # An empty config is omitted from the stored release, so helm prints null.
        return Answer(0, json.dumps(chosen[-1].get("config") or None) + "\n")

    def _history(self, _: Command, releases: Releases, __: bytes) -> Answer:
        stored = [doc for _, doc in releases.load()]
        if not stored:
            raise HelmbinError(NOT_FOUND)
        entries = [
            {
                "revision": int(d["version"]),
                "updated": d["info"].get("last_deployed", ""),
                "status": d["info"]["status"],
                "chart": chart_string(d["chart"]["metadata"]),
                "app_version": d["chart"]["metadata"].get("appVersion", ""),
                "description": d["info"].get("description", ""),
            }
            for d in stored
        ]
        return Answer(0, json.dumps(entries) + "\n")

    # -- the record ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _recorded(self, command: Command) -> Iterator[list[str]]:
        outcome: list[str] = []
        self._record(command, "start", None)
        try:
            yield outcome
        finally:
            self._record(command, "end", outcome[0] if outcome else "raised")

    def _record(self, command: Command, event: str, outcome: str | None) -> None:
        if not self.knobs.record:
            return
        line = {
            "at": self.clock(),
            "event": event,
            "verb": command.verb,
            "release": command.release,
            "namespace": command.namespace,
            "replica": self.knobs.replica,
            "pid": os.getpid(),
            "outcome": outcome,
        }
        # One short O_APPEND write per line: lines of concurrent commands never interleave.
        with open(self.knobs.record, "a") as out:
            out.write(json.dumps(line) + "\n")


def _yaml(text: str) -> Any:
    """PyYAML's C loader when it was built with libyaml (several times faster to start)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _values_from(stdin: bytes) -> Json:
    text = stdin.decode() or "{}"
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        values = yaml.safe_load(text)
    if values is not None and not isinstance(values, dict):
        raise HelmbinError("failed to parse -: values are not a map")
    return values or {}


# --- the API server ---------------------------------------------------------------------------


class ApiStore:
    """Release Secrets on the API server the kubeconfig names (one keep-alive connection)."""

    def __init__(self, kubeconfig: str | None) -> None:
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        if not path:
            raise HelmbinError("Kubernetes cluster unreachable: no kubeconfig")
        try:
            doc = _yaml(Path(path).expanduser().read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise HelmbinError(f"Kubernetes cluster unreachable: {exc}") from exc
        context = _named(doc, "contexts", doc.get("current-context"))
        cluster = _named(doc, "clusters", context.get("cluster"))
        user = _named(doc, "users", context.get("user"))
        url = urllib.parse.urlsplit(str(cluster["server"]))
        self._host, self._port = url.hostname or "127.0.0.1", url.port
        self._tls = _tls(cluster, user, Path(path).parent) if url.scheme == "https" else None
        token = user.get("token")
        if user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        self._headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            # The API server's audit log tells its requests from the services' by this.
            "User-Agent": "helm-standin",
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._tls is not None:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, context=self._tls, timeout=30
                )
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
        return self._conn

    def _request(self, method: str, path: str, body: Json | None = None) -> Json:
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn = self._connection()
            conn.request(method, path, body=data, headers=self._headers)
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            self._conn = None
            raise HelmbinError(f"Kubernetes cluster unreachable: {exc}") from exc
        doc: Json = json.loads(raw) if raw else {}
        if response.status >= 400:
            raise HelmbinError(str(doc.get("message") or f"{method} {path}: {response.status}"))
        return doc

    @staticmethod
    def _path(namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/secrets"
        return f"{base}/{urllib.parse.quote(name)}" if name else base

    def list(self, namespace: str, selector: str) -> list[Json]:
        query = urllib.parse.urlencode({"labelSelector": selector})
        items: list[Json] = (
            self._request("GET", f"{self._path(namespace)}?{query}").get("items") or []
        )
        return items

    def create(self, namespace: str, secret: Json) -> None:
        self._request("POST", self._path(namespace), secret)

    def replace(self, namespace: str, secret: Json) -> None:
        self._request("PUT", self._path(namespace, secret["metadata"]["name"]), secret)

    def delete(self, namespace: str, name: str) -> None:
        with contextlib.suppress(HelmbinError):  # already gone is gone
            self._request("DELETE", self._path(namespace, name))


def _named(doc: Json, section: str, name: object) -> Json:
    for entry in doc.get(section) or []:
        if entry.get("name") == name:
            found: Json = entry.get(section.rstrip("s")) or {}
            return found
    raise HelmbinError(f"Kubernetes cluster unreachable: no {section} entry {name!r}")


def _tls(cluster: Json, user: Json, base: Path) -> ssl.SSLContext:
    # Only the kubeconfig's CA: loading the system's store too costs a command ~20 ms of CPU.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        context.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif cluster.get("certificate-authority"):
        context.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
    cert, key = user.get("client-certificate"), user.get("client-key")
    if cert and key:
        context.load_cert_chain(str(base / cert), str(base / key))
    return context


# --- the executable -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    knobs = Knobs.from_env(os.environ)
    stdin = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()

    def store_for(command: Command) -> Store:
        return ApiStore(command.flag("--kubeconfig") or None)

    answer = Helmbin(store_for, knobs).run(args, stdin)
    sys.stdout.write(answer.stdout)
    sys.stderr.write(answer.stderr)
    return answer.code


def write_wrapper(
    path: Path,
    *,
    latency: float,
    read_latency: float = 0.0,
    record: Path | None = None,
    python: str = sys.executable,
) -> Path:
    """An executable ``path`` that runs this stand-in with the knobs baked in, for
    ``CAPIBUS_HELM__EXECUTABLE`` (the helm service passes its own environment through, so
    the replica's ``CAPIBUS_REPLICA`` reaches the record)."""
    knobs = {
        "STANDIN_HELM_LATENCY": f"{latency:g}",
        "STANDIN_HELM_READ_LATENCY": f"{read_latency:g}",
    }
    if record is not None:
        knobs["STANDIN_HELM_RECORD"] = str(record)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in knobs.items())
    script = Path(__file__).resolve()
    # -I: no user site, no PYTHON* variables, no script directory on sys.path: the stand-in
    # imports nothing of the repository, and starts faster without it.
    run = f"exec {shlex.quote(python)} -I {shlex.quote(str(script))}"
    text = f'#!/bin/sh\nexport {exports}\n{run} "$@"\n'
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
        out.write(text)
    Path(out.name).chmod(0o755)
    Path(out.name).replace(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
