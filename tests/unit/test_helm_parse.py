"""shared.helm's pure helpers, and ensure_release's decisions against a scripted fake helm."""

import json
from collections.abc import Sequence
from typing import Any

import pytest

from shared.errors import PermanentError, TemporaryError
from shared.helm import (
    ChartNotFound,
    ChartRef,
    ChartRenderFailed,
    Completed,
    Helm,
    HelmFailed,
    HelmForbidden,
    HelmRejected,
    HelmUnavailable,
    InvalidReleaseName,
    ReleaseNotFound,
    ReleaseObjectsInvalid,
    ReleaseTooLarge,
    Revision,
    classify,
    duration,
    duration_seconds,
    error_message,
    normalise,
    parse_json_output,
    release_selector,
    revision_from_history,
    revision_from_metadata,
    revision_from_release,
    rollback_target,
    split_chart,
)

# --- parsing ----------------------------------------------------------------------------------


def test_json_output_skips_lines_before_the_document() -> None:
    stdout = 'Pulled: ghcr.io/x/chart:1.0.0\nDigest: sha256:abc\n{"name": "r", "version": 2}\n'
    assert parse_json_output(stdout) == {"name": "r", "version": 2}


def test_json_output_accepts_lists_null_and_trailing_text() -> None:
    assert parse_json_output('[{"revision": 1}]\n') == [{"revision": 1}]
    assert parse_json_output("null\n") is None
    assert parse_json_output('{"a": 1}\nNOTES: thanks\n') == {"a": 1}


def test_json_output_without_a_document_is_a_helm_failure() -> None:
    with pytest.raises(HelmFailed):
        parse_json_output("Rollback was a success! Happy Helming!\n")


@pytest.mark.parametrize(
    ("chart", "expected"),
    [
        ("openstack-cluster-0.27.0-standin", ("openstack-cluster", "0.27.0-standin")),
        ("zenith-operator-0.1.0", ("zenith-operator", "0.1.0")),
        ("foo-2fa-v1.2.3+build.1", ("foo-2fa", "v1.2.3+build.1")),
        ("no-version", ("no-version", "")),
    ],
)
def test_split_chart(chart: str, expected: tuple[str, str]) -> None:
    assert split_chart(chart) == expected


def test_revisions_from_each_helm_document() -> None:
    metadata = {
        "name": "demo",
        "chart": "openstack-cluster",
        "version": "0.27.0-standin",
        "appVersion": "0.27.0",
        "revision": 2,
        "status": "pending-upgrade",
    }
    history = {
        "revision": 1,
        "status": "deployed",
        "chart": "openstack-cluster-0.27.0-standin",
        "app_version": "0.27.0",
        "description": "Install complete",
    }
    release = {
        "version": 3,
        "info": {"status": "deployed", "description": "Upgrade complete"},
        "chart": {"metadata": {"name": "openstack-cluster", "version": "0.27.0-standin"}},
    }
    assert revision_from_metadata(metadata) == Revision(
        2, "pending-upgrade", "openstack-cluster", "0.27.0-standin", "0.27.0"
    )
    assert revision_from_history(history) == Revision(
        1, "deployed", "openstack-cluster", "0.27.0-standin", "0.27.0", "Install complete"
    )
    assert revision_from_release(release) == Revision(
        3, "deployed", "openstack-cluster", "0.27.0-standin", None, "Upgrade complete"
    )


def _rev(revision: int, status: str) -> Revision:
    return Revision(revision, status, "c", "1.0.0")


def test_rollback_target_prefers_the_last_deployed_revision() -> None:
    history = [_rev(1, "superseded"), _rev(2, "deployed"), _rev(3, "failed"), _rev(4, "x")]
    assert rollback_target(history, 4) == 2
    assert rollback_target([_rev(1, "superseded"), _rev(2, "failed")], 3) == 1
    assert rollback_target([_rev(1, "failed")], 2) is None


def test_durations() -> None:
    assert duration(90) == "90s"
    assert duration("1h30m") == "1h30m"
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("2m0.5s") == 120.5
    assert duration_seconds(7) == 7
    with pytest.raises(ValueError, match="not a duration"):
        duration("soon")


def test_normalise_makes_plain_json() -> None:
    assert normalise({"a": (1, 2), "b": {"c": None}}) == {"a": [1, 2], "b": {"c": None}}


def test_chart_ref_args() -> None:
    assert ChartRef("/charts/openstack-cluster").args() == ["/charts/openstack-cluster"]
    assert ChartRef("oc", "https://r.example", "1.0.0").args() == [
        "oc",
        "--repo",
        "https://r.example",
        "--version",
        "1.0.0",
    ]


# --- errors ----------------------------------------------------------------------------------


def test_error_message_keeps_only_helms_error_lines() -> None:
    stderr = (
        'level=WARN msg="upgrade failed" name=demo error="context canceled"\n'
        "Error: UPGRADE FAILED: context canceled\n"
    )
    assert error_message(stderr) == "UPGRADE FAILED: context canceled"
    assert error_message("something odd\n") == "something odd"
    assert error_message("") == "helm failed with no output"


def test_error_message_is_the_same_at_every_try_of_a_failing_connection() -> None:
    def refused(port: int) -> str:
        return (
            'Error: looks like "https://charts.example" is not a valid chart repository or '
            'cannot be reached: Get "https://charts.example/index.yaml": read tcp '
            f"10.0.0.5:{port}->10.0.0.9:443: read: connection reset by peer\n"
        )

    assert error_message(refused(37008)) == error_message(refused(41552))
    assert "read tcp 10.0.0.9:443: read: connection reset by peer" in error_message(refused(1))
    dial = 'Error: Get "https://x/index.yaml": dial tcp 10.0.0.9:443: connect: refused\n'
    assert error_message(dial) == dial.removeprefix("Error: ").strip()


LONG = "a" * 60


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("Error: release: not found", ReleaseNotFound),
        ("Error: uninstall: Release not loaded: x: release: not found", ReleaseNotFound),
        (
            "Error: UPGRADE FAILED: execution error at (c/templates/fail.yaml:3:4): boom\n"
            "\nUse --debug flag to render out invalid YAML\n",
            ChartRenderFailed,
        ),
        ("Error: parse error at (c/templates/x.yaml:1): unexpected }", ChartRenderFailed),
        ('Error: path "/nonexistent/chart" not found', ChartNotFound),
        (
            'Error: looks like "http://127.0.0.1:1/charts" is not a valid chart repository or'
            ' cannot be reached: Get "http://127.0.0.1:1/charts/index.yaml": dial tcp'
            " 127.0.0.1:1: connect: connection refused",
            ChartNotFound,
        ),
        (
            'Error: chart "x" version "9.9.9" not found in https://r.example repository',
            ChartNotFound,
        ),
        (
            'Error: kubernetes cluster unreachable: Get "https://127.0.0.1:1/version": dial tcp'
            " 127.0.0.1:1: connect: connection refused",
            HelmUnavailable,
        ),
        (
            "Error: UPGRADE FAILED: pre-upgrade hooks failed: resource not ready, name: x,"
            " kind: Job, status: InProgress: context deadline exceeded",
            HelmFailed,
        ),
        ('Error: create: failed to create: namespaces "gone" not found', HelmFailed),
        (
            "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress",
            HelmFailed,
        ),
        # helm v4.2.2's own words for a name it refuses, per command
        (f"Error: uninstall: Release name is invalid: {LONG}", InvalidReleaseName),
        (f"Error: releaseContent: Release name is invalid: {LONG}", InvalidReleaseName),
        (f"Error: release name is invalid: {LONG}", InvalidReleaseName),
        (f"Error: prepareRollback: Release name is invalid: {LONG}", InvalidReleaseName),
        (
            f'Error: INSTALLATION FAILED: release name check failed: release name "{LONG}":'
            " invalid release name, must match regex ^[a-z0-9]([-a-z0-9]*[a-z0-9])?"
            r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53",
            InvalidReleaseName,
        ),
        (
            'Error: INSTALLATION FAILED: failed to create resource: Deployment.apps "x" is'
            " invalid: spec.template.spec.containers[0].image: Required value",
            ReleaseObjectsInvalid,
        ),
        (
            'Error: UPGRADE FAILED: error validating "": error validating data:'
            ' ValidationError(Deployment.spec): unknown field "replicaz"',
            ReleaseObjectsInvalid,
        ),
        (
            "Error: INSTALLATION FAILED: server-side apply failed for object t/cm /v1,"
            " Kind=ConfigMap: failed to create typed patch object (t/cm; /v1, Kind=ConfigMap):"
            " .spex: field not declared in schema",
            ReleaseObjectsInvalid,
        ),
        (
            'Error: UPGRADE FAILED: ConfigMap "cm" in version "v1" cannot be handled as a'
            ' ConfigMap: strict decoding error: unknown field "spex"',
            ReleaseObjectsInvalid,
        ),
        (
            'Error: INSTALLATION FAILED: create: failed to create: Secret "sh.helm.release.v1.'
            'demo.v1" is invalid: data: Too long: may not be more than 1048576 bytes',
            ReleaseTooLarge,
        ),
        (
            "Error: UPGRADE FAILED: failed to create resource: Request entity too large:"
            " limit is 3145728",
            ReleaseTooLarge,
        ),
        (
            "Error: INSTALLATION FAILED: failed to create resource: secrets is forbidden: User"
            ' "system:serviceaccount:capibus:helm" cannot create resource "secrets" in API'
            ' group "" in the namespace "tenant"',
            HelmForbidden,
        ),
        (
            "Error: kubernetes cluster unreachable: the server has asked for the client to"
            " provide credentials",
            HelmForbidden,
        ),
        (
            "Error: INSTALLATION FAILED: unable to build kubernetes objects from release"
            ' manifest: resource mapping not found for name: "x" namespace: "" from "": no'
            ' matches for kind "OpenStackCluster" in version'
            ' "infrastructure.cluster.x-k8s.io/v1beta1"\nensure CRDs are installed first',
            HelmFailed,
        ),
        (
            "Error: UPGRADE FAILED: the server is currently unable to handle the request",
            HelmUnavailable,
        ),
        (
            'Error: UPGRADE FAILED: Get "https://k/api": net/http: TLS handshake timeout',
            HelmUnavailable,
        ),
    ],
)
def test_classify(stderr: str, kind: type[Exception]) -> None:
    error = classify(stderr)
    assert type(error) is kind
    assert str(error) == error_message(stderr)


def test_error_classes_map_onto_the_retry_vocabulary() -> None:
    render = classify("Error: execution error at (x): boom")
    assert isinstance(render, PermanentError)
    assert render.reason == "ChartRenderFailed"
    assert "boom" in str(render)
    for kind in (ChartNotFound, HelmUnavailable, HelmFailed):
        assert issubclass(kind, TemporaryError)
    for kind in (InvalidReleaseName, ReleaseObjectsInvalid, ReleaseTooLarge, HelmForbidden):
        assert issubclass(kind, HelmRejected)
        assert issubclass(kind, PermanentError)
        assert kind("x").reason == kind.__name__


# --- ensure_release decisions, against a scripted helm ------------------------------------------

CHART = ChartRef("/charts/openstack-cluster")
CHART_YAML = "apiVersion: v2\nname: openstack-cluster\nversion: 0.27.0-standin\n"


class FakeHelm:
    """Answers helm commands from a small release store; records every command."""

    def __init__(self, history: list[dict[str, Any]], values: dict[int, Any]) -> None:
        self.history = history
        self.values = values
        self.commands: list[list[str]] = []
        self.stdin: list[bytes | None] = []

    async def __call__(
        self, argv: Sequence[str], stdin: bytes | None, deadline: float
    ) -> Completed:
        args = list(argv[1:])
        self.commands.append(args)
        self.stdin.append(stdin)
        verb = " ".join(args[:2]) if args[0] in ("get", "show") else args[0]
        if verb == "show chart":
            return Completed(0, CHART_YAML, "")
        if not self.history and verb in ("get metadata", "history", "uninstall"):
            return Completed(1, "", "Error: release: not found\n")
        return self._answer(verb, args, stdin)

    def _answer(self, verb: str, args: list[str], stdin: bytes | None) -> Completed:
        last = self.history[-1] if self.history else None
        if verb == "get metadata":
            assert last is not None
            name, version = split_chart(last["chart"])
            doc = {**last, "chart": name, "version": version}
            return Completed(0, json.dumps(doc), "")
        if verb == "history":
            return Completed(0, json.dumps(self.history), "")
        if verb == "get values":
            return Completed(
                0, json.dumps(self.values.get(int(args[args.index("--revision") + 1]))), ""
            )
        if verb == "uninstall":
            self.history.clear()
            return Completed(0, 'release "demo" uninstalled\n', "")
        if verb == "rollback":
            self._add("deployed", self.values[int(args[2])])
            return Completed(0, "Rollback was a success! Happy Helming!\n", "")
        assert args[:2] == ["upgrade", "--install"]
        assert "--values" in args
        assert "--reset-values" in args
        assert stdin is not None
        revision = self._add("deployed", json.loads(stdin))
        release = {
            "version": revision,
            "info": {"status": "deployed"},
            "chart": {"metadata": {"name": "openstack-cluster", "version": "0.27.0-standin"}},
        }
        return Completed(0, "Pulled: whatever\n" + json.dumps(release), "")

    def _add(self, status: str, values: Any) -> int:
        revision = (self.history[-1]["revision"] if self.history else 0) + 1
        for entry in self.history:
            entry["status"] = "superseded" if entry["status"] == "deployed" else entry["status"]
        self.history.append(
            {"revision": revision, "status": status, "chart": "openstack-cluster-0.27.0-standin"}
        )
        self.values[revision] = values
        return revision

    def verbs(self) -> list[str]:
        return [c[0] for c in self.commands]


def _helm(fake: FakeHelm) -> Helm:
    return Helm(executable="helm", kubeconfig="/k", executor=fake, home="/tmp/capibus-unit-helm")


async def test_first_run_installs_with_values_on_stdin() -> None:
    fake = FakeHelm([], {})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"key": "secret-ssh-key"})
    assert (outcome.revision, outcome.status, outcome.action) == (1, "deployed", "installed")
    upgrade = fake.commands[-1]
    assert "secret-ssh-key" not in " ".join(upgrade)
    assert json.loads(fake.stdin[-1] or b"") == {"key": "secret-ssh-key"}
    assert upgrade[-2:] == ["--kubeconfig", "/k"]
    # The API server validates (fieldValidation=Strict); helm's own pass only costs CPU.
    assert "--disable-openapi-validation" in upgrade


async def test_a_first_install_reads_no_chart() -> None:
    fake = FakeHelm([], {})
    await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 1})
    assert fake.verbs() == ["get", "upgrade"]


async def test_an_absent_release_is_installed_by_one_helm_process() -> None:
    fake = FakeHelm([], {})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 1}, absent=True)
    assert fake.verbs() == ["upgrade"]
    assert (outcome.revision, outcome.action) == (1, "installed")


async def test_helm_stores_releases_in_secrets_where_the_selector_finds_them() -> None:
    fake = FakeHelm([], {})
    helm = _helm(fake)
    assert helm._env["HELM_DRIVER"] == "secret"
    assert release_selector("demo") == "owner=helm,name=demo"


async def test_helm_runs_on_one_core_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert _helm(FakeHelm([], {}))._env["GOMAXPROCS"] == "1"
    monkeypatch.setenv("GOMAXPROCS", "4")
    assert _helm(FakeHelm([], {}))._env["GOMAXPROCS"] == "4"


async def test_same_chart_and_values_is_a_no_op() -> None:
    fake = FakeHelm([], {})
    helm = _helm(fake)
    await helm.ensure_release("demo", "ns", CHART, {"n": 1})
    outcome = await helm.ensure_release("demo", "ns", CHART, {"n": 1})
    assert (outcome.revision, outcome.action) == (1, "unchanged")
    assert fake.verbs().count("upgrade") == 1


async def test_changed_values_upgrade() -> None:
    fake = FakeHelm([], {})
    helm = _helm(fake)
    await helm.ensure_release("demo", "ns", CHART, {"n": 1})
    outcome = await helm.ensure_release("demo", "ns", CHART, {"n": 2})
    assert (outcome.revision, outcome.action) == (2, "upgraded")


async def test_pending_upgrade_is_rolled_back_to_the_last_deployed_revision() -> None:
    history = [
        {"revision": 1, "status": "deployed", "chart": "openstack-cluster-0.27.0-standin"},
        {"revision": 2, "status": "pending-upgrade", "chart": "openstack-cluster-0.27.0-standin"},
    ]
    fake = FakeHelm(history, {1: {"n": 1}, 2: {"n": 2}})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 3})
    assert fake.commands[fake.verbs().index("rollback")][:3] == ["rollback", "demo", "1"]
    assert (outcome.revision, outcome.action) == (4, "recovered+upgraded")


async def test_rollback_to_the_wanted_values_needs_no_upgrade() -> None:
    history = [
        {"revision": 1, "status": "deployed", "chart": "openstack-cluster-0.27.0-standin"},
        {"revision": 2, "status": "pending-rollback", "chart": "openstack-cluster-0.27.0-standin"},
    ]
    fake = FakeHelm(history, {1: {"n": 1}, 2: {"n": 2}})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 1})
    assert (outcome.revision, outcome.action) == (3, "recovered+unchanged")
    assert "upgrade" not in fake.verbs()


@pytest.mark.parametrize("status", ["pending-install", "uninstalling"])
async def test_stuck_install_is_uninstalled_then_installed(status: str) -> None:
    history = [{"revision": 1, "status": status, "chart": "openstack-cluster-0.27.0-standin"}]
    fake = FakeHelm(history, {1: {"n": 1}})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 1})
    assert fake.verbs().index("uninstall") < fake.verbs().index("upgrade")
    assert (outcome.revision, outcome.action) == (1, "recovered+installed")


async def test_failed_release_is_upgraded_even_with_the_same_values() -> None:
    history = [{"revision": 1, "status": "failed", "chart": "openstack-cluster-0.27.0-standin"}]
    fake = FakeHelm(history, {1: {"n": 1}})
    outcome = await _helm(fake).ensure_release("demo", "ns", CHART, {"n": 1})
    assert (outcome.revision, outcome.action) == (2, "upgraded")


async def test_uninstall_of_a_missing_release_is_false() -> None:
    fake = FakeHelm([], {})
    assert await _helm(fake).uninstall("demo", "ns") is False


async def test_template_runs_without_cluster_flags() -> None:
    class Render:
        argv: Sequence[str] = ()

        async def __call__(self, argv: Sequence[str], stdin: bytes | None, d: float) -> Completed:
            self.argv = argv
            return Completed(0, "---\n# empty\n---\nkind: ConfigMap\n---\nkind: Pod\n", "")

    render = Render()
    helm = Helm(kubeconfig="/k", executor=render, home="/tmp/capibus-unit-helm")
    docs = await helm.template(ChartRef("/charts/za"), "zenith-apiserver", "kube-system", {})
    assert [d["kind"] for d in docs] == ["ConfigMap", "Pod"]
    assert "--kubeconfig" not in render.argv


class NoHelm:
    """An executor that fails the test if helm is run at all."""

    async def __call__(self, argv: Sequence[str], stdin: bytes | None, d: float) -> Completed:
        raise AssertionError(f"helm was run: {argv}")


@pytest.mark.parametrize("name", [LONG, "Upper", "under_score", "-dash", ""])
async def test_a_name_helm_refuses_is_no_release_and_never_reaches_helm(name: str) -> None:
    helm = Helm(executor=NoHelm(), home="/tmp/capibus-unit-helm")
    assert await helm.uninstall(name, "ns") is False
    assert await helm.status(name, "ns") is None
    assert await helm.history(name, "ns") == []
    with pytest.raises(InvalidReleaseName) as raised:
        await helm.ensure_release(name, "ns", CHART, {})
    assert raised.value.reason == "InvalidReleaseName"
    with pytest.raises(InvalidReleaseName):
        await helm.template(CHART, name, "ns", {})


async def test_the_longest_name_helm_accepts_still_runs_helm() -> None:
    fake = FakeHelm([], {})
    assert await _helm(fake).uninstall("a" * 53, "ns") is False
    assert fake.verbs() == ["uninstall"]


async def test_uninstall_that_helm_refuses_by_name_is_false() -> None:
    """Should helm's rule ever be stricter than ours, its refusal still means no release."""

    async def refuse(argv: Sequence[str], stdin: bytes | None, d: float) -> Completed:
        return Completed(1, "", f"Error: uninstall: Release name is invalid: {argv[2]}\n")

    helm = Helm(executor=refuse, home="/tmp/capibus-unit-helm")
    assert await helm.uninstall("demo", "ns") is False
    assert await helm.status("demo", "ns") is None
