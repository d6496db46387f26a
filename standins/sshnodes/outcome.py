"""What a command answers: exit status, stdout, stderr (as bash and the real tools print)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    status: int = 0
    stdout: str = ""
    stderr: str = ""


def ok(stdout: str = "") -> Outcome:
    return Outcome(0, stdout)


def fail(stderr: str, status: int = 1, stdout: str = "") -> Outcome:
    return Outcome(status, stdout, stderr if stderr.endswith("\n") else stderr + "\n")


def not_found(command: str) -> Outcome:
    return fail(f"bash: line 1: {command}: command not found", 127)


def no_such_file(path: str) -> Outcome:
    return fail(f"bash: line 1: {path}: No such file or directory", 127)
