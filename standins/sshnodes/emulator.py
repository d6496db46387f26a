"""The node emulator: sshd's ``ForceCommand`` on every fake node, one process per command.

    python -m standins.sshnodes.emulator <node dir>

sshd puts the command the client asked for in ``SSH_ORIGINAL_COMMAND``; this answers it
from the rule table below (§"Fake SSH nodes" of the design: the commands upstream
cloud-barista/cb-ladybug sends, ``src/core/service/provisioner.go``) and exits with the
status the real command would. **Nothing runs on the host**: every effect is a file under
the node's directory or the farm's shared cluster state (see ``node.py``, ``cluster.py``).

=================================================  ==========================================
command (``sudo`` and a leading ``cd <dir>;`` ok)  answer
=================================================  ==========================================
``/bin/hostname``                                  the node's hostname (the VM name, or what
                                                   bootstrap.sh set)
``mkdir [-p] …``, ``test -f|-d|-e …``, ``cat …``   on the node's fs (``admin.conf`` virtual)
``scp -t <dir>``                                   scp sink, files stored under fs/
``/tmp/bootstrap.sh`` + 6 args                     file must exist; records hostname,
                                                   versions, mcks-bootstrap enabled
``sed 's/^{{SERVERS}}/…/g' /tmp/haproxy.sh``       the script with the line replaced
the rendered haproxy script itself                 records the backends (fails unrendered)
``./k8s-init.sh`` + 7 args, ``./k8s-init-etcd.sh``  kubeadm init (``kube.py``)
``kubeadm join …``, ``kubeadm token create …``     checked against the shared cluster
``systemctl restart|is-enabled mcks-bootstrap``    after bootstrap
``kubectl … --kubeconfig=/etc/kubernetes/admin.conf``  label, annotate, apply, create secret,
                                                   drain, delete node, delete all, get nodes
``/tmp/etcd-ca.sh``, ``/tmp/etcd-conf.sh``,         ok when uploaded; recorded
``./gen-cloud-config.sh``, ``./addons/nfs/…``
``scp … cb-user@<ip>:`` (etcd CA, from the leader)  ok; recorded
``curl [-sf] http://169.254.169.254/latest/…``      the node's instance metadata (its CSP's
                                                   keys: AWS ``local-hostname``,
                                                   ``instance-id``; NCP ``serverName``, ...)
``rm [-rf] …``                                     on the node's fs
anything else                                      bash's "command not found", 127
=================================================  ==========================================

Knobs are read from ``knobs.json`` on every command (``NodeKnobs``): ``bootstrap_fail``
(bootstrap.sh exits 100 like apt), ``init_without_success`` (k8s-init.sh exits 0 but
kubeadm's output stops at the kubelet timeout, without the success sentence),
``join_fail`` (kubeadm join exits 1). ``unreachable`` is played by the farm, not here.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import BinaryIO

from standins.sshnodes import commands, kube, scp
from standins.sshnodes.node import HOME, Node
from standins.sshnodes.outcome import Outcome, fail, no_such_file, not_found, ok

CD_PREFIX = re.compile(r"^\s*cd\s+(\S+)\s*(?:;|&&)\s*(.*)$", re.S)
HELPER_SCRIPTS = ("etcd-ca.sh", "etcd-conf.sh", "gen-cloud-config.sh", "deploy_v4.0.16.sh")


def answer(node: Node, command: str, stdin: BinaryIO, stdout: BinaryIO) -> Outcome:
    if not command.strip():
        return fail("This node answers commands only; interactive shells are not emulated.")
    if "/etc/haproxy/haproxy.cfg" in command:
        return commands.haproxy(node, command)
    cwd = HOME
    match = CD_PREFIX.match(command)
    if match:
        cwd, command = match[1] if match[1].startswith("/") else f"{HOME}/{match[1]}", match[2]
    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError:
        return fail("bash: line 1: syntax error: unexpected end of file", 2)
    while words[:1] == ["sudo"]:
        words = words[1:]
    if not words:
        return ok()
    return dispatch(node, words[0], words[1:], cwd, stdin=stdin, stdout=stdout)


def dispatch(
    node: Node, program: str, args: list[str], cwd: str, *, stdin: BinaryIO, stdout: BinaryIO
) -> Outcome:
    name = program.rsplit("/", 1)[-1]
    if "/" in program:
        missing = commands.exists(node, program, cwd) if not program.startswith("/bin/") else None
        if missing:
            return missing
        return _script(node, name, program, args)
    admin = kube.admin_conf(node) is not None
    simple = {
        "hostname": lambda: commands.hostname(node, args),
        "mkdir": lambda: commands.mkdir(node, args, cwd),
        "test": lambda: commands.test(node, args, cwd, admin=admin),
        "systemctl": lambda: commands.systemctl(node, args),
        "sed": lambda: commands.sed(node, args, cwd),
        "kubectl": lambda: kube.kubectl(node, args, cwd),
        "kubeadm": lambda: _kubeadm(node, args),
        "cat": lambda: _cat(node, args, cwd),
        "scp": lambda: _scp(node, args, cwd, stdin, stdout),
        "curl": lambda: commands.curl(node, args),
        "rm": lambda: commands.rm(node, args, cwd),
    }
    handler = simple.get(program)
    return handler() if handler else not_found(program)


def _script(node: Node, name: str, path: str, args: list[str]) -> Outcome:
    if name == "hostname":
        return commands.hostname(node, args)
    if name == "bootstrap.sh":
        return commands.bootstrap(node, args)
    if name in ("k8s-init.sh", "k8s-init-etcd.sh"):
        return kube.init(node, args, etcd=name == "k8s-init-etcd.sh")
    if name in HELPER_SCRIPTS:
        return commands.script(node, path, args)
    return no_such_file(path)


def _kubeadm(node: Node, args: list[str]) -> Outcome:
    if args[:1] == ["join"]:
        return kube.join(node, args[1:])
    if args[:2] == ["token", "create"]:
        return kube.token_create(node, args[2:])
    if args[:3] == ["init", "phase", "upload-certs"]:
        return kube.upload_certs(node, args[3:])
    return fail(f"kubeadm: unsupported here: {' '.join(args[:2])}")


def _cat(node: Node, args: list[str], cwd: str) -> Outcome:
    if args == [kube.ADMIN_CONF]:
        text = kube.admin_conf(node)
        return (
            ok(text)
            if text is not None
            else fail(f"cat: {kube.ADMIN_CONF}: No such file or directory")
        )
    return commands.cat(node, args, cwd)


def _scp(node: Node, args: list[str], cwd: str, stdin: BinaryIO, stdout: BinaryIO) -> Outcome:
    if "-t" in args:
        return scp.sink(node, args, cwd, stdin, stdout)
    if any("@" in a and a.endswith(":") for a in args):
        return commands.script(node, "scp", args)  # the leader copying the etcd CA
    return fail("usage: scp [-r] source ... user@host:")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m standins.sshnodes.emulator <node dir>", file=sys.stderr)
        return 2
    node = Node(Path(argv[1]))
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    with node.locked():
        outcome = answer(node, command, sys.stdin.buffer, sys.stdout.buffer)
        node.log(command, outcome.status)
    sys.stdout.write(outcome.stdout)
    sys.stderr.write(outcome.stderr)
    return outcome.status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
