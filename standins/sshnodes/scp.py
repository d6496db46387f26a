"""The receiving end of the scp protocol (``scp -t <target>``), storing under the node's fs.

The protocol (OpenSSH ``scp.c`` ``sink()``), as the source speaks it: the sink answers
``\\0`` when ready; each ``C<mode> <size> <name>`` record is answered ``\\0``, then ``size``
bytes and a ``\\0`` follow and are answered ``\\0``; ``D<mode> 0 <name>`` enters a directory
(``-r``), ``E`` leaves it, ``T<mtime> 0 <atime> 0`` sets times (ignored); a refusal is
``\\1`` (warning) or ``\\2`` (fatal) with a message line. A target that is a directory
receives the files by name; a single file may be sent to a path whose directory exists,
unless ``-d`` (the target must be a directory, checked before anything is read).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from standins.sshnodes.node import Node
from standins.sshnodes.outcome import Outcome, fail, ok

OK = b"\0"


class _Refused(Exception):
    pass


def sink(node: Node, args: list[str], cwd: str, stdin: BinaryIO, stdout: BinaryIO) -> Outcome:
    target_path = next((a for a in args if not a.startswith("-")), "")
    if "-t" not in args or not target_path:
        return fail("usage: scp -t <target>")
    target = node.local(target_path, cwd)
    if "-d" in args and not target.is_dir():
        stdout.write(b"\x01scp: " + target_path.encode() + b": No such file or directory\n")
        stdout.flush()
        return fail(f"scp: {target_path}: No such file or directory")
    received: list[str] = []
    stdout.write(OK)
    stdout.flush()
    try:
        _receive(target, stdin, stdout, received)
    except _Refused as exc:
        message = str(exc)
        stdout.write(b"\x02" + message.encode() + b"\n")
        stdout.flush()
        return fail(message)
    state = node.state()
    state.setdefault("received", []).extend(
        "/" + str(Path(path).relative_to(node.fs)) for path in received
    )
    node.save(state)
    return ok()


def _receive(target: Path, stdin: BinaryIO, stdout: BinaryIO, received: list[str]) -> None:
    stack = [target]
    while True:
        line = stdin.readline()
        if not line:
            return
        kind, text = line[:1], line[1:].decode(errors="replace").rstrip("\n")
        if kind == b"T":
            _answer(stdout)
        elif kind == b"C":
            mode, size, name = _record(text)
            destination = _destination(stack[-1], name, nested=len(stack) > 1)
            _answer(stdout)  # the source sends the data only after this
            data = stdin.read(size + 1)
            if len(data) != size + 1:
                raise _Refused("scp: unexpected end of file")
            destination.write_bytes(data[:size])
            destination.chmod(mode)
            received.append(str(destination))
            _answer(stdout)
        elif kind == b"D":
            _, _, name = _record(text)
            directory = stack[-1] / name if stack[-1].is_dir() else stack[-1]
            directory.mkdir(exist_ok=True)
            stack.append(directory)
            _answer(stdout)
        elif kind == b"E":
            stack.pop()
            _answer(stdout)
        elif kind in (b"\x01", b"\x02"):
            raise _Refused(text)
        else:
            raise _Refused(f"scp: protocol error: unexpected <{line[:20]!r}>")


def _record(text: str) -> tuple[int, int, str]:
    try:
        mode, size, name = text.split(" ", 2)
        return int(mode, 8), int(size), name
    except ValueError as exc:
        raise _Refused(f"scp: protocol error: bad record {text[:40]!r}") from exc


def _destination(target: Path, name: str, *, nested: bool) -> Path:
    if "/" in name or name in ("", ".", ".."):
        raise _Refused(f"scp: error: unexpected filename: {name}")
    if target.is_dir():
        return target / name
    if not nested and target.parent.is_dir():
        return target
    raise _Refused(f"scp: {target.name}: No such file or directory")


def _answer(stdout: BinaryIO) -> None:
    stdout.write(OK)
    stdout.flush()
