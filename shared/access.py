"""Least privilege on the bus and in Redis: what each service may do there, in one place.

Kubernetes permissions are declared per service (``services/<svc>/rbac.py``, ``shared.rbac``);
this module is the same for NATS and Redis. Each service declares an ``Access`` in
``services/<svc>/access.py``: the subjects it publishes, the subscriptions it consumes (taken
from its own ``Routes`` table, so a new subscription flows in), the streams it reads with
ephemeral consumers or last-message lookups, and whether it holds partition leases in Redis.
``python -m services access`` renders every declaration into the nats-server
``authorization`` block, Redis ACL rules and the matrix in ``docs/permissions.md``; the local
stack (``testenv.harness``) runs both servers with exactly that authorization.

Design decisions:

* **A NATS user per service, named as the service is on the bus** (``writer``,
  ``assistedbootstrap``): that name already prefixes its durable consumers
  (``<service>-<subscription>-p<n>``), its dead letters (``capibus.dlq.<service>.>``) and its
  lease keys (``capibus:<service>:*``), so the grants follow from it.
* **Durable consumers are granted by name.** NATS wildcards match whole tokens and a consumer
  name is one token, so ``writer-*`` cannot be said: the allow list names every durable of
  every partition (``partitions`` is part of the rendering, like the subject layout). Creating,
  reading the info of, pulling from and acknowledging on another service's consumer are then
  refused.
* **Ephemeral consumers are granted per stream.** ``Bus.follow`` and ``last_per_subject`` let
  the client library name their consumer at random, so a service that reads a stream that way
  (the watcher and the exporter, EVENTS only) may create, pull from and delete consumers *of
  that stream*, except that a deny list names every other service's durable on it (a deny
  wins over an allow in nats-server), so those stay out of reach.
* **Replies come to a per-user inbox** (``_INBOX.<user>.>``, nats-py's ``inbox_prefix``), so a
  service may subscribe to nothing else: pull consumers deliver to the inbox, and one service
  cannot read another's replies.
* **Leader advisories** (``$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>``) may be read by
  every service (``shared.bus`` asks its long polls again after a leader change): they name
  consumers and carry no message.
* **Every service declares the streams at start** (``Bus.ensure_streams``, idempotent), so each
  may read, create and update the five capibus streams (never delete or purge them).
* **The operator** (``admin``: the ``capibus`` CLI, tests, bench, soak) may do everything; the
  all-in-one process (``all``) is the union of the services it can run.
* **Redis**: a user per leasing service limited to ``capibus:<service>:*`` and the commands
  ``shared.coordination`` sends (ACLs also apply to the commands a script calls: ``GET``,
  ``SET``, ``INCR``, ``PEXPIRE``). The default user is switched off.

Credentials are files (``ServiceSettings.credentials``): ``<dir>/<user>/nats-password`` and
``<dir>/<user>/redis-password``, so a Kubernetes Secret mounts as they are and rotating a
password is a file swap plus a restart (``docs/security.md``).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from shared import subjects

if TYPE_CHECKING:
    from shared.wiring import Routes

#: the operator's user: everything on the bus and in Redis
ADMIN = "admin"
#: the all-in-one process's user (``services.allinone.PROCESS``)
ALL_IN_ONE = "all"
#: exit status of a process whose credentials a server refused (sysexits ``EX_CONFIG``):
#: distinct from a crash, and restarting does not help until the Secret changes
EXIT_CREDENTIALS = 78

JS_API = "$JS.API"
STREAM_NAMES = tuple(spec.name for spec in subjects.ALL_STREAMS)
#: the commands ``shared.coordination`` sends, and those its scripts call
LEASE_COMMANDS = (
    "auth hello ping select",
    "eval multi exec discard",
    "zadd zremrangebyscore zrange zrem",
    "get set incr pexpire",
)


class CredentialsRejected(Exception):
    """A server refused this process's user or password: a configuration error, not an
    outage; retrying cannot help until the credentials change."""

    def __init__(self, *, system: str, user: str | None, server: str, detail: str) -> None:
        self.system, self.user, self.server = system, user, server
        super().__init__(
            f"{system} at {server} refused user {user or '(default)'!r}: {detail} "
            "(check the password file or Secret of this user)"
        )


class ServerNotTrusted(CredentialsRejected):
    """A server this process was told to reach over TLS failed the check (a certificate
    from an untrusted CA or for another name, or no TLS at all): a configuration error too."""

    def __init__(self, *, system: str, server: str, detail: str) -> None:
        self.system, self.user, self.server = system, None, server
        Exception.__init__(
            self,
            f"{system} at {server} is not trusted over TLS: {detail} "
            "(check the URL's scheme and the CA file the settings name)",
        )


# A handshake the peer cut short (a server restarting) says nothing about trust.
TRANSIENT_TLS_ERRORS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def tls_failure(exc: ssl.SSLError) -> str:
    """What a failed handshake means, in words an operator can act on."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    if exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return "the server does not speak TLS on this port"
    return exc.reason or str(exc)


@dataclass(frozen=True)
class Consumed:
    """One subscription of a service: its stream and its durable-name stem."""

    stream: str
    subscription: str


@dataclass(frozen=True)
class Access:
    """What one service may do on the bus and in Redis."""

    user: str
    publish: tuple[str, ...] = ()
    consumes: tuple[Consumed, ...] = ()
    #: streams read with ephemeral consumers (``Bus.follow``, ``Bus.last_per_subject``)
    follows: tuple[str, ...] = ()
    #: streams read by ``Bus.last_message``
    reads_last: tuple[str, ...] = ()
    #: holds partition leases in Redis under ``capibus:<user>:*``
    leases: bool = False

    @classmethod
    def of(
        cls,
        routes: Routes[Any] | None = None,
        *,
        user: str | None = None,
        publish: Iterable[str] = (),
        follows: Iterable[str] = (),
        reads_last: Iterable[str] = (),
    ) -> Access:
        """A service's access: its subscriptions from ``routes`` (and, with them, its dead
        letters and leases), plus what it publishes and reads besides."""
        name = user or (routes.service if routes else "")
        if not name:
            raise ValueError("an Access needs a user or a Routes table")
        consumes = tuple(
            Consumed(route.stream.name, route.name) for route in (routes.routes if routes else ())
        )
        dead = (subjects.dead_letter(name, ">"),) if consumes else ()
        return cls(
            user=name,
            publish=tuple(dict.fromkeys([*publish, *dead])),
            consumes=consumes,
            follows=tuple(follows),
            reads_last=tuple(reads_last),
            leases=bool(consumes),
        )


def inbox(user: str) -> str:
    """The inbox prefix a user's connection uses (nats-py ``inbox_prefix``)."""
    return f"_INBOX.{user}"


def durable_names(access: Access, partitions: int) -> list[tuple[str, str]]:
    """(stream, durable) of every partition consumer ``access`` may use."""
    return [
        (c.stream, f"{access.user}-{c.subscription}-p{p}")
        for c in access.consumes
        for p in range(partitions)
    ]


def nats_publish(access: Access, partitions: int) -> list[str]:
    """The publish allow list: data subjects, then the JetStream API it needs."""
    api = [f"{JS_API}.INFO"]
    for stream in STREAM_NAMES:
        api += [f"{JS_API}.STREAM.{verb}.{stream}" for verb in ("INFO", "CREATE", "UPDATE")]
    for stream, durable in durable_names(access, partitions):
        api += _durable_api(stream, durable)
    for stream in access.follows:
        api += [
            f"{JS_API}.CONSUMER.CREATE.{stream}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.*",
            f"{JS_API}.CONSUMER.CREATE.{stream}.*.>",
            *(f"{JS_API}.CONSUMER.{verb}.{stream}.*" for verb in ("INFO", "DELETE")),
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*",
        ]
    for stream in access.reads_last:
        api += [f"{JS_API}.STREAM.MSG.GET.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>"]
    # The publisher's guard at a stream's limit (``shared.bus``) reads where the stream's
    # consumers are: their names and positions, never their messages.
    api += [f"{JS_API}.CONSUMER.LIST.{stream}" for stream in published_streams(access)]
    return list(dict.fromkeys([*access.publish, *api]))


def published_streams(access: Access) -> list[str]:
    """The streams that store what ``access`` publishes (each capibus stream is ``<p>.>``)."""
    return [
        spec.name
        for spec in subjects.ALL_STREAMS
        if any(s.startswith(p.removesuffix(">")) for p in spec.subjects for s in access.publish)
    ]


#: what ``shared.bus`` listens to so long polls survive a JetStream leader change; it names
#: consumers, never carries messages, and a subscription to a wildcard must be allowed whole
LEADER_ADVISORIES = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.>"


def nats_deny(access: Access, accesses: Sequence[Access], partitions: int) -> list[str]:
    """The publish deny list: other services' durables on a stream ``access`` reads with
    ephemeral consumers (whose allow list cannot name the consumers)."""
    deny: list[str] = []
    for other in accesses:
        if other.user == access.user:
            continue
        for stream, durable in durable_names(other, partitions):
            if stream in access.follows:
                deny += _durable_api(stream, durable)
                deny.append(f"{JS_API}.CONSUMER.DELETE.{stream}.{durable}")
    return deny


def _durable_api(stream: str, durable: str) -> list[str]:
    return [
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def nats_subscribe(access: Access) -> list[str]:
    return [f"{inbox(access.user)}.>", LEADER_ADVISORIES]


def union(user: str, accesses: Sequence[Access]) -> Access:
    """One user allowed everything each of ``accesses`` is (the all-in-one process)."""

    def merged(values: Iterable[Iterable[str]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v for value in values for v in value))

    return Access(
        user=user,
        publish=merged(a.publish for a in accesses),
        follows=merged(a.follows for a in accesses),
        reads_last=merged(a.reads_last for a in accesses),
        leases=any(a.leases for a in accesses),
    )


def union_grants(accesses: Sequence[Access], partitions: int) -> tuple[list[str], list[str]]:
    """Publish and subscribe allow lists of the all-in-one user: every service's, with its
    own inbox (durables keep each service's name, ``services.allinone``)."""
    publish = [s for a in accesses for s in nats_publish(a, partitions)]
    return list(dict.fromkeys(publish)), [f"{inbox(ALL_IN_ONE)}.>", LEADER_ADVISORIES]


def nats_users(
    accesses: Sequence[Access], partitions: int, password: Mapping[str, str]
) -> list[dict[str, object]]:
    """The ``users`` of a nats-server ``authorization`` block: the operator, every service
    and the all-in-one union. ``password`` maps a user to its password (or to a ``$VAR``
    reference the server resolves from its environment)."""
    users: list[dict[str, object]] = [{"user": ADMIN, "password": password[ADMIN]}]
    for access in accesses:
        publish = {"allow": nats_publish(access, partitions)}
        deny = nats_deny(access, accesses, partitions)
        users.append(
            _nats_user(
                access.user,
                password[access.user],
                {**publish, **({"deny": deny} if deny else {})},
                nats_subscribe(access),
            )
        )
    allow, subscribe = union_grants(accesses, partitions)
    users.append(_nats_user(ALL_IN_ONE, password[ALL_IN_ONE], {"allow": allow}, subscribe))
    return users


def _nats_user(
    user: str, password: str, publish: dict[str, list[str]], subscribe: list[str]
) -> dict[str, object]:
    return {
        "user": user,
        "password": password,
        "permissions": {"publish": publish, "subscribe": {"allow": subscribe}},
    }


def render_nats(users: list[dict[str, object]]) -> str:
    """A nats-server configuration fragment (JSON is valid nats-server syntax); a password
    starting with ``$`` is left bare so the server reads it from its environment."""
    lines = ["authorization {", "  users = ["]
    for user in users:
        body = json.dumps(user)
        password = str(user["password"])
        if password.startswith("$"):
            body = body.replace(json.dumps(password), password, 1)
        lines.append(f"    {body}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def users(accesses: Sequence[Access]) -> list[str]:
    """Every user name the rendering needs a password for."""
    return [ADMIN, *(a.user for a in accesses), ALL_IN_ONE]


def redis_rules(access: Access) -> str:
    """``ACL SETUSER <user>`` rules (without the password) for a service's leases."""
    commands = " ".join(f"+{c}" for group in LEASE_COMMANDS for c in group.split())
    return f"resetkeys ~capibus:{access.user}:* resetchannels -@all {commands}"


def redis_users(accesses: Sequence[Access]) -> list[tuple[str, str]]:
    """(user, rules) of every Redis user: the operator, each leasing service, all-in-one."""
    leasing = [a for a in accesses if a.leases]
    rules = [(ADMIN, "~* &* +@all")]
    rules += [(a.user, redis_rules(a)) for a in leasing]
    keys = " ".join(f"~capibus:{a.user}:*" for a in leasing)
    everything = redis_rules(union(ALL_IN_ONE, leasing)).replace(f"~capibus:{ALL_IN_ONE}:*", keys)
    return [*rules, (ALL_IN_ONE, everything)]


def redis_aclfile(accesses: Sequence[Access], password: Mapping[str, str]) -> str:
    """A Redis ``aclfile``: every user with its password, the default user off."""
    lines = ["user default off"]
    lines += [f"user {user} on >{password[user]} {rules}" for user, rules in redis_users(accesses)]
    return "\n".join(lines) + "\n"


def env_password(user: str) -> str:
    """The environment variable a server reads ``user``'s password from (chart rendering)."""
    return "$CAPIBUS_NATS_PASSWORD_" + user.upper().replace("-", "_")


def matrix(accesses: Sequence[Access]) -> str:
    """A Markdown table of who publishes, consumes and reads what (``docs/permissions.md``)."""
    lines = [
        "| User | Publishes | Consumes (durable per partition) | Reads | Redis keys |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a in accesses:
        consumes = ", ".join(f"`{c.stream}` `{a.user}-{c.subscription}-p<n>`" for c in a.consumes)
        reads = [f"`{s}` (ephemeral consumers)" for s in a.follows]
        reads += [f"`{s}` (last message)" for s in a.reads_last]
        keys = f"`capibus:{a.user}:*`" if a.leases else ""
        publish = ", ".join(f"`{s}`" for s in a.publish)
        lines.append(f"| `{a.user}` | {publish} | {consumes} | {', '.join(reads)} | {keys} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str], accesses: Sequence[Access], workloads: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services access",
        description="Print, write or check every service's NATS and Redis permissions.",
    )
    parser.add_argument("--partitions", type=int, default=16, help="as the services are set")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--nats", action="store_true", help="the nats-server authorization block")
    shown.add_argument("--redis", action="store_true", help="the Redis ACL rules")
    shown.add_argument("--write", type=Path, metavar="FILE", help="write the chart's file")
    shown.add_argument("--check", type=Path, metavar="FILE", help="fail if FILE is stale")
    parser.add_argument("--doc", type=Path, metavar="FILE", help="the permissions page too")
    args = parser.parse_args(argv)
    if args.nats:
        refs = {user: env_password(user) for user in users(accesses)}
        sys.stdout.write(render_nats(nats_users(accesses, args.partitions, refs)))
    elif args.redis:
        for user, rules in redis_users(accesses):
            sys.stdout.write(f"ACL SETUSER {user} on <password> {rules}\n")
    elif args.write or args.check:
        return _write_or_check(
            args.write or args.check, args.doc, bool(args.write), accesses, workloads
        )
    else:
        sys.stdout.write(matrix(accesses))
    return 0


def _write_or_check(
    path: Path,
    doc: Path | None,
    write: bool,
    accesses: Sequence[Access],
    workloads: Mapping[str, str],
) -> int:
    expected = {path: chart_file(accesses, workloads)}
    if doc is not None:
        expected[doc] = replace_doc(doc.read_text(), doc_section(accesses))
    stale = [p for p, text in expected.items() if not p.exists() or p.read_text() != text]
    if write:
        for p in stale:
            p.write_text(expected[p])
            print(f"wrote {p}")
        return 0
    for p in stale:
        print(f"{p} is out of date: {REGENERATE_HINT}", file=sys.stderr)
    return 1 if stale else 0


def with_login(url: str, login: tuple[str, str] | None) -> str:
    """``url`` with ``user:password@`` set to ``login`` (unchanged without one)."""
    if login is None:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    user, password = (quote(value, safe="") for value in login)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def without_login(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


# -- the chart's copy and the docs ------------------------------------------------------------

REGENERATE_HINT = "run `make rbac` and commit the result"
DOC_BEGIN = (
    "<!-- BEGIN GENERATED: make rbac (python -m services access --doc); do not edit below -->"
)
DOC_END = "<!-- END GENERATED: access -->"


def chart_file(accesses: Sequence[Access], workloads: Mapping[str, str]) -> str:
    """What the chart renders the servers' authorization from (``files/access.json``):
    per user, the allow lists without durables, the durable stems the chart multiplies by
    ``partitions`` (and, for readers of a stream by ephemeral consumers, other services'
    stems to deny), and its Redis rules; ``workloads`` maps a chart service to its user."""
    users: dict[str, object] = {}
    for a in [*accesses, union(ALL_IN_ONE, accesses)]:
        stems = accesses if a.user == ALL_IN_ONE else [a]
        users[a.user] = {
            "publish": nats_publish(a, 0),
            "durables": [
                [c.stream, f"{s.user}-{c.subscription}"] for s in stems for c in s.consumes
            ],
            "deny": [
                [c.stream, f"{other.user}-{c.subscription}"]
                for other in accesses
                if a.user not in (other.user, ALL_IN_ONE)
                for c in other.consumes
                if c.stream in a.follows
            ],
            "subscribe": nats_subscribe(a),
            "redis": dict(redis_users(accesses)).get(a.user, ""),
        }
    document = {"admin": ADMIN, "workloads": dict(workloads), "users": users}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def doc_section(accesses: Sequence[Access]) -> str:
    return "\n".join([DOC_BEGIN, "", matrix(accesses), DOC_END])


def replace_doc(text: str, section: str) -> str:
    """``text`` with its generated access section replaced (appended when missing)."""
    if DOC_BEGIN in text:
        before, rest = text.split(DOC_BEGIN, 1)
        after = rest.split(DOC_END, 1)[1]
        return before + section + after
    return text.rstrip("\n") + "\n\n## NATS and Redis\n\n" + section + "\n"
