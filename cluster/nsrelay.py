#!/usr/bin/env python3
"""Relay TCP ports from the machine's loopback into a network namespace (stdlib only).

    python cluster/nsrelay.py --netns /proc/<pid>/ns/net --port 6443 [--port 2379 ...]

For each ``--port P`` it listens on 127.0.0.1:P in the namespace it was started in (the machine's),
then enters the target network namespace (``setns``) and forwards every accepted connection to
127.0.0.1:P THERE. Sockets belong to the namespace they were created in: the listeners stay on the
machine's loopback, every outgoing connection is made inside the namespace. No interface, address or
route is added anywhere, so the processes of the real-pod cluster (apiserver, kubelets, pods) keep
no path out of their namespace, while the tests and ``kubectl`` on the machine reach the apiserver
(and the control plane's health ports) at the same ``https://127.0.0.1:P`` the cluster uses inside.

Two more directions, for what PODS of the real-pod cluster must reach (both listen INSIDE the namespace,
at an address the run put on the namespace's loopback, so pods reach them through their node's bridge):

- ``--inside IP:PORT=TPORT``: connect to 127.0.0.1:TPORT in the namespace too. The in-cluster API
  address ``10.96.0.1:443`` (the ``kubernetes`` Service, which nothing else serves: there is no
  kube-proxy) relayed to the apiserver, for Polyaxon's sidecar and anything else using the in-cluster
  client config.
- ``--outward IP:PORT=TPORT``: connect to 127.0.0.1:TPORT on the MACHINE's loopback: a server the tests
  run on the machine (the Polyaxon API server) made reachable from pods, and only that port.

Prints ``ready`` on stdout once listening; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import selectors
import signal
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def enter_netns(path: str) -> None:
    """setns(2) the calling thread (and the threads it starts later) into the namespace at ``path``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways between ``a`` and ``b`` until either side closes."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        sel.close()
        a.close()
        b.close()


def _serve(listener: socket.socket, port: int) -> None:
    """Accept on ``listener``; connect to 127.0.0.1:``port`` in the namespace of the calling thread."""
    while True:
        conn, _ = listener.accept()
        try:
            inner = socket.create_connection(("127.0.0.1", port), timeout=5)
            inner.settimeout(None)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=_pump, args=(conn, inner), daemon=True).start()


def _listen(ip: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(64)
    return s


def _mapping(text: str) -> tuple[str, int, int]:
    """``IP:PORT=TPORT`` -> (IP, PORT, TPORT)."""
    left, _, target = text.partition("=")
    ip, _, port = left.rpartition(":")
    if not ip or not port.isdigit() or not target.isdigit():
        raise argparse.ArgumentTypeError(f"expected IP:PORT=TPORT, got {text!r}")
    return ip, int(port), int(target)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nsrelay.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--netns", required=True, help="network namespace file, e.g. /proc/<pid>/ns/net")
    p.add_argument("--port", type=int, action="append", default=[],
                   help="port to relay from the machine's loopback into the namespace (repeatable)")
    p.add_argument("--inside", type=_mapping, action="append", default=[],
                   help="IP:PORT=TPORT: listen in the namespace, connect to its 127.0.0.1:TPORT (repeatable)")
    p.add_argument("--outward", type=_mapping, action="append", default=[],
                   help="IP:PORT=TPORT: listen in the namespace, connect to the machine's 127.0.0.1:TPORT")
    a = p.parse_args(argv)
    if not (a.port or a.inside or a.outward):
        p.error("nothing to relay: give --port, --inside or --outward")
    listeners = [(_listen("127.0.0.1", port), port) for port in a.port]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if a.outward:
        # Sockets belong to the namespace of the thread that creates them: bind these in the cluster's
        # namespace, come back, and serve them from threads started here (their connects are the machine's).
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        enter_netns(a.netns)
        outward = [(_listen(ip, port), target) for ip, port, target in a.outward]
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.setns(home, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns(back to the machine's namespace): {os.strerror(err)}")
        os.close(home)
        for s, target in outward:
            threading.Thread(target=_serve, args=(s, target), daemon=True).start()
    if a.port or a.inside:
        enter_netns(a.netns)  # after the machine's listeners exist: they stay on the machine's loopback
        listeners += [(_listen(ip, port), target) for ip, port, target in a.inside]
    for s, port in listeners:
        threading.Thread(target=_serve, args=(s, port), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
