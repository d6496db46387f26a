"""The SSH adapter: the only code that speaks SSH (asyncssh behind it) to a cluster's VMs.

CB-Ladybug drives every node over SSH as ``cb-user`` with the connection's sshKey
(cb-spider's ``vm-ssh`` in upstream: ``src/core/service/provisioner.go`` and
``src/core/model/machine.go`` of cloud-barista/cb-ladybug). Upstream opens a new connection
for every command and never checks the server's host key. Here:

* **Sessions.** ``session(address, ...)`` is an async context manager holding one connection
  for several commands and uploads (bootstrapping a node is a dozen of them); ``run`` and
  ``upload`` open a session for one call, as upstream does.
* **Host keys: trust on first use.** A ``HostKeys`` store (a Protocol: the provisioner keeps
  the keys where it keeps cluster state) is asked for the key of ``address`` (``[address]:port``
  off port 22, as OpenSSH's known_hosts writes it). None known: the key the server presents
  is accepted and remembered once the connection is up. Known: asyncssh is given that key
  alone, so the handshake fails before authentication when the server presents another
  (``SshHostKeyChanged``: someone else answers on that address, or the VM was rebuilt; a
  human decides).
* **Uploads** use the scp sink protocol (``scp -d -t <dir>`` on the node, one run per target
  directory, ``C<mode> <size> <name>`` records), as upstream's ``vm-ssh`` copies its scripts.
  The files arrive from memory, never from local paths. The directory must exist (upstream
  runs ``mkdir -p`` before copying addons; so must callers).
* **Output.** ``run`` returns stdout with trailing newlines trimmed, as upstream captures it;
  stderr is kept on the error only. ``result`` runs a command without raising on its exit
  status, for probes such as ``test -f /etc/kubernetes/admin.conf`` whose exit 1 is an answer.

**Errors** (a service never sees asyncssh)::

    SshError (CapibusError)                          .address
    ├── SshUnreachable (TemporaryError)              refused, reset, timed out, lost
    ├── SshDenied (PermanentError)                   the key was refused (or is unreadable)
    ├── SshHostKeyChanged (PermanentError)           the host key is not the one remembered
    └── SshCommandFailed (PermanentError)            exit status != 0: .exit_status, .stdout,
                                                     .stderr, .command

Unreachable is temporary: a VM that just booted refuses connections until its sshd runs
(upstream tries 15 times, 2 s apart). A refused key is permanent: it will be refused again.
A failed command is permanent for the same input; the caller decides whether to run it again
after changing something. ``SshCommandFailed``'s message names only the program (the command
line may hold a join token or certificate key, and messages reach conditions); ``.command``
keeps the whole line for logs that may hold it.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import shlex
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from shared.errors import CapibusError, PermanentError, TemporaryError

if TYPE_CHECKING:
    import asyncssh


def _asyncssh() -> ModuleType:
    """asyncssh, imported on the first connection: it and the ``cryptography`` it loads are a
    fifth of an idle provisioner's memory, and a replica with no Ladybug cluster never needs
    them (the all-in-one process carries the provisioner for every install)."""
    import asyncssh  # noqa: PLC0415 (lazy: see above)

    return asyncssh


DEFAULT_PORT = 22
CONNECT_TIMEOUT = 15.0
COMMAND_TIMEOUT = 900.0  # kubeadm init and bootstrap.sh's package installs take minutes


class SshError(CapibusError):
    """Anything that went wrong talking to ``address`` over SSH."""

    address: str = ""


class SshUnreachable(SshError, TemporaryError):
    """No SSH conversation: refused, reset, timed out, or the connection was lost."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"ssh {address}: unreachable: {detail}", delay=2.0)
        self.address = address


class SshDenied(SshError, PermanentError):
    """The server refused our key (or the private key cannot be read)."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"ssh {address}: denied: {detail}", reason="SshDenied")
        self.address = address


class SshHostKeyChanged(SshError, PermanentError):
    """The server's host key is not the one first seen on this address."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(
            f"ssh {address}: host key changed since first contact: {detail}",
            reason="SshHostKeyChanged",
        )
        self.address = address


class SshCommandFailed(SshError, PermanentError):
    """The command ran and exited non-zero (or was killed)."""

    def __init__(
        self, address: str, command: str, exit_status: int, stdout: str, stderr: str
    ) -> None:
        detail = (stderr.strip() or stdout.strip()).splitlines()
        tail = detail[-1] if detail else "no output"
        super().__init__(
            f"ssh {address}: {program(command)} exited {exit_status}: {tail}",
            reason="SshCommandFailed",
        )
        self.address = address
        self.command = command
        self.exit_status = exit_status
        self.stdout = stdout
        self.stderr = stderr


def program(command: str) -> str:
    """The program a command line runs, ``sudo`` and ``cd x;`` skipped: safe to show."""
    words = command.replace(";", " ; ").split()
    while words and words[0] in ("sudo", "cd", ";"):
        words = words[2:] if words[0] == "cd" else words[1:]
    if not words:
        return "command"
    first = words[0]
    return (
        f"{first} {words[1]}"
        if first in ("kubeadm", "kubectl", "systemctl") and words[1:]
        else first
    )


class HostKeys(Protocol):
    """Where host keys are remembered: OpenSSH public key lines (``ssh-ed25519 AAAA...``)."""

    def known(self, address: str) -> str | None: ...

    def remember(self, address: str, key: str) -> None: ...


KnownHosts = HostKeys  # the name the CB-Ladybug brief uses for the same store


class MemoryHostKeys:
    """A ``HostKeys`` in a dict: for one process's lifetime, or loaded from and saved to state."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self.keys: dict[str, str] = dict(keys or {})

    def known(self, address: str) -> str | None:
        return self.keys.get(address)

    def remember(self, address: str, key: str) -> None:
        self.keys[address] = key


@dataclass(frozen=True)
class SshResult:
    exit_status: int
    stdout: str
    stderr: str


class Ssh(Protocol):
    """What services depend on; ``SshClient`` is the real one."""

    async def run(
        self, address: str, command: str, *, username: str, private_key: str, port: int = ...
    ) -> str: ...

    async def upload(
        self,
        address: str,
        files: Mapping[str, bytes],
        *,
        username: str,
        private_key: str,
        port: int = ...,
        mode: int = ...,
    ) -> None: ...

    def session(
        self, address: str, *, username: str, private_key: str, port: int = ...
    ) -> contextlib.AbstractAsyncContextManager[SshSession]: ...


class SshClient:
    def __init__(
        self,
        host_keys: HostKeys,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        command_timeout: float = COMMAND_TIMEOUT,
    ) -> None:
        self.host_keys = host_keys
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout

    async def run(
        self,
        address: str,
        command: str,
        *,
        username: str,
        private_key: str,
        port: int = DEFAULT_PORT,
    ) -> str:
        async with self.session(
            address, username=username, private_key=private_key, port=port
        ) as session:
            return await session.run(command)

    async def upload(
        self,
        address: str,
        files: Mapping[str, bytes],
        *,
        username: str,
        private_key: str,
        port: int = DEFAULT_PORT,
        mode: int = 0o755,
    ) -> None:
        async with self.session(
            address, username=username, private_key=private_key, port=port
        ) as session:
            await session.upload(files, mode=mode)

    @contextlib.asynccontextmanager
    async def session(
        self, address: str, *, username: str, private_key: str, port: int = DEFAULT_PORT
    ) -> AsyncIterator[SshSession]:
        name = host_key_name(address, port)
        key = _private_key(address, private_key)
        known = self.host_keys.known(name)
        conn = await self._connect(address, port, username, key, known)
        try:
            if known is None:
                presented = conn.get_server_host_key()
                if presented is not None:
                    self.host_keys.remember(name, _openssh(presented))
            yield SshSession(conn, address, self.command_timeout)
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def _connect(
        self,
        address: str,
        port: int,
        username: str,
        key: asyncssh.SSHKey,
        known: str | None,
    ) -> asyncssh.SSHClientConnection:
        ssh = _asyncssh()
        trusted: tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]] | None
        trusted = None if known is None else ([_public_key(address, known)], [], [])
        try:
            connection: asyncssh.SSHClientConnection = await ssh.connect(
                address,
                port,
                username=username,
                client_keys=[key],
                known_hosts=trusted,
                agent_path=None,
                password=None,
                kbdint_auth=False,
                preferred_auth="publickey",
                config=None,
                connect_timeout=self.connect_timeout,
                login_timeout=self.connect_timeout,
            )
        except ssh.HostKeyNotVerifiable as exc:
            raise SshHostKeyChanged(address, exc.reason) from exc
        except ssh.PermissionDenied as exc:
            raise SshDenied(address, exc.reason) from exc
        except ssh.DisconnectError as exc:
            raise SshUnreachable(address, exc.reason) from exc
        except (OSError, TimeoutError, ssh.Error) as exc:
            raise SshUnreachable(address, str(exc) or type(exc).__name__) from exc
        return connection


class SshSession:
    """One connection to one node; commands run one after the other or concurrently."""

    def __init__(
        self, conn: asyncssh.SSHClientConnection, address: str, command_timeout: float
    ) -> None:
        self._conn = conn
        self.address = address
        self.command_timeout = command_timeout

    async def run(self, command: str) -> str:
        """stdout, trailing newlines trimmed; ``SshCommandFailed`` on a non-zero exit."""
        result = await self.result(command)
        if result.exit_status != 0:
            raise SshCommandFailed(
                self.address, command, result.exit_status, result.stdout, result.stderr
            )
        return result.stdout.rstrip("\r\n")

    async def result(self, command: str, *, stdin: bytes | None = None) -> SshResult:
        """The exit status and both outputs, whatever the status (-1: killed by a signal)."""
        try:
            done = await asyncio.wait_for(
                self._conn.run(command, input=stdin, check=False, encoding=None),
                self.command_timeout,
            )
        except TimeoutError as exc:
            raise SshUnreachable(self.address, f"no answer in {self.command_timeout:g}s") from exc
        except (OSError, _asyncssh().Error) as exc:
            raise SshUnreachable(self.address, str(exc) or type(exc).__name__) from exc
        status = done.exit_status if done.exit_status is not None else -1
        return SshResult(status, _text(done.stdout), _text(done.stderr))

    async def upload(self, files: Mapping[str, bytes], *, mode: int = 0o755) -> None:
        """Each ``{remote path: content}`` over ``scp -t <dir>``, one run per directory."""
        by_dir: dict[str, list[tuple[str, bytes]]] = {}
        for path, content in files.items():
            directory, name = posixpath.split(path)
            if not name:
                raise ValueError(f"not a file path: {path!r}")
            by_dir.setdefault(directory or ".", []).append((name, content))
        for directory, entries in by_dir.items():
            await self._scp(directory, entries, mode)

    async def _scp(self, directory: str, entries: list[tuple[str, bytes]], mode: int) -> None:
        # -d: the target must be a directory (without it, scp would write one file AS the
        # target path when that directory is missing)
        command = f"scp -d -t {shlex.quote(directory)}"
        try:
            await asyncio.wait_for(self._sink(command, entries, mode), self.command_timeout)
        except TimeoutError as exc:
            raise SshUnreachable(
                self.address, f"scp: no answer in {self.command_timeout:g}s"
            ) from exc
        except (OSError, _asyncssh().Error) as exc:
            raise SshUnreachable(self.address, str(exc) or type(exc).__name__) from exc

    async def _sink(self, command: str, entries: list[tuple[str, bytes]], mode: int) -> None:
        async with self._conn.create_process(command, encoding=None) as process:
            try:
                await _ack(process, self.address, command)
                for name, content in entries:
                    header = f"C{mode & 0o7777:04o} {len(content)} {name}\n".encode()
                    process.stdin.write(header)
                    await _ack(process, self.address, command)
                    process.stdin.write(content + b"\0")
                    await _ack(process, self.address, command)
            finally:
                process.stdin.write_eof()
            done = await process.wait(check=False)
        if done.exit_status not in (0, None):
            raise SshCommandFailed(self.address, command, done.exit_status, "", _text(done.stderr))


async def _ack(process: asyncssh.SSHClientProcess[bytes], address: str, command: str) -> None:
    """The sink's answer: ``\\0`` ok, ``\\1``/``\\2`` + message a warning or error."""
    code = await process.stdout.read(1)
    if code == b"\0":
        return
    if not code:
        done = await process.wait(check=False)
        status = done.exit_status if done.exit_status is not None else -1
        raise SshCommandFailed(
            address, command, status or 1, "", _text(done.stderr) or "scp: sink closed"
        )
    message = await process.stdout.readline()
    raise SshCommandFailed(address, command, 1, "", _text(message))


def host_key_name(address: str, port: int) -> str:
    """How known_hosts names a server: the address on port 22, ``[address]:port`` off it."""
    return address if port == DEFAULT_PORT else f"[{address}]:{port}"


def _private_key(address: str, text: str) -> asyncssh.SSHKey:
    ssh = _asyncssh()
    try:
        key: asyncssh.SSHKey = ssh.import_private_key(text)
        return key
    except (ssh.KeyImportError, ValueError) as exc:
        raise SshDenied(address, f"the private key cannot be read: {exc}") from exc


def _public_key(address: str, text: str) -> asyncssh.SSHKey:
    ssh = _asyncssh()
    try:
        key: asyncssh.SSHKey = ssh.import_public_key(text)
        return key
    except (ssh.KeyImportError, ValueError) as exc:
        raise SshHostKeyChanged(address, f"the remembered key cannot be read: {exc}") from exc


def _openssh(key: asyncssh.SSHKey) -> str:
    return key.export_public_key("openssh").decode().strip()


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data if isinstance(data, str) else ""
