"""SemVer precedence and AppTemplate version ranges (easysemver semantics)."""

from __future__ import annotations

import pytest

from services.catalog.versions import Range, Version


def v(text: str) -> Version:
    return Version.parse(text)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1.2.3", "1.2.4"),
        ("1.2.3", "2.0.0"),
        ("1.9.0", "1.10.0"),
        ("1.2.3", "1.2.4-alpha.0"),
        ("1.2.3-alpha.0", "1.2.3"),
        ("1.2.3-alpha.0", "1.2.3-alpha.100"),
        ("1.2.3-alpha.9", "1.2.3-alpha.10"),
        ("1.2.3-alpha.0", "1.2.3-beta.0"),
        ("1.2.3-1", "1.2.3-alpha"),
        ("1.2.3-alpha", "1.2.3-alpha.1"),
        ("1.0.0-rc.1", "v1.0.0"),
    ],
)
def test_precedence(lower: str, higher: str) -> None:
    assert v(lower) < v(higher)
    assert v(higher) > v(lower)


def test_build_metadata_is_ignored_but_the_text_is_kept() -> None:
    assert v("1.2.3") == v("1.2.3+abcdefg")
    assert v("v1.2.3").text == "v1.2.3"
    assert v("1.2.3+abc").release == (1, 2, 3)


@pytest.mark.parametrize("text", ["20230809-1", "1.2", "1.2.3.4", "latest", "1.2.3-", "a.b.c"])
def test_not_semver(text: str) -> None:
    with pytest.raises(ValueError, match="not a SemVer version"):
        Version.parse(text)
    assert Version.parse_or_none(text) is None
    assert Version.parse_or_none(3) is None


@pytest.mark.parametrize(
    ("version_range", "version", "inside"),
    [
        (">=1.0.0,<2.0.0", "1.2.3", True),
        (">=2.0.0", "1.2.3", False),
        (">1.2.3", "1.2.3", False),
        ("<=1.2.3", "1.2.3", True),
        ("==1.2.3", "1.2.3+build.1", True),
        ("==1.2.3", "1.2.4", False),
        (">=1.0.0,<2.0.0,!=1.2.3", "1.2.3", False),
        (">=1.0.0,<2.0.0,!=1.2.3", "1.2.4", True),
        (">=0.0.0", "0.0.0", True),
        # Prereleases need a lower bound with a prerelease part.
        (">=1.0.0", "1.2.3-alpha.0", False),
        (">=1.0.0-0", "1.2.3-alpha.0", True),
        (">=0.0.0-0", "0.1.0-rc.1", True),
        ("<2.0.0", "1.0.0-rc.1", False),
        ("<2.0.0", "1.9.9", True),
        ("<2.0.0,!=1.0.0-rc.1", "1.0.0-rc.2", False),
        (">=1.0.0-0,<1.0.0", "1.0.0-rc.2", True),
        ("==1.0.0-rc.1", "1.0.0-rc.1", True),
        ("==1.0.0-rc.1", "1.0.0-rc.2", False),
        # Admitted prereleases compare by plain precedence: 2.0.0-alpha sorts below 2.0.0.
        (">=1.0.0-0,<2.0.0", "2.0.0-alpha", True),
        (">=1.0.0-0,<2.0.0-0", "2.0.0-alpha", False),
    ],
)
def test_range(version_range: str, version: str, inside: bool) -> None:
    assert (v(version) in Range.parse(version_range)) is inside


@pytest.mark.parametrize("text", ["", ">=1.0", "~1.2.3", "1.2.3", ">=1.0.0,", ">=1.0.0,,<2.0.0"])
def test_invalid_range(text: str) -> None:
    with pytest.raises(ValueError, match="not"):
        Range.parse(text)
