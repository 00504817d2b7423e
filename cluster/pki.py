"""The control plane's PKI (the ``cryptography`` package; openssl is not needed): the CAs, serving and client
certificates, and a kubeconfig per user."""

from __future__ import annotations

import base64
import datetime as _dt
import ipaddress
import json
from pathlib import Path
from typing import Any

from testbed import SERVICE_IP

def make_pki(pki: Path, extra_clients: list[tuple[str, str, list[str]]] | tuple = ()) -> None:
    """CA, front-proxy CA, serving and client certificates; ``extra_clients``: more client
    certificates as (file stem, CN, groups)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    until = now + _dt.timedelta(days=365)

    def write_key(name: str, key: Any) -> None:
        path = pki / f"{name}.key"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def write_cert(name: str, cert: Any) -> None:
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def make_ca(name: str, cn: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_key(name, key)
        write_cert(name, cert)
        return key, subject

    ca_key, ca_name = make_ca("ca", "miles-ray-fakegpu-ca")
    # Aggregation layer (request-header authentication): its own CA, as kubeadm does.
    fp_key, fp_name = make_ca("front-proxy-ca", "miles-ray-fakegpu-front-proxy-ca")

    def leaf(
        name: str,
        cn: str,
        orgs: list[str],
        server: bool,
        sans: list[Any] | None = None,
        issuer: tuple[Any, Any] | None = None,
    ) -> None:
        issuer_key, issuer_name = issuer or (ca_key, ca_name)
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        write_key(name, key)
        write_cert(name, b.sign(issuer_key, hashes.SHA256()))

    leaf(
        "apiserver",
        "kube-apiserver",
        [],
        server=True,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address(SERVICE_IP)),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
        ],
    )
    # Client identities. Components that Kubernetes bootstraps RBAC for use their own users; kwok
    # and the KubeRay operator stand in for a node fleet and an installed operator: cluster admins.
    leaf("admin", "miles-ray-admin", ["system:masters"], server=False)
    leaf("kube-controller-manager", "system:kube-controller-manager", [], server=False)
    leaf("kube-scheduler", "system:kube-scheduler", [], server=False)
    leaf("kwok", "kwok-controller", ["system:masters"], server=False)
    leaf("kuberay-operator", "kuberay-operator", ["system:masters"], server=False)
    leaf("front-proxy-client", "front-proxy-client", [], server=False, issuer=(fp_key, fp_name))
    for stem, cn, orgs in extra_clients:
        leaf(stem, cn, orgs, server=False)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key("sa", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fakegpu",
                "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki / f"{user}.crt"),
                    "client-key-data": b64(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "fakegpu", "context": {"cluster": "fakegpu", "user": user}}],
        "current-context": "fakegpu",
    }
    # JSON is valid YAML; every kubeconfig loader accepts it.
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)
