"""FAULT INJECTED BY THE TEST BACKEND (tests/infra/faulty_nodes.py), never part of miles-ray.

Python imports ``sitecustomize`` at start-up, so every Python process of an extra Ray worker node started with
this directory on PYTHONPATH loads it -- the raylet's agents and the Ray workers that run comm-check's actors on
that node, and no process on any other node. With ``MILESRAY_TEST_COMM_FAULT`` set it breaks the comm check's
ring on this node only, the way a real node fails:

* ``closed-port``: the ring's listening socket is bound and announced but never listens, so the peer that
  must connect to this node is refused (a firewall or a dead listener);
* ``no-start``: the comm check's actor blocks while binding its listener, so it never finishes starting (a hung
  node).

Only calls made from the comm check's own code (``comm_check.py``) are affected.
"""

import os
import socket
import sys
import time

FAULT = os.environ.get("MILESRAY_TEST_COMM_FAULT")


def _from_comm_check() -> bool:
    caller = sys._getframe(2)  # 0: this function, 1: the patched socket method, 2: its caller
    return caller.f_code.co_filename.endswith("comm_check.py")


if FAULT == "closed-port":
    _listen = socket.socket.listen

    def _refusing_listen(self, *args):
        if _from_comm_check():
            return None  # bound, announced, never listening: connections are refused
        return _listen(self, *args)

    socket.socket.listen = _refusing_listen
elif FAULT == "no-start":
    _bind = socket.socket.bind

    def _hanging_bind(self, address):
        if _from_comm_check():
            time.sleep(3600)  # the actor's constructor never returns
        return _bind(self, address)

    socket.socket.bind = _hanging_bind
