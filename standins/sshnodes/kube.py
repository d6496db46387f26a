"""kubeadm and kubectl on a fake node, acting on the farm's shared clusters.

``k8s-init.sh`` (upstream ``src/scripts/k8s-init.sh``) runs ``kubeadm init --upload-certs``
with ``controlPlaneEndpoint <public IP>:<port>``; its output here is kubeadm's own text
(v1.23), with the success sentence and the two join commands upstream extracts line by line
(``src/core/service/provisioner.go``): the control-plane one over three lines, the worker one
over two. ``kubeadm join`` checks the endpoint, token, CA hash and (for a control plane) the
certificate key against the cluster that init made, as kubeadm's discovery would, and fails
with kubeadm's own messages otherwise. A node that inits or joins becomes a ``Node`` in the
workload API server before the state records it, so a failed API call leaves nothing half
done. ``kubectl`` works only with ``--kubeconfig=/etc/kubernetes/admin.conf`` on a node that
holds it (the one that ran init, or a joined control plane).
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable

import yaml

from standins.sshnodes import cluster as shared
from standins.sshnodes.cluster import Json, Workload, WorkloadError
from standins.sshnodes.node import Node
from standins.sshnodes.outcome import Outcome, fail, ok

ADMIN_CONF = "/etc/kubernetes/admin.conf"
INIT_ARGS = 7  # podCidr serviceCidr dnsDomain publicIP privateIP port serviceType
SUCCESS = "Your Kubernetes control-plane has initialized successfully!"
JOINED = "This node has joined the cluster"
NO_KUBEADM = "sudo: kubeadm: command not found"
REFUSED = (
    "The connection to the server localhost:8080 was refused - did you specify the right "
    "host or port?"
)


def init(node: Node, args: list[str], *, etcd: bool) -> Outcome:
    """``cd /tmp;./k8s-init.sh <7 args>`` (``k8s-init-etcd.sh``: the etcd IPs follow)."""
    state = node.state()
    if not state.get("bootstrapped"):
        return fail(
            f"./k8s-init{'-etcd' if etcd else ''}.sh: line 2: kubeadm: command not found", 127
        )
    if len(args) < INIT_ARGS or (etcd and len(args) == INIT_ARGS):
        return fail("kubeadm init: missing arguments")
    public_ip, private_ip, port = args[3], args[4], args[5]
    endpoint = f"{public_ip}:{port}"
    version = f"v{state.get('kubernetesVersion', '1.23.13')}"
    if node.knobs().init_without_success:
        return ok(_init_head(version) + _init_stalled())
    with shared.locked(node.root) as world:
        if shared.cluster_of(world, node.address) is not None:
            return fail(_preflight_failed(version), stdout=_init_head(version)[:120])
        cluster = {
            "endpoint": endpoint,
            "leader": state["hostname"],
            "version": version,
            "tokens": [_token()],
            "caHash": "sha256:" + secrets.token_hex(32),
            "certificateKey": secrets.token_hex(32),
            "nodes": {},
            "admins": [node.address],
            "applied": [],
            "secrets": [],
            "podCidr": args[0],
            "serviceCidr": args[1],
            "advertise": public_ip if args[6] != "single" else private_ip,
        }
        failed = _register(node, cluster, state["hostname"], "control-plane")
        if failed:
            return failed
        world["clusters"][endpoint] = cluster
    return ok(_init_head(version) + _init_success(cluster))


def join(node: Node, args: list[str]) -> Outcome:
    """``kubeadm join <ep> --token T --discovery-token-ca-cert-hash H [--control-plane ...]``."""
    state = node.state()
    if not state.get("bootstrapped"):
        return fail(NO_KUBEADM)
    options = _options(args)
    endpoint = next((a for a in args if not a.startswith("-") and a not in options.values()), "")
    if node.knobs().join_fail:
        return fail(
            "error execution phase kubelet-start: error uploading crisocket: timed out waiting "
            "for the condition",
            stdout="[preflight] Running pre-flight checks\n",
        )
    control_plane = "--control-plane" in args
    with shared.locked(node.root) as world:
        if shared.cluster_of(world, node.address) is not None:
            return fail(_join_preflight_failed())
        cluster = world["clusters"].get(endpoint)
        refusal = _discovery(endpoint, cluster, options, control_plane)
        if refusal or cluster is None:
            return refusal or fail("unreachable")
        role = "control-plane" if control_plane else "worker"
        failed = _register(node, cluster, state["hostname"], role)
        if failed:
            return failed
        if control_plane:
            cluster["admins"].append(node.address)
    return ok(_join_success(control_plane))


def token_create(node: Node, args: list[str]) -> Outcome:
    """``kubeadm token create --print-join-command`` on a node holding admin.conf."""
    if not node.state().get("bootstrapped"):
        return fail(NO_KUBEADM)
    with shared.locked(node.root) as world:
        found = shared.cluster_administered_by(world, node.address)
        if found is None:
            return fail(
                f"failed to load admin kubeconfig: open {ADMIN_CONF}: no such file or directory\n"
                "To see the stack trace of this error execute with --v=5 or higher"
            )
        endpoint, cluster = found
        token = _token()
        cluster["tokens"].append(token)
    if "--print-join-command" not in args:
        return ok(token + "\n")
    return ok(
        f"kubeadm join {endpoint} --token {token} "
        f"--discovery-token-ca-cert-hash {cluster['caHash']} \n"
    )


def upload_certs(node: Node, args: list[str]) -> Outcome:
    """``kubeadm init phase upload-certs --upload-certs`` on a node holding admin.conf: a new
    certificate key (kubeadm's expire after two hours), which control-plane joins must then
    present; a provisioner resuming joins after the init's key expired asks for one."""
    if "--upload-certs" not in args:
        return fail("error: the --upload-certs flag is required to upload the certificates")
    with shared.locked(node.root) as world:
        found = shared.cluster_administered_by(world, node.address)
        if found is None:
            return fail(
                f"failed to load admin kubeconfig: open {ADMIN_CONF}: no such file or directory\n"
                "To see the stack trace of this error execute with --v=5 or higher"
            )
        _, cluster = found
        cluster["certificateKey"] = secrets.token_hex(32)
    return ok(
        '[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the '
        '"kube-system" Namespace\n'
        f"[upload-certs] Using certificate key:\n{cluster['certificateKey']}\n"
    )


def admin_conf(node: Node) -> str | None:
    """The kubeconfig at /etc/kubernetes/admin.conf: the workload API server's, once held."""
    if shared.cluster_administered_by(shared.read(node.root), node.address) is None:
        return None
    if node.kubeconfig is None:
        return _placeholder_kubeconfig(node)
    return node.kubeconfig.read_text()


def kubectl(node: Node, args: list[str], cwd: str) -> Outcome:
    if not node.state().get("bootstrapped"):
        return fail("sudo: kubectl: command not found")
    rest = [a for a in args if a not in (f"--kubeconfig={ADMIN_CONF}",)]
    if "--kubeconfig" in rest:
        at = rest.index("--kubeconfig")
        if rest[at + 1 : at + 2] == [ADMIN_CONF]:
            del rest[at : at + 2]
    if len(rest) == len(args):
        return fail(REFUSED)
    with shared.locked(node.root) as world:
        found = shared.cluster_administered_by(world, node.address)
        if found is None:
            return fail(f"error: stat {ADMIN_CONF}: no such file or directory")
        verb = rest[0] if rest else ""
        handler = KUBECTL.get(verb)
        if handler is None:
            return fail(f'error: unknown command "{verb}" for "kubectl"')
        return handler(node, found[1], rest[1:], cwd)


def _label(node: Node, cluster: Json, args: list[str], cwd: str, *, field: str) -> Outcome:
    words = _positional(args)
    overwrite = "--overwrite" in args
    if len(words) < 3 or words[0] not in ("node", "nodes", "no"):
        return fail(f"error: kubectl {field}: only 'nodes <name> key=value...' is emulated")
    name, pairs = words[1], words[2:]
    entry = shared.node_named(cluster, name)
    if entry is None:
        return fail(f'Error from server (NotFound): nodes "{name}" not found')
    current: dict[str, str] = entry.setdefault(field, {})
    changes: dict[str, str | None] = {}
    for pair in pairs:
        if pair.endswith("-") and "=" not in pair:
            changes[pair[:-1]] = None
            continue
        key, _, value = pair.partition("=")
        if key in current and current[key] != value and not overwrite:
            return fail(
                f"error: '{key}' already has a value ({current[key]}), and --overwrite is false"
            )
        changes[key] = value
    failed = _workload(node, lambda w: w.patch(name, {"metadata": {field: changes}}))
    if failed:
        return failed
    for key, change in changes.items():
        if change is None:
            current.pop(key, None)
        else:
            current[key] = change
    verb = "labeled" if field == "labels" else "annotated"
    return ok(f"node/{name} {verb}\n")


def _apply(node: Node, cluster: Json, args: list[str], cwd: str) -> Outcome:
    sources = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-f", "--filename")]
    if not sources:
        return fail("error: must specify one of -f and -k")
    out = []
    for source in sources:
        if source.startswith(("http://", "https://")):
            out.append(f"(remote manifest {source}) applied")
        else:
            target = node.local(source, cwd)
            if not target.is_file():
                return fail(f'error: the path "{source}" does not exist')
            try:
                docs = [d for d in yaml.safe_load_all(target.read_text()) if isinstance(d, dict)]
            except yaml.YAMLError as exc:
                return fail(f"error: error parsing {source}: {exc}")
            verb = "configured" if source in cluster["applied"] else "created"
            out += [f"{_ref(d)} {verb}" for d in docs]
        cluster["applied"].append(source)
    return ok("".join(line + "\n" for line in out))


def _create(node: Node, cluster: Json, args: list[str], cwd: str) -> Outcome:
    words = _positional(args)
    if len(words) < 3 or words[0] != "secret":
        return fail("error: kubectl create: only 'secret generic <name>' is emulated")
    name = words[2]
    for arg in args:
        if arg.startswith("--from-file="):
            path = arg.split("=")[-1]
            if not node.local(path, cwd).is_file():
                return fail(f"error: error reading {path}: no such file or directory")
    if name in cluster["secrets"]:
        return fail(f'error: failed to create secret secrets "{name}" already exists')
    cluster["secrets"].append(name)
    return ok(f"secret/{name} created\n")


def _drain(node: Node, cluster: Json, args: list[str], cwd: str) -> Outcome:
    name = next(iter(_positional(args)), "")
    entry = shared.node_named(cluster, name)
    if entry is None:
        return fail(f'Error from server (NotFound): nodes "{name}" not found')
    failed = _workload(node, lambda w: w.patch(name, {"spec": {"unschedulable": True}}))
    if failed:
        return failed
    entry["drained"] = True
    return ok(f"node/{name} cordoned\nnode/{name} drained\n")


def _delete(node: Node, cluster: Json, args: list[str], cwd: str) -> Outcome:
    words = _positional(args)
    if words[:1] == ["all"] and "--all" in args:
        cluster["deletedAll"] = cluster.get("deletedAll", 0) + 1
        return ok('service "kubernetes" deleted\n')
    if len(words) < 2 or words[0] not in ("node", "nodes", "no"):
        return fail("error: kubectl delete: only 'node <name>' and 'all --all' are emulated")
    out = []
    for name in words[1:]:
        if shared.node_named(cluster, name) is None:
            return fail(f'Error from server (NotFound): nodes "{name}" not found')
        failed = _workload(node, _deleter(name))
        if failed:
            return failed
        del cluster["nodes"][name]
        out.append(f'node "{name}" deleted\n')
    return ok("".join(out))


def _get(node: Node, cluster: Json, args: list[str], cwd: str) -> Outcome:
    words = _positional(args)
    if words[:1] not in (["node"], ["nodes"], ["no"]):
        return fail("error: kubectl get: only nodes are emulated")
    names = sorted(cluster["nodes"])
    if ("-o" in args and args[args.index("-o") + 1 :][:1] == ["name"]) or "-oname" in args:
        return ok("".join(f"node/{n}\n" for n in names))
    rows = [f"{'NAME':<24}STATUS   ROLES           AGE   VERSION"]
    for name in names:
        role = cluster["nodes"][name]["role"]
        roles = "control-plane" if role == "control-plane" else "<none>"
        rows.append(f"{name:<24}Ready    {roles:<15} 1m    {cluster['version']}")
    return ok("\n".join(rows) + "\n")


KUBECTL: dict[str, Callable[[Node, Json, list[str], str], Outcome]] = {
    "label": lambda n, c, a, d: _label(n, c, a, d, field="labels"),
    "annotate": lambda n, c, a, d: _label(n, c, a, d, field="annotations"),
    "apply": _apply,
    "create": _create,
    "drain": _drain,
    "delete": _delete,
    "get": _get,
}


def _register(node: Node, cluster: Json, name: str, role: str) -> Outcome | None:
    control_plane = role == "control-plane"
    failed = _workload(
        node, lambda w: w.register(name, address=node.address, control_plane=control_plane)
    )
    if failed:
        return failed
    cluster["nodes"][name] = {"address": node.address, "role": role, "vm": node.vm}
    return None


def _workload(node: Node, call: Callable[[Workload], None]) -> Outcome | None:
    """Run ``call`` against the workload API server; an Outcome when it failed."""
    if node.kubeconfig is None:
        return None
    try:
        call(Workload(node.kubeconfig))
    except WorkloadError as exc:
        return fail(f"Unable to connect to the server: {exc}")
    return None


def _discovery(
    endpoint: str, cluster: Json | None, options: dict[str, str], control_plane: bool
) -> Outcome | None:
    if cluster is None:
        return fail(
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            f'Get "https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info?'
            f'timeout=10s": dial tcp {endpoint}: connect: connection refused'
        )
    token = options.get("--token", "")
    if token not in cluster["tokens"]:
        token_id = token.split(".")[0]
        return fail(
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            "could not find a JWS signature in the cluster-info ConfigMap for token ID "
            f'"{token_id}"'
        )
    digest = options.get("--discovery-token-ca-cert-hash", "")
    if digest != cluster["caHash"]:
        return fail(
            "error execution phase preflight: couldn't validate the identity of the API Server: "
            f"cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "
            f'"{cluster["caHash"]}" are pinned'
        )
    if control_plane and options.get("--certificate-key") != cluster["certificateKey"]:
        return fail(
            "error execution phase control-plane-prepare/download-certs: error downloading "
            "certs: error decoding certs: cipher: message authentication failed"
        )
    return None


def _options(args: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            key, _, value = arg.partition("=")
            found[key] = value
        elif arg in ("--token", "--discovery-token-ca-cert-hash", "--certificate-key"):
            found[arg] = args[i + 1] if i + 1 < len(args) else ""
    return found


def _positional(args: list[str]) -> list[str]:
    """The arguments that are not options nor the value of ``-n``/``--namespace``."""
    words: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-n", "--namespace", "-o", "--output"):
            skip = True
        elif not arg.startswith("-"):
            words.append(arg)
    return words


def _deleter(name: str) -> Callable[[Workload], None]:
    return lambda workload: workload.delete(name)


def _token() -> str:
    """A bootstrap token as kubeadm makes them: ``[a-z0-9]{6}.[a-z0-9]{16}``."""
    alphabet = string.ascii_lowercase + string.digits

    def pick(n: int) -> str:
        return "".join(secrets.choice(alphabet) for _ in range(n))

    return f"{pick(6)}.{pick(16)}"


def _ref(doc: Json) -> str:
    kind = str(doc.get("kind", "object")).lower()
    name = (doc.get("metadata") or {}).get("name", "unnamed")
    return f"{kind}/{name}"


def _init_head(version: str) -> str:
    return (
        f"[init] Using Kubernetes version: {version}\n"
        "[preflight] Running pre-flight checks\n"
        "[preflight] Pulling images required for setting up a Kubernetes cluster\n"
        '[certs] Using certificateDir folder "/etc/kubernetes/pki"\n'
        '[certs] Generating "ca" certificate and key\n'
        '[certs] Generating "apiserver" certificate and key\n'
        '[kubeconfig] Writing "admin.conf" kubeconfig file\n'
        "[kubelet-start] Starting the kubelet\n"
        '[control-plane] Creating static Pod manifest for "kube-apiserver"\n'
        '[etcd] Creating static Pod manifest for local etcd in "/etc/kubernetes/manifests"\n'
        "[wait-control-plane] Waiting for the kubelet to boot up the control plane as static "
        'Pods from directory "/etc/kubernetes/manifests". This can take up to 4m0s\n'
    )


def _init_stalled() -> str:
    return (
        "[kubelet-check] Initial timeout of 40s passed.\n\n"
        "\tUnfortunately, an error has occurred:\n"
        "\t\ttimed out waiting for the condition\n\n"
        "\tThis error is likely caused by:\n"
        "\t\t- The kubelet is not running\n"
    )


def _init_success(cluster: Json) -> str:
    endpoint, token, digest = cluster["endpoint"], cluster["tokens"][0], cluster["caHash"]
    return (
        "[apiclient] All control plane components are healthy after 12.503 seconds\n"
        '[upload-certs] Storing the certificates in Secret "kubeadm-certs" in the '
        '"kube-system" Namespace\n'
        f"[upload-certs] Using certificate key:\n{cluster['certificateKey']}\n"
        f"[bootstrap-token] Using token: {token}\n"
        "[addons] Applied essential addon: CoreDNS\n"
        "[addons] Applied essential addon: kube-proxy\n\n"
        f"{SUCCESS}\n\n"
        "To start using your cluster, you need to run the following as a regular user:\n\n"
        "  mkdir -p $HOME/.kube\n"
        "  sudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config\n"
        "  sudo chown $(id -u):$(id -g) $HOME/.kube/config\n\n"
        "Alternatively, if you are the root user, you can run:\n\n"
        "  export KUBECONFIG=/etc/kubernetes/admin.conf\n\n"
        "You should now deploy a pod network to the cluster.\n"
        'Run "kubectl apply -f [podnetwork].yaml" with one of the options listed at:\n'
        "  https://kubernetes.io/docs/concepts/cluster-administration/addons/\n\n"
        "You can now join any number of the control-plane node running the following "
        "command on each as root:\n\n"
        f"  kubeadm join {endpoint} --token {token} \\\n"
        f"\t--discovery-token-ca-cert-hash {digest} \\\n"
        f"\t--control-plane --certificate-key {cluster['certificateKey']}\n\n"
        "Please note that the certificate-key gives access to cluster sensitive data, keep "
        "it secret!\n"
        "As a safeguard, uploaded-certs will be deleted in two hours; If necessary, you can "
        "use\n"
        '"kubeadm init phase upload-certs --upload-certs" to reload certs afterward.\n\n'
        "Then you can join any number of worker nodes by running the following on each as "
        "root:\n\n"
        f"kubeadm join {endpoint} --token {token} \\\n"
        f"\t--discovery-token-ca-cert-hash {digest} \n"
    )


def _join_success(control_plane: bool) -> str:
    head = (
        "[preflight] Running pre-flight checks\n"
        "[preflight] Reading configuration from the cluster...\n"
        '[kubelet-start] Writing kubelet configuration to file "/var/lib/kubelet/config.yaml"\n'
        "[kubelet-start] Starting the kubelet\n"
        "[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap...\n\n"
    )
    if control_plane:
        return head + (
            f"{JOINED} and a new control plane instance was created:\n\n"
            "* Certificate signing request was sent to apiserver and approval was received.\n"
            "* The Kubelet was informed of the new secure connection details.\n"
            "* Control plane label and taint were applied to the new node.\n"
            "* The Kubernetes control plane instances scaled up.\n"
            "* A new etcd member was added to the local/stacked etcd cluster.\n\n"
            "To start administering your cluster from this node, you need to run the following "
            "as a regular user:\n\n"
            "\tmkdir -p $HOME/.kube\n"
            "\tsudo cp -i /etc/kubernetes/admin.conf $HOME/.kube/config\n"
            "\tsudo chown $(id -u):$(id -g) $HOME/.kube/config\n\n"
            "Run 'kubectl get nodes' to see this node join the cluster.\n"
        )
    return head + (
        f"{JOINED}:\n"
        "* Certificate signing request was sent to apiserver and a response was received.\n"
        "* The Kubelet was informed of the new secure connection details.\n\n"
        "Run 'kubectl get nodes' on the control-plane to see this node join the cluster.\n"
    )


def _preflight_failed(version: str) -> str:
    return (
        "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
        "\t[ERROR Port-6443]: Port 6443 is in use\n"
        "\t[ERROR FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml]: "
        "/etc/kubernetes/manifests/kube-apiserver.yaml already exists\n"
        "[preflight] If you know what you are doing, you can make a check non-fatal with "
        "`--ignore-preflight-errors=...`\n"
        "To see the stack trace of this error execute with --v=5 or higher"
    )


def _join_preflight_failed() -> str:
    return (
        "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
        "\t[ERROR FileAvailable--etc-kubernetes-kubelet.conf]: /etc/kubernetes/kubelet.conf "
        "already exists\n"
        "\t[ERROR Port-10250]: Port 10250 is in use\n"
        "To see the stack trace of this error execute with --v=5 or higher"
    )


def _placeholder_kubeconfig(node: Node) -> str:
    """Without a workload API server the kubeconfig names the endpoint only."""
    found = shared.cluster_administered_by(shared.read(node.root), node.address)
    endpoint = found[0] if found else node.address
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kubernetes", "cluster": {"server": f"https://{endpoint}"}}],
            "users": [{"name": "kubernetes-admin", "user": {"token": "placeholder"}}],
            "contexts": [
                {
                    "name": "kubernetes-admin@kubernetes",
                    "context": {"cluster": "kubernetes", "user": "kubernetes-admin"},
                }
            ],
            "current-context": "kubernetes-admin@kubernetes",
        },
        sort_keys=False,
    )
