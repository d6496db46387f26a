"""What ``capibus`` says when a backing system cannot be reached.

``main`` turns ``Unreachable`` into its one line on stderr and exit code 2, as it does for
NATS (``shared.errors.BusUnavailable``): the message names the system and its address, since a
person debugging a stuck cluster needs to know it is the connection, not the command.
"""

from __future__ import annotations


class Unreachable(Exception):
    """Redis or the API server did not answer (exit code 2); the message is the whole line."""
