"""The node's own commands: hostname, files, systemctl, bootstrap.sh, the HAProxy steps.

The shapes are upstream's (``src/core/service/provisioner.go`` and ``src/scripts/*.sh`` of
cloud-barista/cb-ladybug); nothing is executed on the host, every effect is a record in the
node's ``state.json`` or a file under its ``fs/``.
"""

from __future__ import annotations

import posixpath
import re
import shutil

from standins.sshnodes.node import Node
from standins.sshnodes.outcome import Outcome, fail, no_such_file, ok

BOOTSTRAP_ARGS = 6  # <k8sVersion> <csp> <hostname> <publicIP> <cni> <serviceType>
UNIT = "mcks-bootstrap"
METADATA = "http://169.254.169.254/latest/meta-data"
SERVER_LINE = re.compile(r"^\s*server\s+(\S+)\s+(\S+)", re.M)


def hostname(node: Node, args: list[str]) -> Outcome:
    if args:
        return fail("hostname: you must be root to change the host name")
    return ok(node.state()["hostname"] + "\n")


def mkdir(node: Node, args: list[str], cwd: str) -> Outcome:
    parents = "-p" in args
    for path in (a for a in args if not a.startswith("-")):
        target = node.local(path, cwd)
        if target.exists() and not parents:
            return fail(f"mkdir: cannot create directory '{path}': File exists")
        if not parents and not target.parent.is_dir():
            return fail(f"mkdir: cannot create directory '{path}': No such file or directory")
        target.mkdir(parents=parents, exist_ok=parents)
    return ok()


def rm(node: Node, args: list[str], cwd: str) -> Outcome:
    """``rm [-f] [-r] PATH...`` on the node's files (the root itself is refused, as GNU rm)."""
    flags = "".join(a[1:] for a in args if a.startswith("-"))
    for path in (a for a in args if not a.startswith("-")):
        if posixpath.normpath(posixpath.join(cwd, path)) == "/":
            return fail(
                "rm: it is dangerous to operate recursively on '/'\n"
                "rm: use --no-preserve-root to override this failsafe"
            )
        target = node.local(path, cwd)
        if target.is_dir() and "r" in flags:
            shutil.rmtree(target)
        elif target.is_dir():
            return fail(f"rm: cannot remove '{path}': Is a directory")
        elif target.exists():
            target.unlink()
        elif "f" not in flags:
            return fail(f"rm: cannot remove '{path}': No such file or directory")
    return ok()


def curl(node: Node, args: list[str]) -> Outcome:
    """``curl [-sf] URL``: the instance-metadata service of the node's CSP (``metadata`` in
    ``node.json``); with ``-f`` a missing key fails as curl does on a 404."""
    urls = [a for a in args if not a.startswith("-")]
    url = urls[-1] if urls else ""
    if not url.startswith(METADATA):
        host = url.split("/")[2] if url.count("/") >= 2 else url
        return fail(f"curl: (6) Could not resolve host: {host}", 6)
    value = (node.info.get("metadata") or {}).get(url.removeprefix(METADATA).strip("/"))
    if value is not None:
        return ok(str(value))
    if any("f" in a for a in args if a.startswith("-") and not a.startswith("--")):
        return fail("curl: (22) The requested URL returned error: 404 Not Found", 22)
    return ok('<?xml version="1.0"?>\n<title>404 - Not Found</title>\n')


def test(node: Node, args: list[str], cwd: str, *, admin: bool) -> Outcome:
    """``test -f|-d|-e PATH``: the answer is the exit status, as in bash."""
    if len(args) != 2 or args[0] not in ("-f", "-d", "-e"):
        return Outcome(2, "", "bash: test: unsupported expression\n")
    if args[1] == "/etc/kubernetes/admin.conf":
        return Outcome(0 if admin and args[0] != "-d" else 1)
    target = node.local(args[1], cwd)
    found = {"-f": target.is_file(), "-d": target.is_dir(), "-e": target.exists()}[args[0]]
    return Outcome(0 if found else 1)


def cat(node: Node, args: list[str], cwd: str) -> Outcome:
    out = []
    for path in args:
        target = node.local(path, cwd)
        if not target.is_file():
            return fail(f"cat: {path}: No such file or directory")
        out.append(target.read_text(errors="replace"))
    return ok("".join(out))


def systemctl(node: Node, args: list[str]) -> Outcome:
    state = node.state()
    if len(args) != 2:
        return fail(f"systemctl: unsupported: {' '.join(args)}")
    verb, unit = args[0], args[1].removesuffix(".service")
    installed = (unit == UNIT and state.get("mcksBootstrap")) or unit in state.get("units", [])
    if verb == "is-enabled":
        if installed:
            return ok("enabled\n")
        return fail(f"Failed to get unit file state for {unit}.service: No such file or directory")
    if verb in ("restart", "start", "enable", "stop"):
        if not installed:
            return fail(f"Failed to {verb} {unit}.service: Unit {unit}.service not found.", 5)
        state["restarts"] = state.get("restarts", 0) + (verb == "restart")
        node.save(state)
        return ok()
    return fail(f"systemctl: unsupported verb {verb}")


def bootstrap(node: Node, args: list[str]) -> Outcome:
    """``/tmp/bootstrap.sh <k8sVersion> <csp> <hostname> <publicIP> <cni> <serviceType>``."""
    if len(args) != BOOTSTRAP_ARGS:
        return fail("There are mandatory fields (k8s version, csp, hostname, public ip, ...)")
    version, csp, name, public_ip, cni, service_type = args
    if node.knobs().bootstrap_fail:
        return fail(
            f"E: Version '{version}' for 'kubeadm' was not found",
            100,
            stdout=f"hostname: {name}\nReading package lists...\n",
        )
    state = node.state()
    state.update(
        hostname=name,
        bootstrapped=True,
        bootstrapArgs=args,
        kubernetesVersion=version.split("-")[0],
        mcksBootstrap=True,
    )
    state["units"] = sorted({*state.get("units", []), "kubelet", "containerd", "haproxy"})
    node.save(state)
    return ok(
        f"hostname: {name} ({csp}, {public_ip}, {cni}, {service_type})\n"
        f"containerd installed\nkubeadm, kubelet and kubectl {version} installed\n"
        f"Created symlink /etc/systemd/system/kubelet.service.wants/{UNIT}.service "
        f"→ /lib/systemd/system/{UNIT}.service.\n"
    )


def sed(node: Node, args: list[str], cwd: str) -> Outcome:
    """``sed 's/^{{SERVERS}}/<lines>/g' /tmp/haproxy.sh``: the file with that line replaced."""
    if len(args) != 2 or not args[0].startswith("s/"):
        return fail("sed: only one s/// expression and one file are emulated")
    target = node.local(args[1], cwd)
    if not target.is_file():
        return fail(f"sed: can't read {args[1]}: No such file or directory", 2)
    parts = _split_s(args[0])
    if parts is None:
        return fail(f"sed: -e expression #1, char {len(args[0])}: unterminated `s' command")
    pattern, replacement = parts
    anchored = pattern.startswith("^")
    literal = pattern.removeprefix("^")
    lines = target.read_text().splitlines(keepends=True)
    out = []
    for line in lines:
        hit = line.startswith(literal) if anchored else literal in line
        out.append(line.replace(literal, replacement, 1 if anchored else -1) if hit else line)
    return ok("".join(out))


def haproxy(node: Node, script: str) -> Outcome:
    """The rendered haproxy.sh run as a command: records the backends, or fails like haproxy."""
    state = node.state()
    if not state.get("bootstrapped"):
        return fail("sudo: systemctl: unit haproxy.service not found", 5)
    if re.search(r"^\{\{SERVERS\}\}\s*$", script, re.M):
        return fail(
            "Job for haproxy.service failed because the control process exited with error "
            'code.\nSee "systemctl status haproxy.service" and "journalctl -xe" for details.'
        )
    backends = [f"{name} {target}" for name, target in SERVER_LINE.findall(script)]
    if not backends:
        return fail("[ALERT] backend 'apiserver' has no server available!")
    state["haproxy"] = backends
    node.save(state)
    return ok()


def script(node: Node, path: str, args: list[str]) -> Outcome:
    """An uploaded helper script (etcd, cloud config, NFS): ok once it is there; recorded."""
    state = node.state()
    state.setdefault("scripts", []).append([path, *args])
    node.save(state)
    return ok()


def exists(node: Node, path: str, cwd: str) -> Outcome | None:
    """None when the script is on the node; else bash's answer."""
    return None if node.local(path, cwd).is_file() else no_such_file(path)


def _split_s(expression: str) -> tuple[str, str] | None:
    """``s/PATTERN/REPLACEMENT/FLAGS`` with ``\\/`` and ``\\n`` as GNU sed reads them."""
    parts: list[str] = []
    current: list[str] = []
    chars = iter(expression[2:])
    for char in chars:
        if char == "\\":
            following = next(chars, "")
            current.append("\n" if following == "n" else following)
        elif char == "/":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if len(parts) != 2:
        return None
    return parts[0], parts[1].replace("&", parts[0].lstrip("^"))
