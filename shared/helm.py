"""The only door to Helm: an async adapter around the real ``helm`` binary.

It plays the part pyhelm3's ``Client.ensure_release`` plays for the capi-operator (azimuth-peers
reference, section 7.1), written for capibus's needs and for the Helm v4 binary we ship:

* **Idempotent releases.** ``ensure_release`` first makes the release proceedable (a
  ``pending-install`` or ``uninstalling`` release is uninstalled; a ``pending-upgrade`` or
  ``pending-rollback`` one, as left by a helm that was SIGKILLed mid-upgrade, is rolled back to
  its last deployed revision), then does nothing when the deployed revision already has the same
  chart name, chart version and values. Redelivered or replayed work therefore never produces a
  second revision. Each check is a helm process (a few hundred ms of CPU on a busy host), so
  none runs that cannot change the outcome: the chart is read only to compare it with a
  deployed revision, and a caller that has seen no stored revision (``release_selector``, one
  LIST of Secrets) says ``absent`` and gets ``upgrade --install`` alone.
* **Values travel on stdin.** ``--values -`` with a JSON document, never ``--set``: the values
  may hold the Zenith SSH private key, and a command line is visible to every local user in
  ``/proc``. Nothing here logs values either; a log line names the command, release and duration.
* **Upgrades reset values** (``--reset-values``): without it Helm silently reuses the previous
  revision's values when the new ones are empty. They also force server-side-apply conflicts
  (``--force-conflicts``): Helm v4 installs with server-side apply, and the chart is
  authoritative for the fields it renders, as client-side apply was upstream. No ``--wait``
  (hooks are still awaited, up to ``--timeout``) and no ``--create-namespace``: the namespace is
  the Cluster's. And ``--disable-openapi-validation``: Helm v4 sends every object with
  ``fieldValidation=Strict`` (``pkg/kube/client.go``, whatever that flag says), so the API
  server refuses unknown or duplicate fields itself; helm's own "OpenAPI validation" against
  a server that supports that parameter (Kubernetes 1.27 and later) validates nothing client
  side (kubectl's ``ParamVerifyingSchema``): it only downloads and parses the OpenAPI v3
  documents of every kind in the chart to find the parameter supported, a third of an
  install's CPU (``bench/ANALYSIS.md``, "s: first step").
* **Errors are classified from stderr**, as pyhelm3 does, into ``shared.errors`` types at this
  boundary, by whether waiting can heal them. Permanent: a chart that does not render with
  these values (``fail``, ``required``, a template error), objects the API server rejects as
  invalid (422 ``... is invalid: ...``), a release too large for its storage Secret or for
  etcd, and ``forbidden``/missing credentials (RBAC: a human must act, as ``shared.kube``
  treats 401/403). Temporary: an unreachable or overloaded API server, timeouts, another
  operation in progress, a chart or repository that may come back, and kinds whose CRDs are
  not installed yet (``no matches for kind``); anything unrecognised stays temporary, so the
  consumer's bounded retries decide.
* **Release names are checked before helm runs** (``shared.names``): helm refuses names longer
  than 53 characters or not a lower-case DNS subdomain for *every* command, ``uninstall``
  included. Such a release cannot exist, so ``uninstall``/``status``/``history`` answer
  "nothing there" (False/None/[]) and a delete completes; installing it is
  ``InvalidReleaseName``, permanent.
* **Processes.** ``create_subprocess_exec`` (no shell). Helm stays in the caller's process group,
  so a SIGKILL of a service's group takes helm with it, exactly the crash the recovery above
  repairs. When the awaiting task is cancelled, helm gets SIGTERM (Helm then records the release
  as failed) and, after ``kill_grace`` seconds, SIGKILL. A global semaphore bounds concurrent
  helm processes; per-release ordering is the caller's job (it serialises per Cluster). Each
  command is a client span, ``helm <command>`` (``shared.tracing``), inside the handler's.
* **Private Helm home.** ``HELM_CACHE_HOME``, ``HELM_CONFIG_HOME`` and ``HELM_DATA_HOME`` point
  into one private directory, so a host's repositories and plugins never leak in.
* **One core per helm process** (``GOMAXPROCS=1`` unless our own environment sets it). Up to
  ``max_concurrent`` of them run at once, each a short process rendering one chart and
  talking to the API server; a second core only gives each its own garbage-collection and
  network threads fighting the others for the same cores. On the benchmark machine (2 cores)
  it saves 10-20 % of an install's CPU at the same peak memory, and ten installs at once end
  0.1-0.3 s sooner (``bench/ANALYSIS.md``, "s0: the floor").
* **Helm v4 output.** ``-o json`` may be preceded by informational lines (``Pulled:``,
  ``Digest:`` for OCI charts); the JSON document is found rather than assumed to start stdout.
  ``helm status -o json`` carries every live resource in v4, so the current revision is read
  with ``helm get metadata`` instead, and commands that need no cluster (``show chart``,
  ``template``) are run without kube flags, so an API-server outage cannot break them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.trace import Span

from shared import tracing
from shared.errors import CapibusError, PermanentError, TemporaryError
from shared.names import release_name_problem

log = logging.getLogger(__name__)

Json = dict[str, Any]

DEPLOYED = "deployed"
SUPERSEDED = "superseded"
FAILED = "failed"
PENDING_INSTALL = "pending-install"
PENDING_UPGRADE = "pending-upgrade"
PENDING_ROLLBACK = "pending-rollback"
UNINSTALLING = "uninstalling"
# A stuck release is repaired by starting over, or by going back to what last worked.
REINSTALL_FROM = frozenset({PENDING_INSTALL, UNINSTALLING})
ROLL_BACK_FROM = frozenset({PENDING_UPGRADE, PENDING_ROLLBACK})

DEADLINE_MARGIN = 60.0  # beyond helm's own --timeout before we call helm hung
MESSAGE_LIMIT = 2000
#: Go's net errors name the connection's local address, a new ephemeral port at every try
#: ("read tcp 10.0.0.5:37008->10.0.0.9:443: read: connection reset by peer"). The message
#: becomes a Cluster's condition, which is written only when it changes: with the port in it,
#: a Cluster waiting out a chart repository's outage cost a status write at every retry
#: (``soak/OUTAGE.md``).
EPHEMERAL = re.compile(r"\b((?:read|write) (?:tcp|udp)[46]?) \S+->")


# --- errors ---------------------------------------------------------------------------------


class HelmError(CapibusError):
    """Base of everything this adapter raises on a failed helm command."""


class ReleaseNotFound(HelmError):
    """The release does not exist (mapped to None/False/[] by the public methods)."""


class HelmRejected(HelmError, PermanentError):
    """Helm or the API server refused the release in a way waiting cannot heal; ``REASON``
    becomes the reason on the Cluster's condition."""

    REASON = "HelmRejected"

    def __init__(self, message: str) -> None:
        super().__init__(message, reason=self.REASON)


class ChartRenderFailed(HelmRejected):
    """The chart cannot be rendered with these values; retrying the same input cannot help."""

    REASON = "ChartRenderFailed"


class InvalidReleaseName(HelmRejected):
    """Helm refuses the release name (too long, or not a lower-case DNS subdomain)."""

    REASON = "InvalidReleaseName"


class ReleaseObjectsInvalid(HelmRejected):
    """The API server rejected a rendered object as invalid (422 ``... is invalid: ...``)."""

    REASON = "ReleaseObjectsInvalid"


class ReleaseTooLarge(HelmRejected):
    """The release does not fit its storage Secret (1 MiB) or an API request (413)."""

    REASON = "ReleaseTooLarge"


class HelmForbidden(HelmRejected):
    """RBAC forbids what the release needs, or the credentials were refused."""

    REASON = "HelmForbidden"


class ChartNotFound(HelmError, TemporaryError):
    """The chart, its version or its repository is missing or unreachable (it may come back)."""


class HelmUnavailable(HelmError, TemporaryError):
    """The API server is unreachable, or helm did not finish in time talking to it."""


class HelmFailed(HelmError, TemporaryError):
    """Any other failure, including an upgrade whose hooks timed out."""


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChartRef:
    """A chart: a local path, ``oci://`` reference or a name in ``repo``, at ``version``."""

    name: str
    repo: str | None = None
    version: str | None = None

    def args(self) -> list[str]:
        """The chart argument followed by the flags that locate it."""
        args = [self.name]
        if self.repo:
            args += ["--repo", self.repo]
        if self.version:
            args += ["--version", self.version]
        return args


@dataclass(frozen=True)
class Chart:
    """What ``helm show chart`` says about a chart."""

    name: str
    version: str
    app_version: str | None = None


@dataclass(frozen=True)
class Revision:
    """One revision of a release, as stored by Helm."""

    revision: int
    status: str
    chart_name: str
    chart_version: str
    app_version: str | None = None
    description: str = ""


@dataclass(frozen=True)
class ReleaseOutcome:
    """What ``ensure_release`` did: ``action`` is installed, upgraded or unchanged, prefixed by
    ``recovered+`` when a stuck release had to be uninstalled or rolled back first."""

    revision: int
    status: str
    action: str


# --- pure helpers (unit-tested) ----------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_CHART_STRING = re.compile(r"^(?P<name>.+?)-(?P<version>v?\d+\.\d+\.\d+\S*)$")

# Checked in order: the first matching class wins. Chart problems come before connection
# problems because an unreachable repository also says "connection refused". What heals by
# waiting comes before the permanent classes (a kind whose CRDs are missing is reported as
# "unable to build kubernetes objects"), and render errors before the API server's rejections.
_NOT_FOUND = ("release: not found",)
# helm's pkg/action: "uninstall: Release name is invalid: x", "releaseContent: ...",
# "release name is invalid: x" (upgrade, history); install: "invalid release name, must ...".
_INVALID_NAME = ("release name is invalid", "invalid release name")
_HEALS = (
    "ensure crds are installed first",
    "no matches for kind",
    "another operation (install/upgrade/rollback) is in progress",
)
_CHART_MISSING = (
    "not a valid chart repository or cannot be reached",
    "failed to fetch",
    "failed to download",
    "no chart version found",
    "no chart name found",
    "chart not found",
    "repo not found",
    "not found in",  # chart "x" version "y" not found in <repo> repository
)
_CHART_PATH_MISSING = re.compile(r'path "[^"]*" not found')
_RENDER = (
    "execution error at",
    "parse error at",
    "error calling",
    "template: ",
    "yaml parse error",
    "values don't meet the specifications of the schema",
    "error converting yaml to json",
    "failed to parse -",
)
# 413 from the API server (etcd's "request is too large" included), or the release Secret
# over corev1.MaxSecretSize: "Secret \"sh.helm.release.v1.x.v1\" is invalid: data: Too long".
_TOO_LARGE = ("request entity too large", "request is too large")
_TOO_LARGE_SECRET = re.compile(r"sh\.helm\.release\.v1\.[^ ]* is invalid: .*too long")
# A 403 "<resource> is forbidden: User ... cannot ...", or a 401 on helm's first request.
_FORBIDDEN = ("is forbidden:", "the server has asked for the client to provide credentials")
# The API server's schema check (Helm v4 applies with fieldValidation=Strict): a field the
# kind's schema does not declare, or a duplicate one, fails as the apply's typed patch.
_INVALID_OBJECTS = (
    " is invalid: ",
    "error validating data",
    "field not declared in schema",
    "strict decoding error",
)
_UNAVAILABLE = (
    "kubernetes cluster unreachable",
    "connection refused",
    "connection reset by peer",
    "no route to host",
    "i/o timeout",
    "tls handshake timeout",
    "client connection lost",
    "the server is currently unable to handle the request",
    "unexpected eof",
)


_CLASSES: tuple[tuple[type[HelmError], tuple[str, ...], re.Pattern[str] | None], ...] = (
    (ReleaseNotFound, _NOT_FOUND, None),
    (InvalidReleaseName, _INVALID_NAME, None),
    (HelmFailed, _HEALS, None),
    (ChartNotFound, _CHART_MISSING, _CHART_PATH_MISSING),
    (ChartRenderFailed, _RENDER, None),
    (ReleaseTooLarge, _TOO_LARGE, _TOO_LARGE_SECRET),
    (HelmForbidden, _FORBIDDEN, None),
    (ReleaseObjectsInvalid, _INVALID_OBJECTS, None),
    (HelmUnavailable, _UNAVAILABLE, None),
)


def duration(timeout: str | float) -> str:
    """A helm ``--timeout`` from a Go duration string or a number of seconds."""
    if isinstance(timeout, int | float):
        return f"{round(timeout)}s"
    if not timeout or _DURATION_PART.sub("", timeout):
        raise ValueError(f"not a duration: {timeout!r}")
    return timeout


def duration_seconds(timeout: str | float) -> float:
    """Seconds in a Go duration string such as ``1h30m`` (or a number of seconds)."""
    if isinstance(timeout, int | float):
        return float(timeout)
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[unit] for n, unit in _DURATION_PART.findall(duration(timeout)))


def normalise(values: Mapping[str, Any]) -> Json:
    """Values as Helm will store them: plain JSON (tuples become lists, keys strings)."""
    result: Json = json.loads(json.dumps(values))
    return result


def parse_json_output(stdout: str) -> Any:
    """The first JSON document in helm's stdout, skipping informational lines before it."""
    decoder = json.JSONDecoder()
    offset = 0
    for line in stdout.splitlines(keepends=True):
        if line.lstrip().startswith(("{", "[", "null")):
            try:
                return decoder.raw_decode(stdout[offset:].lstrip())[0]
            except json.JSONDecodeError:
                pass
        offset += len(line)
    raise HelmFailed(f"helm printed no JSON document: {stdout[:200]!r}")


def split_chart(chart: str) -> tuple[str, str]:
    """``openstack-cluster-0.27.0-standin`` -> (``openstack-cluster``, ``0.27.0-standin``)."""
    match = _CHART_STRING.match(chart)
    return (match["name"], match["version"]) if match else (chart, "")


def revision_from_metadata(doc: Json) -> Revision:
    """A revision from ``helm get metadata -o json``."""
    return Revision(
        revision=int(doc["revision"]),
        status=str(doc["status"]),
        chart_name=str(doc["chart"]),
        chart_version=str(doc["version"]),
        app_version=doc.get("appVersion"),
    )


def revision_from_history(entry: Json) -> Revision:
    """A revision from one entry of ``helm history -o json``."""
    name, version = split_chart(str(entry.get("chart", "")))
    return Revision(
        revision=int(entry["revision"]),
        status=str(entry["status"]),
        chart_name=name,
        chart_version=version,
        app_version=entry.get("app_version"),
        description=str(entry.get("description", "")),
    )


def revision_from_release(doc: Json) -> Revision:
    """A revision from a release document (``helm upgrade -o json``)."""
    metadata = doc.get("chart", {}).get("metadata", {})
    info = doc.get("info", {})
    return Revision(
        revision=int(doc["version"]),
        status=str(info.get("status", "unknown")),
        chart_name=str(metadata.get("name", "")),
        chart_version=str(metadata.get("version", "")),
        app_version=metadata.get("appVersion"),
        description=str(info.get("description", "")),
    )


def rollback_target(history: Sequence[Revision], current: int) -> int | None:
    """The revision a stuck release goes back to: the last deployed before ``current``, else
    the last superseded one; None when nothing ever worked."""
    earlier = [r for r in history if r.revision < current]
    for status in (DEPLOYED, SUPERSEDED):
        revisions = [r.revision for r in earlier if r.status == status]
        if revisions:
            return max(revisions)
    return None


def error_message(stderr: str) -> str:
    """Helm's error, trimmed: its ``Error:`` lines without the prefix, else its last line,
    without the local address of a failed connection (``EPHEMERAL``)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("Error: ") for line in lines if line.startswith("Error: ")]
    message = "; ".join(errors) or (lines[-1] if lines else "helm failed with no output")
    return EPHEMERAL.sub(r"\1 ", message)[:MESSAGE_LIMIT]


def classify(stderr: str) -> HelmError:
    """The error type for a failed helm command, from what it printed on stderr."""
    message = error_message(stderr)
    text = message.lower()
    for kind, markers, pattern in _CLASSES:
        if any(marker in text for marker in markers) or (pattern and pattern.search(text)):
            return kind(message)
    return HelmFailed(message)


# --- the adapter ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    """A finished helm process."""

    returncode: int
    stdout: str
    stderr: str


# Runs argv with optional stdin within a deadline; None for the real subprocess (tests fake it).
Executor = Callable[[Sequence[str], bytes | None, float], Awaitable[Completed]]


class Helm:
    """Helm commands for one management cluster, at most ``max_concurrent`` at a time."""

    def __init__(
        self,
        *,
        executable: str | os.PathLike[str] = "helm",
        kubeconfig: str | os.PathLike[str] | None = None,
        history_max: int = 10,
        timeout: str | float = "1h",
        home: str | os.PathLike[str] | None = None,
        insecure_skip_tls_verify: bool = False,
        max_concurrent: int = 4,
        command_timeout: float = 300.0,
        kill_grace: float = 5.0,
        executor: Executor | None = None,
    ) -> None:
        self._executable = str(executable)
        self._history_max = str(history_max)
        self._timeout = duration(timeout)
        self._long_deadline = duration_seconds(timeout) + DEADLINE_MARGIN
        self._command_timeout = command_timeout
        self._kill_grace = kill_grace
        self._slots = asyncio.Semaphore(max_concurrent)
        self._kube_args = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
        if insecure_skip_tls_verify:
            self._kube_args.append("--kube-insecure-skip-tls-verify")
        self._env = _helm_env(Path(home or tempfile.mkdtemp(prefix="capibus-helm-")))
        self._execute = executor or self._subprocess

    # -- releases -----------------------------------------------------------------------------

    async def ensure_release(
        self,
        name: str,
        namespace: str,
        chart: ChartRef,
        values: Mapping[str, Any],
        *,
        absent: bool = False,
    ) -> ReleaseOutcome:
        """Install or upgrade ``name`` so it runs ``chart`` with ``values``, unless it already
        does; a release stuck mid-operation is repaired first.

        ``absent``: the caller has just seen that Helm stores no revision of the release
        (no storage Secret matches ``release_selector(name)``), so there is nothing to repair
        or compare and ``upgrade --install`` runs at once: one helm process for a first
        install instead of two. Should a revision have appeared meanwhile after all,
        ``upgrade --install`` upgrades it (a deployed one) or fails as another operation in
        progress (a stuck one, temporary), and the caller's next try sees it stored.
        """
        _check_name(name)
        wanted = normalise(values)
        if absent:
            release = await self._upgrade(name, namespace, chart, wanted)
            return ReleaseOutcome(release.revision, release.status, "installed")
        current, recovered = await self._proceedable(name, namespace)
        prefix = "recovered+" if recovered else ""
        if current and await self._unchanged(current, chart, wanted, name, namespace):
            return ReleaseOutcome(current.revision, current.status, f"{prefix}unchanged")
        release = await self._upgrade(name, namespace, chart, wanted)
        action = "upgraded" if current else "installed"
        return ReleaseOutcome(release.revision, release.status, f"{prefix}{action}")

    async def uninstall(self, name: str, namespace: str) -> bool:
        """Uninstall without waiting for the objects to go; False if there was no release
        (or there cannot be one: helm refuses the name)."""
        if release_name_problem(name):
            return False
        args = ["uninstall", name, "-n", namespace, "--timeout", self._timeout]
        try:
            await self._run(args, label=f"uninstall {name} -n {namespace}", long=True)
        except (ReleaseNotFound, InvalidReleaseName):
            return False
        return True

    async def status(self, name: str, namespace: str) -> Revision | None:
        """The latest revision (whatever its status), or None if there is no release."""
        if release_name_problem(name):
            return None
        args = ["get", "metadata", name, "-n", namespace, "-o", "json"]
        try:
            out = await self._run(args, label=f"get metadata {name} -n {namespace}")
        except (ReleaseNotFound, InvalidReleaseName):
            return None
        return revision_from_metadata(parse_json_output(out))

    async def history(self, name: str, namespace: str) -> list[Revision]:
        """Every stored revision, oldest first; empty if there is no release."""
        if release_name_problem(name):
            return []
        args = ["history", name, "-n", namespace, "-o", "json"]
        try:
            out = await self._run(args, label=f"history {name} -n {namespace}")
        except (ReleaseNotFound, InvalidReleaseName):
            return []
        return [revision_from_history(entry) for entry in parse_json_output(out) or []]

    async def values(self, name: str, namespace: str, revision: int) -> Json:
        """The values a revision was installed with (as given, not merged with defaults)."""
        args = ["get", "values", name, "-n", namespace, "-o", "json", "--revision", str(revision)]
        out = await self._run(args, label=f"get values {name} -n {namespace}")
        result: Json = parse_json_output(out) or {}
        return result

    async def rollback(self, name: str, namespace: str, revision: int) -> None:
        """Roll ``name`` back to ``revision`` (a new revision with that one's content)."""
        args = ["rollback", name, str(revision), "-n", namespace]
        args += ["--history-max", self._history_max, "--timeout", self._timeout]
        await self._run(args, label=f"rollback {name} {revision} -n {namespace}", long=True)

    # -- charts -------------------------------------------------------------------------------

    async def show_chart(self, chart: ChartRef) -> Chart:
        """The chart's name and version (for a repo chart without a version: the latest)."""
        out = await self._run(["show", "chart", *chart.args()], label=f"show chart {chart.name}")
        doc = yaml.safe_load(out) or {}
        return Chart(str(doc.get("name", "")), str(doc.get("version", "")), doc.get("appVersion"))

    async def template(
        self, chart: ChartRef, release: str, namespace: str, values: Mapping[str, Any]
    ) -> list[Json]:
        """The chart rendered locally, as objects; no cluster is contacted."""
        _check_name(release)
        args = ["template", release, *chart.args(), "-n", namespace, "--values", "-"]
        out = await self._run(
            args,
            label=f"template {release} -n {namespace}",
            stdin=json.dumps(normalise(values)).encode(),
            cluster=False,
        )
        return [doc for doc in yaml.safe_load_all(out) if isinstance(doc, dict) and doc]

    # -- steps of ensure_release --------------------------------------------------------------

    async def _proceedable(self, name: str, namespace: str) -> tuple[Revision | None, bool]:
        """The current revision once nothing is stuck, and whether a repair was needed."""
        current = await self.status(name, namespace)
        if current is None or current.status not in REINSTALL_FROM | ROLL_BACK_FROM:
            return current, False
        target = None
        if current.status in ROLL_BACK_FROM:
            target = rollback_target(await self.history(name, namespace), current.revision)
        log.warning("helm release %s/%s is %s: repairing", namespace, name, current.status)
        if target is None:
            await self.uninstall(name, namespace)
            return None, True
        await self.rollback(name, namespace, target)
        return await self.status(name, namespace), True

    async def _unchanged(
        self, current: Revision, chart: ChartRef, wanted: Json, name: str, namespace: str
    ) -> bool:
        # Only a deployed revision can be left as it is; the chart is read only then.
        if current.status != DEPLOYED:
            return False
        target = await self.show_chart(chart)
        same_chart = (current.chart_name, current.chart_version) == (target.name, target.version)
        return same_chart and await self.values(name, namespace, current.revision) == wanted

    async def _upgrade(self, name: str, namespace: str, chart: ChartRef, values: Json) -> Revision:
        args = ["upgrade", "--install", name, *chart.args(), "-n", namespace]
        args += ["--history-max", self._history_max, "--timeout", self._timeout]
        args += ["--reset-values", "--force-conflicts", "--disable-openapi-validation"]
        args += ["-o", "json", "--values", "-"]
        out = await self._run(
            args,
            label=f"upgrade --install {name} -n {namespace}",
            stdin=json.dumps(values).encode(),
            long=True,
        )
        return revision_from_release(parse_json_output(out))

    # -- processes ----------------------------------------------------------------------------

    async def _run(
        self,
        args: Sequence[str],
        *,
        label: str,
        stdin: bytes | None = None,
        cluster: bool = True,
        long: bool = False,
    ) -> str:
        """Run one helm command; its stdout, or the classified error. Logs label and duration."""
        argv = [self._executable, *args, *(self._kube_args if cluster else [])]
        deadline = self._long_deadline if long else self._command_timeout
        started = time.monotonic()
        async with self._slots:
            try:
                with tracing.call(f"helm {_command(args)}") as span:
                    span.set_attribute("capibus.helm.command", label)
                    done = await self._execute(argv, stdin, deadline)
                    _record_exit(span, done.returncode)
            except BaseException as exc:
                log.info("helm %s: %s after %.2fs", label, type(exc).__name__, _since(started))
                raise
        outcome = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        log.info("helm %s: %s in %.2fs", label, outcome, _since(started))
        if done.returncode < 0:
            raise HelmFailed(f"helm {label} was killed by signal {-done.returncode}")
        if done.returncode != 0:
            raise classify(done.stderr)
        return done.stdout

    async def _subprocess(
        self, argv: Sequence[str], stdin: bytes | None, deadline: float
    ) -> Completed:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
            )
        except OSError as exc:
            raise HelmUnavailable(f"cannot run {argv[0]}: {exc}") from exc
        try:
            async with asyncio.timeout(deadline):
                out, err = await proc.communicate(stdin)
        except TimeoutError:
            await self._stop(proc)
            raise HelmUnavailable(f"helm {argv[1]} did not finish within {deadline:.0f}s") from None
        except BaseException:
            await self._stop(proc)
            raise
        rc = proc.returncode if proc.returncode is not None else -1
        return Completed(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM, so Helm can record the release as failed; SIGKILL after the grace period
        or if we are cancelled again meanwhile."""
        if proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(self._kill_grace):
                await proc.wait()
        except TimeoutError:
            pass
        finally:
            if proc.returncode is None:
                proc.kill()


def _command(args: Sequence[str]) -> str:
    """The helm command ``args`` run, without release names: ``get metadata``, ``upgrade``."""
    return " ".join(args[:2]) if args[0] in ("get", "show") else args[0]


def _record_exit(span: Span, returncode: int) -> None:
    span.set_attribute("process.exit.code", returncode)
    if returncode != 0:
        tracing.unsuccessful(span, f"exit {returncode}")


def _check_name(name: str) -> None:
    """Refuse before running helm a release name helm would refuse."""
    problem = release_name_problem(name)
    if problem:
        raise InvalidReleaseName(problem)


def release_selector(name: str) -> str:
    """The label selector of release ``name``'s storage Secrets, one per stored revision
    (Helm's ``secret`` driver, which ``_helm_env`` pins)."""
    return f"owner=helm,name={name}"


def _helm_env(home: Path) -> dict[str, str]:
    """Our environment with Helm's three homes under ``home`` (helm creates them on use), its
    storage driver pinned to Secrets (``release_selector`` finds the revisions there), and one
    core per process unless we were told otherwise."""
    homes = {f"HELM_{name.upper()}_HOME": str(home / name) for name in ("cache", "config", "data")}
    return {"GOMAXPROCS": "1", **os.environ, **homes, "HELM_DRIVER": "secret"}


def _since(started: float) -> float:
    return time.monotonic() - started
