"""``capibus``: the operator's command for reading what the services already keep on the bus.

Why a top-level package of its own (``cli``) rather than a service or a module in ``shared``:
it is no service (it consumes nothing durable, holds no lease, runs once and exits), and
``shared`` is the services' adapters and contracts, which a terminal UI has no place in. It
imports ``shared`` only (an import-linter contract says so), so the command reads the streams
through the same subjects, stream names and message models the services write them with, and
cannot drift from them. The one exception is ``replay``, which runs a service's own handlers
and so imports ``services.replay``, only when that subcommand runs.

Layout: ``story`` is pure (filters, merging, the causation tree, ``--since`` parsing),
``render`` turns records into tables, colour or JSON lines, ``streams`` reads the streams
(ephemeral, unacknowledged consumers: reading never disturbs a service's durable consumers),
``status`` reads the durable consumers' info and Redis's leases, ``dlq`` is the dead-letter
subcommands, ``replay`` hands an object's story to ``services.replay``, ``main`` the argument
parsing and the error policy (one readable line and exit 2 when NATS or Redis cannot be
reached).
"""
