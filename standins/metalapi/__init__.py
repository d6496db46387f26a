"""Stand-in for metal-stack's metal-api, run as its own process: ``python -m standins.metalapi``.

What it is faithful to, and where it stops: the 14 routes cluster-api-provider-metalstack
calls (through metal-go v0.11.5) plus ``GET`` of a network and an IP, with metal-api's JSON
names, success codes and error body ``{"statuscode", "message"}``, and the server rules a
provider can run into (metal-api ``cmd/metal-api/internal/service/{network,ip,machine,
firewall}-service.go`` and ``async-actor.go``, v0.15.3): carving child prefixes, network free
refused (422) while IPs are in use, IP types and ownership, every allocation check, the
ephemeral-IP release on machine free, and the provisioning events. HMAC authentication is
``metal-stack/security`` ``mac.go``'s (``auth``). State is in memory, on one event loop.

Modules, from the inside out:

- ``ipam``: prefixes and addresses with go-ipam's accounting;
- ``model``: entities; ``world``: the state, seeds, network and IP rules;
- ``allocation``: the checks before an allocation; ``machines``: allocate, free, steps, find;
- ``render``: metal-api JSON; ``auth``: HMAC verification;
- ``lifecycle``: timers (provisioning, reboot) and the listener hook;
- ``registrar``: Nodes in a workload cluster for machines that phoned home;
- ``server``: aiohttp routes, fault knobs, request counts; ``__main__``: the process.

Knobs are ``STANDIN_METALAPI_*`` environment variables (``knobs``, ``standins/README.md``).
"""
