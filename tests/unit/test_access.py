"""Every service's declared bus and Redis access (``shared.access``): what it really uses is
allowed, what belongs to another service is not, and the rendering is what the servers read."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from services.__main__ import accesses
from shared import access, subjects
from shared.access import Access, Consumed
from shared.bus import subject_matches
from shared.settings import Credentials, TransportSecurity, transport_security
from shared.wiring import table
from testenv import certs

PARTITIONS = 4
DECLARED = {a.user: a for a in accesses()}


matches = subject_matches


def may_publish(user: str, subject: str) -> bool:
    """As nats-server decides: allowed by a pattern, and denied by none (deny wins)."""
    declared = DECLARED[user]
    denied = access.nats_deny(declared, list(DECLARED.values()), PARTITIONS)
    return any(matches(p, subject) for p in access.nats_publish(declared, PARTITIONS)) and not any(
        matches(p, subject) for p in denied
    )


def test_every_consuming_service_may_use_each_of_its_durables_and_nobody_else_may() -> None:
    from services.__main__ import routes  # noqa: PLC0415 (imports every service)

    for row in table(routes()):
        durable = f"{row.service}-{row.subscription}-p{PARTITIONS - 1}"
        for verb in ("CONSUMER.CREATE", "CONSUMER.INFO", "CONSUMER.MSG.NEXT"):
            subject = f"$JS.API.{verb}.{row.stream}.{durable}"
            allowed = {user for user in DECLARED if may_publish(user, subject)}
            assert allowed == {row.service}, subject
        assert may_publish(row.service, f"$JS.ACK.{row.stream}.{durable}.1.2.3.4.5")


def test_no_durable_beyond_the_partition_count() -> None:
    assert not may_publish("writer", "$JS.API.CONSUMER.INFO.CAPIBUS_STATUS.writer-status-p4")


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("watcher", subjects.resource_event("cluster", 3, "ns", "a.b")),
        ("watcher", subjects.resource_listed("machine")),
        ("writer", subjects.journal("statuswritten", "cluster", "ns", "x")),
        ("writer", subjects.dead_letter("writer", subjects.status_patch("cluster", 1, "n", "x"))),
        ("helm", subjects.metadata_patch("cluster", 2, "ns", "x")),
        ("helm", subjects.prerequisite("helm", 2, "ns", "x")),
        ("lease", subjects.status_patch("lease", 0, "ns", "x")),
        ("catalog", subjects.app_template_sync(1, "t")),
        ("metalstack", subjects.recheck("metalstack", 1, "ns", "x")),
        ("identity", "$JS.API.STREAM.MSG.GET.CAPIBUS_LIFECYCLE"),
        ("exporter", "$JS.API.CONSUMER.CREATE.CAPIBUS_EVENTS.abc.capibus.evt.cluster.*.*.*"),
    ],
)
def test_what_a_service_publishes_is_allowed(user: str, subject: str) -> None:
    assert may_publish(user, subject)


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("watcher", subjects.status_patch("cluster", 0, "ns", "x")),
        ("writer", subjects.resource_event("cluster", 0, "ns", "x")),
        ("lease", subjects.metadata_patch("cluster", 2, "ns", "x")),
        ("lease", subjects.dead_letter("writer", "x")),
        ("catalog", subjects.recheck("metalstack", 1, "ns", "x")),
        ("exporter", subjects.resource_event("cluster", 0, "ns", "x")),
        ("exporter", "$JS.API.CONSUMER.CREATE.CAPIBUS_STATUS.abc.capibus.status.>"),
        ("writer", "$JS.API.STREAM.DELETE.CAPIBUS_STATUS"),
        ("writer", "$JS.API.STREAM.PURGE.CAPIBUS_STATUS"),
        ("writer", "$JS.API.STREAM.MSG.GET.CAPIBUS_EVENTS"),
        ("writer", "$JS.API.CONSUMER.INFO.CAPIBUS_EVENTS.lease-cluster-p0"),
        ("watcher", "$JS.API.CONSUMER.INFO.CAPIBUS_EVENTS.lease-cluster-p0"),
        ("exporter", "$JS.API.CONSUMER.DELETE.CAPIBUS_EVENTS.identity-resources-p3"),
    ],
)
def test_what_is_not_a_services_own_is_refused(user: str, subject: str) -> None:
    assert not may_publish(user, subject)


def test_a_service_subscribes_to_its_own_inbox_only() -> None:
    for user, declared in DECLARED.items():
        own = access.nats_subscribe(declared)
        assert own == [f"_INBOX.{user}.>", access.LEADER_ADVISORIES]


def test_the_all_in_one_user_is_the_union_of_every_service() -> None:
    users = access.nats_users(list(DECLARED.values()), PARTITIONS, _passwords())
    everyone = {str(u["user"]): u for u in users}
    union = set(_allow(everyone[access.ALL_IN_ONE]))
    for user in DECLARED:
        assert set(_allow(everyone[user])) <= union, user
    assert everyone[access.ADMIN].get("permissions") is None


def test_rendered_nats_user_snapshot() -> None:
    writer = Access(
        user="writer",
        publish=("capibus.journal.*.*.*.*",),
        consumes=(Consumed("CAPIBUS_STATUS", "status"),),
    )
    rendered = access.render_nats(
        access.nats_users([writer], 1, {"admin": "$A", "writer": "$W", "all": "$ALL"})
    )
    first = rendered.splitlines()[:4]
    assert first == [
        "authorization {",
        "  users = [",
        '    {"user": "admin", "password": $A}',
        '    {"user": "writer", "password": $W, "permissions": {"publish": {"allow": ['
        '"capibus.journal.*.*.*.*", "$JS.API.INFO", '
        + ", ".join(
            f'"$JS.API.STREAM.{verb}.{stream}"'
            for stream in access.STREAM_NAMES
            for verb in ("INFO", "CREATE", "UPDATE")
        )
        + ', "$JS.API.CONSUMER.CREATE.CAPIBUS_STATUS.writer-status-p0", '
        '"$JS.API.CONSUMER.CREATE.CAPIBUS_STATUS.writer-status-p0.>", '
        '"$JS.API.CONSUMER.DURABLE.CREATE.CAPIBUS_STATUS.writer-status-p0", '
        '"$JS.API.CONSUMER.INFO.CAPIBUS_STATUS.writer-status-p0", '
        '"$JS.API.CONSUMER.MSG.NEXT.CAPIBUS_STATUS.writer-status-p0", '
        '"$JS.ACK.CAPIBUS_STATUS.writer-status-p0.>", '
        '"$JS.API.CONSUMER.LIST.CAPIBUS_JOURNAL"]}, "subscribe": {"allow": '
        '["_INBOX.writer.>", "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>"]}}}',
    ]


def test_a_publisher_may_list_the_consumers_of_the_streams_it_publishes_to_only() -> None:
    # The guard at a stream's limit (shared.bus) needs where they are, nothing else.
    allowed = set(access.nats_publish(DECLARED["identity"], 1))
    listed = {a.rsplit(".", 1)[1] for a in allowed if a.startswith("$JS.API.CONSUMER.LIST.")}
    assert listed == {"CAPIBUS_STATUS", "CAPIBUS_LIFECYCLE", "CAPIBUS_DEADLETTER"}
    assert not any(
        a.startswith("$JS.API.CONSUMER.LIST.") for a in access.nats_publish(DECLARED["exporter"], 1)
    )


def test_redis_users_reach_their_own_keys_only() -> None:
    rules = dict(access.redis_users(list(DECLARED.values())))
    assert rules["writer"].startswith("resetkeys ~capibus:writer:* resetchannels -@all ")
    assert "+eval" in rules["writer"]
    assert "+flushall" not in rules["writer"]
    assert "watcher" not in rules
    assert "exporter" not in rules
    assert "~capibus:writer:*" in rules["all"]
    assert "~capibus:lease:*" in rules["all"]
    assert "~*" not in rules["all"]
    aclfile = access.redis_aclfile(list(DECLARED.values()), _passwords())
    assert aclfile.startswith("user default off\nuser admin on >pw-admin ~* &* +@all\n")


def test_credentials_come_from_the_users_directory(tmp_path: Path) -> None:
    (tmp_path / "writer").mkdir()
    (tmp_path / "writer" / "nats-password").write_text("secret\n")
    assert Credentials(dir=tmp_path).login("writer", "nats") == ("writer", "secret")
    assert Credentials(dir=tmp_path).login("unknown", "nats") is None
    assert Credentials().login("writer", "nats") is None
    with pytest.raises(ValueError, match="redis-password"):
        Credentials(dir=tmp_path).login("writer", "redis")
    shared_dir = Credentials(dir=tmp_path, user="writer")
    assert shared_dir.login("all", "nats") == ("writer", "secret")


def test_urls_take_the_login() -> None:
    login = ("writer", "p@ss/word")
    url = access.with_login("redis://admin:x@127.0.0.1:6379/0", login)
    assert url == "redis://writer:p%40ss%2Fword@127.0.0.1:6379/0"
    assert access.without_login(url) == "redis://127.0.0.1:6379/0"
    assert access.with_login("nats://127.0.0.1:4222", None) == "nats://127.0.0.1:4222"


def test_the_matrix_lists_every_user() -> None:
    doc = access.matrix(list(DECLARED.values()))
    for user in DECLARED:
        assert f"| `{user}` |" in doc


def _passwords() -> dict[str, str]:
    return {user: f"pw-{user}" for user in access.users(list(DECLARED.values()))}


def _allow(user: dict[str, object]) -> list[str]:
    permissions = json.loads(json.dumps(user["permissions"]))
    assert "deny" not in permissions["publish"] or user["user"] in ("watcher", "exporter")
    return list(permissions["publish"]["allow"])


def test_tls_is_chosen_by_the_url_and_trusts_the_named_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = certs.issue(tmp_path)
    security = TransportSecurity(nats_ca_file=files.ca)
    assert security.context("nats://a:4222,nats://b:4222") is None
    assert security.context("redis://a:6379/0") is None
    nats_tls = security.context("tls://a:4222,tls://b:4222")
    assert nats_tls is not None
    # only the named CA: the system's would let any public certificate through
    assert [c["subject"] for c in nats_tls.get_ca_certs()] == [
        ((("commonName", "capibus local CA"),),)
    ]
    redis_tls = security.context("rediss://a:6379/0")
    local = ((("commonName", "capibus local CA"),),)
    assert redis_tls is not None  # with the system's CAs, not the one named for NATS
    assert local not in [c["subject"] for c in redis_tls.get_ca_certs()]
    with pytest.raises(ValueError, match="nats TLS files"):
        TransportSecurity(nats_ca_file=tmp_path / "missing.pem").context("tls://a:4222")
    monkeypatch.setenv("CAPIBUS_TLS__REDIS_CA_FILE", str(files.ca))
    assert transport_security().redis_ca_file == files.ca


def test_a_failed_handshake_is_named_for_the_operator() -> None:
    wrong_port = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    wrong_port.reason = "WRONG_VERSION_NUMBER"
    assert access.tls_failure(wrong_port) == "the server does not speak TLS on this port"
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    assert access.tls_failure(untrusted) == "unable to get local issuer certificate"
    error = access.ServerNotTrusted(system="redis", server="r:6379", detail="x")
    assert isinstance(error, access.CredentialsRejected)  # so a service exits 78 on it
    assert str(error).startswith("redis at r:6379 is not trusted over TLS: x")
