"""Finding credentials in bytes that must never hold any: bus messages and service log lines.

Principle 7 (``docs/security.md``): no private key, token or credential travels on the bus
or reaches a log line. The integration tests check it after the fact on everything a test
session left behind (``tests/integration/leakscan.py``); this module is the pure part, which
knows what a credential looks like and nothing of NATS, pytest or files it is not handed.

Two kinds of evidence:

* **Shapes** (``PATTERNS``): a PEM private key, also base64-encoded as in a kubeconfig's
  ``client-key-data``; a JSON web token (service-account tokens are JWTs); a bearer token
  after ``Bearer``; the value of a kubeconfig ``token`` field, an OpenStack
  ``application_credential_secret`` or a ``password``. They catch credentials nobody told
  the scanner about.
* **Known values** (``Scanner.register``): the stack's admin token and every value of every
  Secret the session created. A value is also looked for in base64 (how a Secret stores it),
  and a structured value (a ``clouds.yaml``, a kubeconfig) is also looked for leaf by leaf
  under the keys that hold credentials, since a leak rarely copies the whole file.

Known values shorter than ``MIN_KNOWN_LENGTH`` are not registered: an eight-character value
("default", a namespace) appears legitimately everywhere. Public material (certificates,
CA bundles, public keys) is never registered.

A ``Finding`` says where (a stream, subject and sequence, or a log file and line) and what,
and shows at most the first four characters of what it found: the scanner's own report must
not become the leak.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: shorter known values are not looked for (they occur legitimately in names and words)
MIN_KNOWN_LENGTH = 12
#: how many characters of a found secret a report shows
SHOWN = 4

#: keys of a structured secret (YAML/JSON) whose string values are credentials
CREDENTIAL_KEY = re.compile(r"secret|password|passwd|token|private|key-data|apikey|api_key", re.I)
#: Secret data keys that hold public material or plain names, never registered (``format``:
#: a Cluster API bootstrap data Secret's ``cloud-config`` or ``ignition``, which every
#: provider's log names)
PUBLIC_KEY_NAME = re.compile(
    r"(^|[._-])(ca|crt|cert|certificate|pub|namespace|username|user|known_hosts|format)($|[._-])"
    r"|\.(crt|pem\.pub|pub)$",
    re.I,
)
#: Secret types whose data is not a credential (Helm's release records: chart and values)
UNSCANNED_TYPES = frozenset({"helm.sh/release.v1"})


@dataclass(frozen=True)
class Pattern:
    what: str
    regex: re.Pattern[bytes]


_B64 = rb"[A-Za-z0-9+/]"
_TOKEN = rb"[A-Za-z0-9._~+/=-]"
PATTERNS = (
    Pattern("a PEM private key", re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
    # base64 of "-----BEGIN": a PEM block inside a kubeconfig or a Secret's data
    Pattern("a base64 PEM private key", re.compile(rb"LS0tLS1CRUdJTi" + _B64 + rb"{40,}")),
    Pattern(
        "a JSON web token",
        re.compile(rb"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{20,}"),
    ),
    Pattern("a bearer token", re.compile(rb"[Bb]earer\s+" + _TOKEN + rb"{16,}")),
    Pattern(
        "a kubeconfig client key",
        re.compile(rb"client-key-data[\"']?\s*:\s*[\"']?" + _B64 + rb"{16,}"),
    ),
    Pattern(
        "a kubeconfig token",
        re.compile(rb"(?:^|[\s{,\"'])token[\"']?\s*:\s*[\"']?" + _TOKEN + rb"{16,}", re.M),
    ),
    Pattern(
        "an OpenStack application credential secret",
        re.compile(rb"application_credential_secret[\"']?\s*[:=]\s*[\"']?[^\s\"',{}\[\]\\]+"),
    ),
    Pattern(
        "a password",
        re.compile(
            rb"(?:[Pp]assword|PASSWORD|passwd)[\"']?\s*[:=]\s*[\"']?"
            # masked values: "****" and pydantic's SecretStr('**********')
            rb"(?!\*+[\"'\s,}]|\*+$|SecretStr\()"
            rb"[^\s\"',{}\[\]<>\\]{4,}"
        ),
    ),
)


@dataclass(frozen=True)
class Finding:
    """One credential found: where, what kind, and a masked prefix of it."""

    where: str
    what: str
    shown: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what} ({self.shown})"


def mask(value: bytes) -> str:
    """The first ``SHOWN`` characters and the length: enough to recognise, not to use."""
    head = value[:SHOWN].decode("utf-8", errors="replace")
    return f"{head}… {len(value)} bytes"


class Scanner:
    """Shapes plus the known values registered so far; safe to register from any thread."""

    def __init__(self) -> None:
        self._known: dict[bytes, str] = {}
        self._lock = threading.Lock()

    @property
    def known(self) -> int:
        return len(self._known)

    def register(self, value: str | bytes, what: str) -> None:
        """Look for ``value`` (and its base64, and its credential leaves) from now on."""
        raw = value.encode() if isinstance(value, str) else value
        with self._lock:
            for needle, label in _needles(raw, what):
                if len(needle) >= MIN_KNOWN_LENGTH:
                    self._known.setdefault(needle, label)

    def register_secret(self, secret: Mapping[str, Any]) -> None:
        """Every credential in a Kubernetes Secret object (its ``data``, base64 as stored)."""
        if secret.get("type") in UNSCANNED_TYPES:
            return
        meta = secret.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        for key, encoded in (secret.get("data") or {}).items():
            if PUBLIC_KEY_NAME.search(key) or not isinstance(encoded, str):
                continue
            try:
                value = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                continue
            if not _public(value):
                self.register(value, f"Secret {name} key {key}")

    def scan(self, data: bytes, where: str) -> list[Finding]:
        """Every credential in ``data``; ``where`` names it in the findings."""
        found = [
            Finding(where, pattern.what, mask(match.group()))
            for pattern in PATTERNS
            for match in pattern.regex.finditer(data)
            if _confirmed(pattern, match.group())
        ]
        with self._lock:
            known = list(self._known.items())
        found += [Finding(where, what, mask(value)) for value, what in known if value in data]
        return found

    def scan_many(self, items: Iterable[tuple[str, bytes]], chunk: int = 4 << 20) -> list[Finding]:
        """``scan`` of each (where, data), fast when nearly all are clean: a chunk of many is
        searched at once, and only a chunk with a hit is searched item by item."""
        findings: list[Finding] = []
        for batch in _batches(items, chunk):
            joined = b"\n\x00\n".join(data for _, data in batch)
            if self.scan(joined, ""):
                findings += [f for where, data in batch for f in self.scan(data, where)]
        return findings

    def scan_lines(self, text: bytes, name: str) -> list[Finding]:
        """``scan`` of a log, each finding named ``<name>:<line>``."""
        if not self.scan(text, name):
            return []
        return [
            finding
            for number, line in enumerate(text.splitlines(), start=1)
            for finding in self.scan(line, f"{name}:{number}")
        ]

    def scan_file(self, path: Path) -> list[Finding]:
        return self.scan_lines(path.read_bytes(), str(path)) if path.exists() else []


def _batches(items: Iterable[tuple[str, bytes]], limit: int) -> Iterator[list[tuple[str, bytes]]]:
    batch: list[tuple[str, bytes]] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item[1])
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _confirmed(pattern: Pattern, matched: bytes) -> bool:
    """A base64 run that starts like a PEM block is a private key only if it says so."""
    if pattern.what != "a base64 PEM private key":
        return True
    head = matched[: len(matched) // 4 * 4][:64]
    try:
        return b"PRIVATE KEY" in base64.b64decode(head)
    except (binascii.Error, ValueError):
        return False


def _public(value: bytes) -> bool:
    """Certificates and public keys: PEM blocks none of which is a private key."""
    return value.lstrip().startswith(b"-----BEGIN") and b"PRIVATE KEY" not in value


def _needles(raw: bytes, what: str) -> Iterator[tuple[bytes, str]]:
    """``raw`` itself, as a JSON string or a log line's repr writes it (newlines as ``\\n``),
    its base64, and the credential leaves of a structured value."""
    yield raw, what
    text = raw.decode("utf-8", errors="replace")
    yield json.dumps(text, ensure_ascii=False)[1:-1].encode(), f"{what}, escaped"
    yield base64.b64encode(raw), f"{what}, base64"
    for key, leaf in _leaves(raw):
        yield leaf.encode(), f"{what}, its {key}"
        yield base64.b64encode(leaf.encode()), f"{what}, its {key} in base64"


def _leaves(raw: bytes) -> Iterator[tuple[str, str]]:
    """(key, value) of every string under a credential-like key of a YAML or JSON document;
    nothing for anything else. A kubeconfig's ``client-key-data`` is also decoded."""
    if b"\n" not in raw and b"{" not in raw:
        return
    try:
        document = yaml.safe_load(raw)
    except yaml.YAMLError:
        return
    for key, value in _walk(document):
        if CREDENTIAL_KEY.search(key):
            yield key, value
            decoded = _decoded(value) if key.endswith("-data") else None
            if decoded:
                yield key, decoded


def _decoded(value: str) -> str | None:
    """A kubeconfig ``*-data`` value as text (a PEM block); None if it is not base64 text."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, ValueError):
        return None


def _walk(node: Any) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str):
                yield str(key), value
            else:
                yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)
