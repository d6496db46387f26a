"""``python -m demo``: an Azimuth Cluster from creation to Ready and back to nothing, live;
or, with ``--scene metalstack``, a Cluster API cluster on metal-stack; or, with ``--scene
assisted``, an OpenShift cluster installed on bare metal by OpenShift Assisted; or, with
``--scene ladybug``, a CB-Ladybug cluster on CB-Tumblebug VMs bootstrapped over SSH.

Usage::

    uv run python -m demo [--scene azimuth|metalstack|assisted|ladybug] [--keep-running]
                          [--workdir DIR]
    make demo [SCENE=metalstack|assisted|ladybug]

``--scene`` picks the story; ``azimuth``, the default, is told first, the others after it.
All share the stack (step 0), the CRDs (step 1), the live feed, the waits and the cleanup.

**The Azimuth scene.**

Everything is real but the peers: etcd, kube-apiserver, kube-controller-manager, nats-server
(JetStream) and redis-server on loopback (``testenv.harness.LocalStack``), the seven capibus
services of a Cluster's story in one process, the real ``helm`` binary installing charts. Only
the operators capibus talks to (identity, schedule, Zenith, Cluster API) are stand-ins
(``python -m standins``). About two minutes once the binaries are built (a cold build of the
pinned programs shows its own progress first). The story:

0. **Stack.** The programs above start; nothing is faked. A line shows how to reach the stack
   with the pinned kubectl while the story plays.
1. **CRDs.** ``deploy/crds`` (capibus's own kinds) and ``standins/crds`` (the peer kinds) are
   server-side applied and waited on until Established.
2. **Services.** watcher, writer, identity, lease, helm, monitor and discovery in one
   all-in-one process (``python -m services run --only ...``, logging to
   ``<workdir>/capibus.log``) and the stand-ins (``<workdir>/standins.log``), each in its own
   process group, configured as a deployment with OIDC and Zenith on; the helm
   service installs the stand-in charts of ``standins/charts``. Not started: admission (the
   API server would call it only through a ValidatingWebhookConfiguration with a serving
   certificate, and the portal's objects here are valid), catalog (the story has no
   AppTemplate) and exporter (nothing here scrapes metrics).
3. **The portal's objects** (``demo/manifests``): namespace ``demo``, its Realm, a
   ClusterTemplate, the cloud credentials, the Cluster ``demo/demo`` (monitoring addon, on a
   reservation) and its Lease ``kube-demo``, owned by the Cluster.
4. **Convergence.** A highlighted line (◆) marks every change of the Cluster's phase or of its
   ``Reconciled`` condition: waiting for identity, for the lease, deployed, Reconciling while
   the machines come up, Ready. Fails after 180 s with the last status and the logs to read.
5. **The outcome.** The Helm release (``helm history``), the OIDCClient and Platform, the
   Zenith fqdn reserved for the API server, and the machine flavors remapped by the Lease.
6. **A spec change.** One more worker: exactly one Helm upgrade (revision 2), then Ready.
7. **A bad message.** A malformed body on the Cluster's status subject ends up in the
   dead-letter stream, with its reason, while the writer carries on.
8. **Deletion.** A Foreground delete, as the portal does it; then every kind the Cluster
   brought is listed, to show that nothing is left.

After the steps that change it, the Cluster is read back from the API server (phase,
conditions, nodes, addons).

**The metal-stack scene** (``demo.metalstack``), wired as ``tests/integration/
test_metalstack.py`` wires it; see ``docs/metalstack.md``. Under a minute:

0. **Stack**, plus a second kube-apiserver playing the workload cluster, whose Nodes the
   provider looks for.
1. **CRDs**, as above.
2. **Services.** watcher (the six kinds the provider reacts to), writer and the metal-stack
   provider (``python -m services.baremetal.metalstack``), the metal-api stand-in (``python -m
   standins.metalapi``, HMAC on, a pool of 10 machines, a node registrar writing a Node into
   the workload cluster when a machine phones home) and the Cluster API stand-in (``python -m
   standins --only capi``: CAPI core and kubeadm, never the provider's part).
3. **A CAPI cluster** ``demo/ms`` with one control plane and two workers on metal-stack. A
   highlighted line (◆) marks what each object gets: the MetalStackCluster its private network
   and API address, each MetalStackMachine its machine (``providerID``) and then readiness
   (its Node carries the providerID), the firewall its machine and then running; and the CAPI
   Cluster's phase. Fails after 180 s with the last state seen and the logs to read.
4. **The outcome.** The machines in metal-api (id, hostname, last event), the workload
   cluster's Nodes with their providerIDs, the MetalStackCluster's network and endpoint.
5. **Scaling** the MachineDeployment's workers 2 → 4 → 1, each step waited on, in Kubernetes
   and in metal-api.
6. **Deletion** of the CAPI Cluster; once everything of it is gone, metal-api's pool is all
   ``Waiting`` again, with no IP and no network left but the seeded ones.

**The OpenShift Assisted scene** (``demo.assisted``), wired as ``tests/integration/
test_assisted.py`` wires it; see ``docs/assisted.md``. About a minute:

0. **Stack**, plus a second kube-apiserver playing the installed OpenShift cluster, where
   installed hosts' Nodes appear.
1. **CRDs**, as above.
2. **Services.** watcher (the ten kinds the providers react to), writer and both providers
   (``python -m services.baremetal.assisted_bootstrap`` and ``...assisted_controlplane``), the
   assisted stand-ins (``python -m standins.assisted``: assisted-service's image service and
   install walk, hive, the metal3 hosts) and the Cluster API stand-in (``--only capi``).
3. **Day 1.** Six BareMetalHosts are enrolled, then the cluster ``demo/ocp`` (OpenShift
   4.16.0, three control-plane hosts and two workers). The ◆ lines show the flow as it
   happens: each InfraEnv's ISO, hosts claimed, Agents booted, then approved with a role,
   the AgentClusterInstall's walk ``insufficient → ready → preparing-for-installation →
   installing → finalizing → installed → adding-hosts``, the kubeconfig Secrets, the control
   plane initialized and ready. Fails after 120 s with the last state seen and the logs.
4. **The outcome.** The control plane's status and conditions, the ACI's state, the
   ``<cluster>-kubeconfig`` Secret, every Agent (host, role, approval, state), every host and
   the workload cluster's Nodes matched to their Agents by ``metal3.io/uuid``.
5. **Day 2.** The MachineDeployment scaled 2 → 3: the new host's Agent goes ``installing`` →
   ``added-to-existing-cluster`` and its Node appears.
6. **Deletion** of the CAPI Cluster; once everything of it is gone, all six hosts are free.

**The CB-Ladybug scene** (``demo.ladybug``), wired as ``tests/integration/test_ladybug.py``
wires it; see ``docs/ladybug.md``. Under a minute:

0. **Stack**, plus a second kube-apiserver playing the Ladybug cluster's own API server,
   where the nodes' ``kubeadm init``/``join`` register Nodes.
1. **CRDs**, as above.
2. **Services.** The CB-Tumblebug stand-in (``python -m standins.tumblebug``: every VM a real
   ``sshd`` on its own loopback address, whose forced command emulates the node), watcher
   (``ladybugcluster`` only), writer, the provisioner (``python -m
   services.ladybug.provisioner``) and the REST API (``python -m services.ladybug.api``, a
   random bearer token written to ``<workdir>/ladybug-api.token``, never printed).
3. **Create**, through the REST API as a user's ``curl`` would (each call printed as its
   ``curl`` line with ``$LADYBUG_TOKEN``, the answer's key fields after it, the admin
   kubeconfig by size only): cluster ``ns-1/lb-demo``, one control plane and two workers,
   haproxy. While the blocking call waits, the ◆ lines show the LadybugCluster's phase and
   each node bootstrapped and joined over SSH, Tumblebug's MCIS and VMs, and the Nodes
   appearing in the workload API server. Fails after 90 s with the last state seen.
4. **The outcome.** The LadybugCluster's status, its Secrets (names and keys only), the MCIS
   with its VMs and the MCIR in Tumblebug, the workload Nodes with their topology labels.
5. **Add a worker** (``POST .../nodes``): one VM more in the MCIS, bootstrapped and joined.
6. **Delete** (``DELETE .../clusters/lb-demo``), answered once the provisioner released its
   finalizer; then a ``GET`` answers 404.
7. **What is left:** no LadybugCluster, MCIS, workload Node or Secret of the cluster; only the
   connection's sshKey (Tumblebug's MCIR and the Secret mirroring its private key) stays, as
   upstream keeps the MCIR.

In every scene, every message on ``capibus.>`` is printed as it flows, one line each::

    time  category  type  event  object  detail  correlation id

where the category is the stream it belongs to: EVENT (watcher), STATUS (status and metadata
commands for the writer), LIFECYCLE (prerequisites, nudges and rechecks between services),
JOURNAL (what the writer did), DEADLETTER (what services gave up on). Colour is off when
stdout is not a terminal or ``NO_COLOR`` is set.

``--keep-running`` leaves everything up after the story, prints the ``export KUBECONFIG=...``
lines and the kubectl command to reach the stack, and keeps the feed running until Ctrl-C.
``--workdir`` keeps logs and data in DIR; without it a temporary directory is used and removed
afterwards, unless the demo failed, in which case it is kept for the logs.

Ctrl-C (or SIGTERM) at any point stops the services and stand-ins (SIGTERM, SIGKILL after
10 s), then the stack, and checks that no process is left behind; a second Ctrl-C during that
cleanup is ignored, since cutting it short is exactly what would leave orphans.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from demo import session
from demo.assisted import Assisted
from demo.azimuth import Azimuth
from demo.feed import DemoTimeout
from demo.ladybug import Ladybug
from demo.metalstack import MetalStack
from demo.processes import STOP_TIMEOUT, ServiceFailed, Services, leftovers
from demo.style import BOLD, GREEN, RED, heading, note, say
from shared.errors import CapibusError
from testenv.harness import LocalStack, StackError, ensure_binaries

EXPECTED_FAILURES = (StackError, ServiceFailed, DemoTimeout, CapibusError)
SCENES: dict[str, type[session.Story]] = {
    "azimuth": Azimuth,
    "metalstack": MetalStack,
    "assisted": Assisted,
    "ladybug": Ladybug,
}


@dataclass
class Demo:
    """Everything the demo started, so one cleanup can stop it whatever happened."""

    workdir: Path
    keep_running: bool
    story: session.Story
    services: Services = field(default_factory=Services)
    stack: LocalStack | None = None

    def run(self) -> None:
        heading("0. Binaries and the local stack")
        bin_dir = ensure_binaries()
        self.stack = LocalStack(self.workdir, bin_dir=bin_dir, use_env_stack=False)
        self.stack.start()
        note(f"etcd, kube-apiserver, kube-controller-manager, nats, redis up in {self.workdir}")
        self.story.prepare(self.stack)
        # Printed now rather than at the end: the stack is gone by then unless --keep-running.
        note(f"kubectl: {session.kubectl_example(self.stack, bin_dir, self.story)}")
        try:
            asyncio.run(
                session.run(
                    self.stack,
                    self.services,
                    self.workdir,
                    bin_dir,
                    self.story,
                    keep_running=self.keep_running,
                )
            )
        finally:
            # Closing the event loop reset SIGTERM to the default (die on the spot).
            signal.signal(signal.SIGTERM, _interrupt)

    def cleanup(self) -> bool:
        """Stop services, then the stack; True when nothing of ours is left running."""
        with _signals_ignored():
            heading("Shutting down")
            killed = self.services.stop_all()
            for name in killed:
                say(f"   {name} ignored SIGTERM for {STOP_TIMEOUT:.0f}s and was killed", RED)
            note(f"services stopped: {', '.join(s.name for s in self.services.started) or '-'}")
            if self.stack is not None:
                self.stack.stop()
                note("stack stopped")
            left = self.services.survivors() + leftovers(self.workdir)
            for line in left:
                say(f"   still running: {line}", RED)
            if not left:
                note("no processes left behind (checked process groups and ps)")
            return not left


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    temporary = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="capibus-demo-")) if temporary else args.workdir
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    demo = Demo(workdir=workdir, keep_running=args.keep_running, story=SCENES[args.scene]())
    status = 1
    try:
        demo.run()
        status = 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("\ninterrupted", BOLD)
        # With --keep-running, Ctrl-C is the expected way to finish.
        status = 0 if args.keep_running else 130
    except EXPECTED_FAILURES as exc:
        say(f"\ndemo failed: {type(exc).__name__}: {exc}", RED, BOLD)
    except Exception:
        traceback.print_exc()  # a bug in the demo or a service: the whole trace helps
    finally:
        clean = demo.cleanup()
    return _finish(status if clean else 1, workdir, temporary)


def _finish(status: int, workdir: Path, temporary: bool) -> int:
    if status in (0, 130) and temporary:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        note(f"logs and data kept in {workdir}")
    ok = status == 0
    say("demo finished" if ok else f"demo ended with status {status}", GREEN if ok else RED, BOLD)
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="An Azimuth Cluster (or a metal-stack, OpenShift Assisted or CB-Ladybug"
        " one) from creation to Ready and back to nothing, live.",
    )
    parser.add_argument(
        "--scene",
        choices=tuple(SCENES),
        default="azimuth",
        help="the story: an Azimuth Cluster (default), a Cluster API cluster on metal-stack, an"
        " OpenShift cluster installed by OpenShift Assisted on bare metal, or a CB-Ladybug"
        " cluster on CB-Tumblebug VMs bootstrapped over SSH",
    )
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="after the story, keep the stack, services and feed up until Ctrl-C",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep logs and data here (default: a temporary directory)"
    )
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Cleanup must finish: an interrupted cleanup is what leaves orphans behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
