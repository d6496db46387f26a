"""The Azimuth story, the default scene: the portal's objects, convergence, what the services
made, a spec change, a bad message and the deletion (steps 2 to 8 of ``demo.__main__``)."""

from __future__ import annotations

from pathlib import Path

from demo import cluster, outcome, portal, story, system
from demo.scene import Scene
from demo.style import heading
from testenv.harness import LocalStack


class Azimuth:
    def prepare(self, stack: LocalStack) -> None:
        """Nothing beyond the stack itself."""

    def kubectl_args(self) -> tuple[str, ...]:
        # The full resource name: plain ``clusters`` may resolve to the stand-ins' CAPI kind.
        return ("get", "clusters.azimuth.stackhpc.com", "-A")

    def access_notes(self, bin_dir: Path) -> list[str]:
        return ["a new Cluster needs no Lease: drop leaseName from demo/manifests/40-cluster.yaml"]

    async def play(self, scene: Scene) -> None:
        heading("2. Seven services and the stand-ins, as real processes")
        await system.start(scene)

        heading("3. The portal creates a tenancy's objects (demo/manifests)")
        ref = await portal.create_objects(scene.kube, scene.feed)
        await cluster.show(scene, ref)

        heading(f"4. Cluster {ref.key} converges: identity, lease, Zenith, Helm, machines")
        await cluster.until_converged(scene, ref)
        await cluster.show(scene, ref)

        heading("5. What the services made")
        await outcome.show_outcome(scene, ref)

        heading("6. A spec change: one more worker in md-0")
        await story.scale(scene, ref)

        heading("7. A malformed message on the Cluster's status subject")
        await story.send_bad_message(scene, ref)

        heading(f"8. The portal deletes Cluster {ref.key}")
        await story.delete(scene, ref)
