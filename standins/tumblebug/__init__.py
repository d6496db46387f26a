"""Stand-in for CB-Tumblebug v0.7.0, run as its own process: ``python -m standins.tumblebug``.

What CB-Ladybug calls (reference: ``src/core/tumblebug/*.go`` of cloud-barista/cb-ladybug)
and nothing more: namespaces, connection configs, regions, spec and image lookups, the five
MCIR kinds, MCIS create/get/control/delete, VM add/get/delete, NLB, plus a CB-Spider
``anycall`` stub. JSON names, status codes and refusal messages are Tumblebug v0.7.0's
(``src/api/rest/server`` and ``src/core`` at tag v0.7.0 of cloud-barista/cb-tumblebug), with
HTTP basic auth in front as there.

VMs are real: each running VM holds a loopback address (``127.0.0.N``, N from 2, freed when
the VM is terminated) as its ``publicIP``, and the node farm (``standins.sshnodes``) runs a
real sshd there on port 22 that accepts the private key of the VM's sshKey and answers
through the node emulator. ``--no-ssh`` leaves the farm out: VMs are records only.

Modules, from the inside out:

- ``seed``: connections, regions and spec catalogues; ``keys``: sshKey key pairs;
- ``model``: entities, ``TbError``, the address pool and VM faults;
- ``world``: the state and Tumblebug's rules; ``render``: MCIS and VM JSON;
- ``farm``: the node-farm Protocol and its loader;
- ``server``: aiohttp routes, basic auth, fault knobs, request counts; ``__main__``: the
  process.

Knobs are ``STANDIN_TUMBLEBUG_*`` environment variables (``knobs``, ``standins/README.md``)
and ``POST /_standin/faults`` (``server``).
"""


def spider_url(tumblebug_url: str) -> str:
    """Where this stand-in serves CB-Spider's ``anycall``: ``/spider`` beside Tumblebug's base
    path (a provisioner's ``SPIDER_URL``)."""
    return tumblebug_url.rstrip("/").removesuffix("/tumblebug") + "/spider"
