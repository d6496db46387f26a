"""The pinned kubectl: required of the build, and shown as a line a shell can run as printed.

``python -m testenv up`` is documented as ``eval``-able: its kubectl hint must not break that.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

import testenv.__main__ as cli
from testenv import harness
from testenv.harness import GO_BINARIES, StackError, ensure_binaries, kubectl_line

# Spaces and a quote: what a careless f-string would split or end early on.
AWKWARD = "dir with 'space"


def _fake_kubectl(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text('#!/bin/sh\nprintf "%s|" "$KUBECONFIG" "$@"\n')
    kubectl.chmod(0o755)


def _bash(script: str, *args: str) -> str:
    argv = ["bash", "-c", script, "bash", *args]
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_kubectl_line_runs_the_pinned_kubectl_on_the_stack(tmp_path: Path) -> None:
    bin_dir, kubeconfig = tmp_path / AWKWARD / "bin", tmp_path / AWKWARD / "kubeconfig"
    _fake_kubectl(bin_dir)
    line = kubectl_line(bin_dir, kubeconfig, "get", "clusters.azimuth.stackhpc.com", "-A")
    assert _bash(line) == f"{kubeconfig}|get|clusters.azimuth.stackhpc.com|-A|"


def test_a_build_without_kubectl_is_a_failed_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in GO_BINARIES:
        if name != "kubectl":
            (bin_dir / name).touch()
    script = tmp_path / "build.sh"
    script.write_text(f"echo {bin_dir}\n")
    monkeypatch.setattr(harness, "BUILD_SCRIPT", script)
    with pytest.raises(StackError, match="left no kubectl"):
        ensure_binaries()
    (bin_dir / "kubectl").touch()
    assert ensure_binaries() == bin_dir


def _stack(root: Path, **kwargs: object) -> contextlib.nullcontext[SimpleNamespace]:
    """Stands for ``LocalStack``: ``_up`` only reads its variables, its kubeconfig and where
    the bus users' passwords are."""
    kubeconfig = str(root / "kubeconfig")
    return contextlib.nullcontext(
        SimpleNamespace(
            endpoints=SimpleNamespace(kubeconfig=root / "kubeconfig"),
            env=lambda: {"KUBECONFIG": kubeconfig, "NATS_URL": "nats://127.0.0.1:1"},
            credentials_dir=root / "credentials",
        )
    )


class _CtrlC:
    """Stands for ``threading.Event`` in ``_up``: its wait for Ctrl-C ends at once."""

    def wait(self) -> bool:
        raise KeyboardInterrupt


def test_up_output_stays_evaluable_and_its_kubectl_line_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir, workdir = tmp_path / "bin", tmp_path / AWKWARD
    _fake_kubectl(bin_dir)
    monkeypatch.setattr(cli, "ensure_binaries", lambda: bin_dir)
    monkeypatch.setattr(cli, "LocalStack", _stack)
    monkeypatch.setattr(cli, "threading", SimpleNamespace(Event=_CtrlC))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.main(["up", "--workdir", str(workdir)]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = capsys.readouterr().out
    hint = next(line for line in out.splitlines() if line.startswith("# kubectl: "))
    assert _bash('eval "$1"; printf "%s" "$KUBECONFIG"', out) == str(workdir / "kubeconfig")
    assert _bash(hint.removeprefix("# kubectl: ")) == f"{workdir / 'kubeconfig'}|get|namespaces|"
