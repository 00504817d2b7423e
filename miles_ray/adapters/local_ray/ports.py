"""TCP ports of a local cluster: only the two a client must know are fixed by us, and those safely.

Ray binds most of a node's ports itself (port 0: raylet, object manager, agents' gRPC, metrics),
which cannot race; the dashboard agents' HTTP port is left to them too (``0``). Three must be
chosen before the head starts: the GCS port (workers join it), the dashboard port (the Jobs API,
``http://127.0.0.1:8265`` when that is free) and the Ray Client server's (Ray insists on one).

A port found free and then released can be taken by someone else before Ray binds it (the head
binds its dashboard tens of seconds later on a busy machine). The usual thief is an outgoing
connection: the kernel picks its local port from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, often 32768-60999), which is also where "bind to port 0
and close" finds ports. So ports are chosen *below* the ephemeral range, where no connect() ever
lands, and a port counts as free when a listener could bind it right now with the same
``SO_REUSEADDR`` semantics Ray's servers use (connections of a dead head lingering in TIME_WAIT do
not make a port busy; a live listener or connection does).
"""

from __future__ import annotations

import random
import socket

from miles_ray.core.errors import ClusterError

PREFERRED_DASHBOARD_PORT = 8265
LOWEST_PORT = 10000
_FALLBACK_EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL


def port_free(port: int) -> bool:
    """Nothing listens on or is connected from ``port`` (any local address); TIME_WAIT does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _candidates() -> list[int]:
    lo, hi = ephemeral_range()
    ranges = [(LOWEST_PORT, lo - 1), (hi + 1, 65535)]
    return [p for a, b in ranges if b >= a for p in range(a, b + 1)]


def pick_port(taken: set[int], preferred: int | None = None) -> int:
    """A free port outside the ephemeral range (``preferred`` when it is free), added to ``taken``."""
    if preferred is not None and preferred not in taken and port_free(preferred):
        taken.add(preferred)
        return preferred
    pool = _candidates()
    for port in random.sample(pool, min(200, len(pool))):
        if port not in taken and port_free(port):
            taken.add(port)
            return port
    raise ClusterError(
        "could not find a free TCP port for the local cluster outside the ephemeral range "
        f"{ephemeral_range()[0]}-{ephemeral_range()[1]}"
    )
