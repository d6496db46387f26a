"""SemVer versions and AppTemplate version ranges, with upstream's (easysemver's) semantics.

A range is comma-separated constraints, each an operator (``==``, ``!=``, ``>``, ``>=``,
``<``, ``<=``) followed by a SemVer version (an optional leading ``v`` is accepted, as the CRD
pattern does); a version is in the range when it satisfies every constraint.

Precedence is SemVer 2.0 section 11: major, minor and patch compare numerically; a prerelease
sorts before its release; prerelease identifiers compare one by one, numeric ones as numbers
and below alphanumeric ones, and a shorter list of equal identifiers sorts first; build
metadata is ignored, so ``==1.2.3`` matches ``1.2.3+build.5``.

Prereleases (easysemver, as the Azimuth docs describe it): a prerelease version is part of a
range only if the range's *lower bound* has a prerelease part; a range without a lower bound
has the implicit lower bound ``>=0.0.0``. So ``>=0.0.0`` and ``<2.0.0`` mean stable versions
only, and ``>=0.0.0-0`` means everything. Where upstream's wording leaves room, the choice
made here is: the lower bounds are the ``>``, ``>=`` and ``==`` constraints (``==`` pins from
both sides), and any one of them with a prerelease part admits prereleases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering

_VERSION = re.compile(
    r"^v?(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)
_CONSTRAINT = re.compile(r"^(?P<op>==|!=|>=|<=|>|<)\s*(?P<version>\S+)$")
_LOWER_BOUNDS = frozenset({">", ">=", "=="})

Identifier = tuple[int, int | str]


@total_ordering
@dataclass(frozen=True)
class Version:
    """One SemVer version; ``text`` is kept exactly as written (it names the chart version)."""

    text: str
    release: tuple[int, int, int] = field(compare=False)
    prerelease: tuple[str, ...] = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a SemVer version")
        release = (int(match["major"]), int(match["minor"]), int(match["patch"]))
        prerelease = tuple(match["pre"].split(".")) if match["pre"] else ()
        return cls(text=text, release=release, prerelease=prerelease)

    @classmethod
    def parse_or_none(cls, text: object) -> Version | None:
        if not isinstance(text, str):
            return None
        try:
            return cls.parse(text)
        except ValueError:
            return None

    @property
    def is_prerelease(self) -> bool:
        return bool(self.prerelease)

    @property
    def key(self) -> tuple[tuple[int, int, int], int, tuple[Identifier, ...]]:
        # A release (1) sorts after all of its prereleases (0).
        identifiers = tuple(_identifier(part) for part in self.prerelease)
        return (self.release, 0 if self.prerelease else 1, identifiers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: Version) -> bool:
        return self.key < other.key

    def __str__(self) -> str:
        return self.text


def _identifier(part: str) -> Identifier:
    # Numeric identifiers have lower precedence than alphanumeric ones.
    return (0, int(part)) if part.isdigit() else (1, part)


@dataclass(frozen=True)
class Constraint:
    operator: str
    version: Version

    def __call__(self, version: Version) -> bool:
        op, bound = self.operator, self.version
        if op == "==":
            return version == bound
        if op == "!=":
            return version != bound
        if op == ">":
            return version > bound
        if op == ">=":
            return version >= bound
        if op == "<":
            return version < bound
        return version <= bound


@dataclass(frozen=True)
class Range:
    constraints: tuple[Constraint, ...]

    @classmethod
    def parse(cls, text: str) -> Range:
        """``ValueError`` naming the bad constraint when ``text`` is not a valid range."""
        constraints = []
        for part in text.split(","):
            match = _CONSTRAINT.match(part.strip())
            if match is None:
                raise ValueError(f"{part.strip()!r} is not a version constraint")
            constraints.append(Constraint(match["op"], Version.parse(match["version"])))
        return cls(tuple(constraints))

    @property
    def admits_prereleases(self) -> bool:
        return any(c.version.is_prerelease for c in self.constraints if c.operator in _LOWER_BOUNDS)

    def __contains__(self, version: Version) -> bool:
        # Without a lower bound the implicit ``>=0.0.0`` admits every release and no
        # prerelease, which is exactly what this test does.
        if version.is_prerelease and not self.admits_prereleases:
            return False
        return all(constraint(version) for constraint in self.constraints)
