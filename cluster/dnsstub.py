#!/usr/bin/env python3
"""The real-pod cluster's DNS: a small stub answering cluster names from the API server (stdlib only).

    python cluster/dnsstub.py --listen 198.18.0.2 --server https://127.0.0.1:6443 \\
        --ca pki/ca.crt --cert pki/dns-stub.crt --key pki/dns-stub.key

Runs inside the cluster's network namespace; the kubelets write its address as the only
``nameserver`` of every pod's resolv.conf (``clusterDNS``; ``resolvConf: ""``), so no pod ever asks
the machine's resolver. It answers, over UDP and TCP on port 53:

- ``<service>.<namespace>.svc.<domain>``: A records of the ready endpoints of the Service's
  EndpointSlices (headless Services such as KubeRay's head Service resolve to the pod IPs; a
  ClusterIP Service resolves to its endpoints too, since no kube-proxy routes ClusterIPs here);
  a Service with no ready endpoint: an empty answer;
- ``<hostname>.<service>.<namespace>.svc.<domain>``: the endpoint with that hostname;
- ``<a-b-c-d>.<namespace>.pod.<domain>``: the address a.b.c.d;
- anything else: NXDOMAIN at once (there is no upstream: nothing is forwarded anywhere).

It polls EndpointSlices and Services every ``--refresh`` seconds (default 0.5) with its own
client certificate (read-only RBAC). Prints ``ready`` once the first poll succeeded.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.request
from typing import Any

TTL = 5
QTYPE_A = 1
RCODE_NXDOMAIN = 3
RCODE_FORMERR = 1


class Records:
    """Cluster names -> IPv4 addresses, refreshed from the API server."""

    def __init__(self, server: str, ctx: ssl.SSLContext, domain: str):
        self.server = server.rstrip("/")
        self.ctx = ctx
        self.domain = domain.strip(".").lower()
        self.lock = threading.Lock()
        self.services: dict[tuple[str, str], list[str]] = {}  # (ns, svc) -> addresses (maybe empty)
        self.hosts: dict[tuple[str, str, str], list[str]] = {}  # (ns, svc, hostname) -> addresses

    def _get(self, path: str) -> Any:
        req = urllib.request.Request(self.server + path, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=5) as resp:
            return json.loads(resp.read())

    def refresh(self) -> None:
        services: dict[tuple[str, str], list[str]] = {}
        hosts: dict[tuple[str, str, str], list[str]] = {}
        for svc in self._get("/api/v1/services").get("items", []):
            services[(svc["metadata"]["namespace"], svc["metadata"]["name"])] = []
        for es in self._get("/apis/discovery.k8s.io/v1/endpointslices").get("items", []):
            if es.get("addressType") != "IPv4":
                continue
            ns = es["metadata"]["namespace"]
            svc = (es["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
            if not svc or (ns, svc) not in services:
                continue
            for ep in es.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") is False:
                    continue
                addrs = list(ep.get("addresses") or [])
                services[(ns, svc)].extend(addrs)
                if ep.get("hostname"):
                    hosts.setdefault((ns, svc, ep["hostname"]), []).extend(addrs)
        with self.lock:
            self.services = {k: sorted(set(v)) for k, v in services.items()}
            self.hosts = {k: sorted(set(v)) for k, v in hosts.items()}

    def lookup(self, name: str) -> list[str] | None:
        """Addresses for ``name`` ([] = the name exists without an address), None = NXDOMAIN."""
        name = name.strip(".").lower()
        suffix = "." + self.domain
        if not name.endswith(suffix):
            return None
        labels = name[: -len(suffix)].split(".")
        with self.lock:
            if len(labels) == 3 and labels[2] == "svc":
                return self.services.get((labels[1], labels[0]))
            if len(labels) == 4 and labels[3] == "svc":
                return self.hosts.get((labels[2], labels[1], labels[0]))
        if len(labels) == 3 and labels[2] == "pod":
            try:
                return [str(ipaddress.IPv4Address(labels[0].replace("-", ".")))]
            except ValueError:
                return None
        return None


def _parse_question(msg: bytes) -> tuple[str, int, int] | None:
    """(qname, qtype, end offset of the question) of a one-question query, or None."""
    if len(msg) < 12 or struct.unpack("!H", msg[4:6])[0] != 1:
        return None
    labels, i = [], 12
    while True:
        if i >= len(msg):
            return None
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(msg):
            return None
        labels.append(msg[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    if i + 4 > len(msg):
        return None
    qtype = struct.unpack("!H", msg[i : i + 2])[0]
    return ".".join(labels), qtype, i + 4


def answer(records: Records, query: bytes) -> bytes | None:
    """The response to one DNS query (None: not even a header to answer)."""
    if len(query) < 12:
        return None
    qid, flags = struct.unpack("!HH", query[:4])
    rd = flags & 0x0100
    q = _parse_question(query)
    if q is None:
        return struct.pack("!HHHHHH", qid, 0x8000 | rd | RCODE_FORMERR, 0, 0, 0, 0)
    qname, qtype, end = q
    question = query[12:end]
    addrs = records.lookup(qname)
    if addrs is None:
        return struct.pack("!HHHHHH", qid, 0x8400 | rd | RCODE_NXDOMAIN, 1, 0, 0, 0) + question
    rrs = b""
    count = 0
    if qtype == QTYPE_A:
        for a in addrs:
            rrs += struct.pack("!HHHIH", 0xC00C, QTYPE_A, 1, TTL, 4) + socket.inet_aton(a)
            count += 1
    return struct.pack("!HHHHHH", qid, 0x8400 | rd, 1, count, 0, 0) + question + rrs


def serve_udp(sock: socket.socket, records: Records) -> None:
    while True:
        data, peer = sock.recvfrom(4096)
        resp = answer(records, data)
        if resp:
            sock.sendto(resp, peer)


def serve_tcp(sock: socket.socket, records: Records) -> None:
    def one(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                while True:
                    head = conn.recv(2, socket.MSG_WAITALL)
                    if len(head) < 2:
                        return
                    data = conn.recv(struct.unpack("!H", head)[0], socket.MSG_WAITALL)
                    resp = answer(records, data)
                    if not resp:
                        return
                    conn.sendall(struct.pack("!H", len(resp)) + resp)
            except OSError:
                return

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dnsstub.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="IPv4 address to answer on (port 53)")
    p.add_argument("--port", type=int, default=53)
    p.add_argument("--server", required=True, help="API server URL")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--domain", default="cluster.local")
    p.add_argument("--refresh", type=float, default=0.5, help="seconds between two polls")
    a = p.parse_args(argv)

    ctx = ssl.create_default_context(cafile=a.ca)
    ctx.load_cert_chain(a.cert, a.key)
    records = Records(a.server, ctx, a.domain)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((a.listen, a.port))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((a.listen, a.port))
    tcp.listen(32)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    while True:  # the first poll decides readiness
        try:
            records.refresh()
            break
        except OSError as e:
            print(f"dnsstub: waiting for the API server: {e}", file=sys.stderr, flush=True)
            time.sleep(0.5)
    for target, sock in ((serve_udp, udp), (serve_tcp, tcp)):
        threading.Thread(target=target, args=(sock, records), daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(a.refresh)
        try:
            records.refresh()
        except (OSError, ValueError) as e:
            print(f"dnsstub: refresh failed: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
