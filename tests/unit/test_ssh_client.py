"""The SSH adapter's contract without a network: error mapping, host keys, the scp source.

``asyncssh.connect`` is replaced by fakes raising what asyncssh raises, so each failure's
translation into the ``Ssh*`` types (temporary or permanent) is pinned; a fake connection
plays the scp sink to pin the records ``upload`` sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import asyncssh
import pytest

from shared import ssh
from shared.errors import PermanentError, TemporaryError
from shared.ssh import (
    MemoryHostKeys,
    SshClient,
    SshCommandFailed,
    SshDenied,
    SshHostKeyChanged,
    SshUnreachable,
    host_key_name,
    program,
)

KEY = asyncssh.generate_private_key("ssh-ed25519")
PRIVATE = KEY.export_private_key().decode()
HOST_KEY = asyncssh.generate_private_key("ssh-ed25519")
HOST_PUBLIC = HOST_KEY.export_public_key().decode().strip()
OTHER_HOST_PUBLIC = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()


class FakeStream:
    def __init__(self, data: bytes = b"") -> None:
        self.data = bytearray(data)
        self.written = bytearray()
        self.eof = False

    async def read(self, n: int) -> bytes:
        chunk, self.data[:n] = bytes(self.data[:n]), b""
        return chunk

    async def readline(self) -> bytes:
        end = self.data.find(b"\n") + 1 or len(self.data)
        line, self.data[:end] = bytes(self.data[:end]), b""
        return line

    def write(self, data: bytes) -> None:
        self.written += data

    def write_eof(self) -> None:
        self.eof = True


class FakeProcess:
    def __init__(self, answers: bytes, exit_status: int = 0) -> None:
        self.stdout = FakeStream(answers)
        self.stdin = FakeStream()
        self.exit_status = exit_status

    async def __aenter__(self) -> FakeProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def wait(self, check: bool = False) -> Any:
        return SimpleNamespace(exit_status=self.exit_status, stderr=b"")


class FakeConnection:
    def __init__(
        self,
        *,
        result: Any = None,
        raises: BaseException | None = None,
        scp_answers: bytes = b"\0\0\0",
    ) -> None:
        self.result = result
        self.raises = raises
        self.scp_answers = scp_answers
        self.processes: list[tuple[str, FakeProcess]] = []
        self.commands: list[str] = []
        self.closed = False

    async def run(self, command: str, **_: Any) -> Any:
        self.commands.append(command)
        if self.raises is not None:
            raise self.raises
        return self.result

    def create_process(self, command: str, **_: Any) -> FakeProcess:
        process = FakeProcess(self.scp_answers)
        self.processes.append((command, process))
        return process

    def get_server_host_key(self) -> asyncssh.SSHKey:
        return asyncssh.import_public_key(HOST_PUBLIC)

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


def connecting(
    monkeypatch: pytest.MonkeyPatch, outcome: FakeConnection | BaseException
) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    async def connect(host: str, port: int, **options: Any) -> FakeConnection:
        calls.append({"host": host, "port": port, **options})
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(asyncssh, "connect", connect)
    return calls


def done(status: int | None, stdout: bytes = b"", stderr: bytes = b"") -> Any:
    return SimpleNamespace(exit_status=status, stdout=stdout, stderr=stderr)


async def run(client: SshClient, command: str = "/bin/hostname", port: int = 22) -> str:
    return await client.run(
        "127.0.0.9", command, username="cb-user", private_key=PRIVATE, port=port
    )


@pytest.mark.parametrize(
    ("raised", "expected", "temporary"),
    [
        (ConnectionRefusedError(111, "Connection refused"), SshUnreachable, True),
        (OSError(113, "No route to host"), SshUnreachable, True),
        (TimeoutError(), SshUnreachable, True),
        (asyncssh.ConnectionLost("reset"), SshUnreachable, True),
        (asyncssh.ProtocolError("bad banner"), SshUnreachable, True),
        (asyncssh.PermissionDenied("Permission denied"), SshDenied, False),
        (asyncssh.HostKeyNotVerifiable("Host key is not trusted"), SshHostKeyChanged, False),
    ],
)
async def test_connect_failures_are_typed(
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    expected: type[Exception],
    temporary: bool,
) -> None:
    connecting(monkeypatch, raised)
    with pytest.raises(expected) as caught:
        await run(SshClient(MemoryHostKeys()))
    assert isinstance(caught.value, TemporaryError if temporary else PermanentError)
    assert isinstance(caught.value, ssh.SshError)
    assert caught.value.address == "127.0.0.9"
    assert caught.value.__cause__ is raised


async def test_unreadable_private_key_is_denied(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = connecting(monkeypatch, FakeConnection())
    with pytest.raises(SshDenied, match="private key cannot be read"):
        await SshClient(MemoryHostKeys()).run(
            "127.0.0.9", "true", username="cb-user", private_key="not a key"
        )
    assert calls == []


async def test_stdout_is_trimmed_and_the_options_are_strict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = FakeConnection(result=done(0, b"c-1-abcde-1\n\n"))
    calls = connecting(monkeypatch, conn)
    assert await run(SshClient(MemoryHostKeys()), port=2222) == "c-1-abcde-1"
    (options,) = calls
    assert options["port"] == 2222
    assert options["username"] == "cb-user"
    assert options["password"] is None
    assert options["agent_path"] is None
    assert options["kbdint_auth"] is False
    assert conn.closed


async def test_non_zero_exit_carries_the_outputs_and_hides_the_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "sudo kubeadm join 1.2.3.4:9998 --token abcdef.0123456789abcdef"
    connecting(monkeypatch, FakeConnection(result=done(1, b"[preflight]\n", b"bad token\n")))
    with pytest.raises(SshCommandFailed) as caught:
        await run(SshClient(MemoryHostKeys()), secret)
    error = caught.value
    assert isinstance(error, PermanentError)
    assert (error.exit_status, error.stdout, error.stderr) == (1, "[preflight]\n", "bad token\n")
    assert error.command == secret
    assert "abcdef" not in str(error)
    assert str(error) == "ssh 127.0.0.9: kubeadm join exited 1: bad token"


async def test_killed_command_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    connecting(monkeypatch, FakeConnection(result=done(None)))
    with pytest.raises(SshCommandFailed) as caught:
        await run(SshClient(MemoryHostKeys()))
    assert caught.value.exit_status == -1


async def test_lost_connection_mid_command_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connecting(monkeypatch, FakeConnection(raises=asyncssh.ConnectionLost("gone")))
    with pytest.raises(SshUnreachable):
        await run(SshClient(MemoryHostKeys()))


async def test_slow_command_times_out_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    class Slow(FakeConnection):
        async def run(self, command: str, **_: Any) -> Any:
            await asyncio.sleep(5)

    connecting(monkeypatch, Slow())
    with pytest.raises(SshUnreachable, match="no answer"):
        await run(SshClient(MemoryHostKeys(), command_timeout=0.05))


async def test_result_does_not_raise_on_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    connecting(monkeypatch, FakeConnection(result=done(1)))
    client = SshClient(MemoryHostKeys())
    async with client.session("127.0.0.9", username="cb-user", private_key=PRIVATE) as session:
        result = await session.result("test -f /etc/kubernetes/admin.conf")
    assert result.exit_status == 1


async def test_first_contact_remembers_the_host_key_then_pins_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = connecting(monkeypatch, FakeConnection(result=done(0, b"x")))
    keys = MemoryHostKeys()
    client = SshClient(keys)
    await run(client)
    assert calls[0]["known_hosts"] is None
    assert keys.known("127.0.0.9") == HOST_PUBLIC
    await run(client)
    trusted, cas, revoked = calls[1]["known_hosts"]
    assert [k.export_public_key().decode().strip() for k in trusted] == [HOST_PUBLIC]
    assert (cas, revoked) == ([], [])


async def test_host_key_names_follow_known_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    connecting(monkeypatch, FakeConnection(result=done(0)))
    keys = MemoryHostKeys()
    await run(SshClient(keys), port=2222)
    assert list(keys.keys) == ["[127.0.0.9]:2222"]
    assert host_key_name("10.0.0.1", 22) == "10.0.0.1"


async def test_an_unreadable_remembered_key_is_a_changed_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connecting(monkeypatch, FakeConnection(result=done(0)))
    with pytest.raises(SshHostKeyChanged):
        await run(SshClient(MemoryHostKeys({"127.0.0.9": "garbage"})))


def uploading(
    monkeypatch: pytest.MonkeyPatch, answers: bytes
) -> tuple[FakeConnection, Callable[..., Any]]:
    conn = FakeConnection(scp_answers=answers)
    connecting(monkeypatch, conn)

    async def upload(files: dict[str, bytes], **kw: Any) -> None:
        await SshClient(MemoryHostKeys()).upload(
            "127.0.0.9", files, username="cb-user", private_key=PRIVATE, **kw
        )

    return conn, upload


async def test_upload_speaks_the_scp_source_side_per_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn, upload = uploading(monkeypatch, b"\0" * 20)
    files = {"/tmp/a.sh": b"echo a\n", "/tmp/b.sh": b"", "/tmp/addons/x.yaml": b"k: v\n"}
    await upload(files, mode=0o644)
    commands = [command for command, _ in conn.processes]
    assert commands == ["scp -d -t /tmp", "scp -d -t /tmp/addons"]
    first = bytes(conn.processes[0][1].stdin.written)
    assert first == b"C0644 7 a.sh\necho a\n\0C0644 0 b.sh\n\0"
    assert conn.processes[0][1].stdin.eof


async def test_upload_refused_by_the_sink_is_a_command_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, upload = uploading(monkeypatch, b"\0\x02scp: /nope/a.sh: No such file or directory\n")
    with pytest.raises(SshCommandFailed, match="No such file"):
        await upload({"/nope/a.sh": b"x"})


async def test_upload_rejects_a_directory_path(monkeypatch: pytest.MonkeyPatch) -> None:
    _, upload = uploading(monkeypatch, b"\0")
    with pytest.raises(ValueError, match="not a file path"):
        await upload({"/tmp/": b"x"})


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("sudo kubeadm join 1.2.3.4:6443 --token t", "kubeadm join"),
        ("cd /tmp;./k8s-init.sh a b c", "./k8s-init.sh"),
        ("sudo kubectl label nodes n a=b --kubeconfig=/etc/kubernetes/admin.conf", "kubectl label"),
        ("/tmp/bootstrap.sh 1.23.13-00 aws n 1.2.3.4 kilo multi", "/tmp/bootstrap.sh"),
        ("sudo systemctl restart mcks-bootstrap", "systemctl restart"),
        ("", "command"),
    ],
)
def test_program_names_only_the_tool(command: str, shown: str) -> None:
    assert program(command) == shown


def test_errors_form_the_documented_tree() -> None:
    assert issubclass(ssh.SshUnreachable, TemporaryError)
    for permanent in (ssh.SshDenied, ssh.SshHostKeyChanged, ssh.SshCommandFailed):
        assert issubclass(permanent, PermanentError)
    assert all(
        issubclass(e, ssh.SshError)
        for e in (SshUnreachable, SshDenied, SshHostKeyChanged, SshCommandFailed)
    )
    assert OTHER_HOST_PUBLIC != HOST_PUBLIC
