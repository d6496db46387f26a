"""What the identity service asks of the Kubernetes API: the Cluster and the Realms it
decides from, server-side applies of the OIDCClient, the Platforms and the users' kubeconfig
Secret (an apply that creates needs ``create`` as well as ``patch``), and the app HelmReleases
its app Platforms follow."""

from __future__ import annotations

from shared.rbac import Rule
from shared.resources import CLUSTER, HELM_RELEASE, OIDC_CLIENT, PLATFORM, REALM, SECRET

RULES = (
    Rule(CLUSTER, "get list", why="the Cluster to converge; the Clusters a Realm change nudges"),
    Rule(REALM, "get list", why="the namespace's Realms, to pick the one a Cluster uses"),
    Rule(
        [OIDC_CLIENT, PLATFORM],
        "get create patch",
        why="reads, then server-side applies, the Cluster's OIDCClient and Platforms (cluster "
        "and app)",
    ),
    Rule(
        SECRET,
        "get create patch",
        why="reads the admin kubeconfig `<cluster>-kubeconfig`, applies the users' "
        "`<cluster>-kubeconfig-user`",
    ),
    Rule(
        HELM_RELEASE,
        "get list",
        why="the app HelmReleases whose Zenith services become app Platforms",
    ),
)
