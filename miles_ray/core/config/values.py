"""The configuration's value forms, checked before the model holds them: Kubernetes quantities, environment
variable and Secret names, the GCS fault tolerance's Redis address and the Secret of its password."""

from __future__ import annotations

import re

QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?")
CPU_QUANTITY = re.compile(r"[0-9]+(\.[0-9]{1,3})?|[0-9]+m")


def cpu_millis(quantity: str) -> int:
    """Millicores of a CPU quantity such as ``32``, ``0.5`` or ``500m``."""
    if quantity.endswith("m"):
        return int(quantity[:-1])
    return round(float(quantity) * 1000)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_OBJECT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# redis://HOST:PORT: HOST a DNS name (e.g. redis.ns.svc.cluster.local) or an IPv4 address; PORT 1-65535
DNS_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")
GCS_FT_PASSWORD_KEY = "password"  # the key of the Redis password in its Secret unless NAME:KEY says another
NO_PASSWORD = "none"  # gcs_ft_password_secret for a Redis without a password


def parse_redis_address(value: str) -> tuple[str, int]:
    """``redis://HOST:PORT`` -> (HOST, PORT). ValueError (naming the form, never echoing more than 80 characters
    of the value) for anything else: another scheme, a user or password in the URL, a path, a missing or bad port."""
    if "@" in value:  # a user or password in the URL: never echo it
        raise ValueError("the Redis address must not carry a user or password: give redis://HOST:PORT and the "
                         "password's Secret with --gcs-ft-password-secret NAME[:KEY]")
    shown = value[:80].encode("unicode_escape").decode()
    bad = ValueError(f"{shown!r} is not redis://HOST:PORT (e.g. redis://redis.ns.svc.cluster.local:6379; the "
                     "password comes from --gcs-ft-password-secret, never the URL)")
    m = re.fullmatch(r"redis://([^:/@\s]+):([0-9]{1,5})", value) if value.isascii() else None
    if m is None:
        raise bad
    host, port = m.group(1).lower(), int(m.group(2))
    if not 1 <= port <= 65535 or not DNS_NAME.fullmatch(host):
        raise bad
    if re.fullmatch(r"[0-9.]+", host):  # looks numeric: must then be a valid IPv4 address
        parts = host.split(".")
        if len(parts) != 4 or any(int(p) > 255 or (len(p) > 1 and p[0] == "0") for p in parts):
            raise bad
    return host, port


def parse_password_secret(value: str) -> tuple[str, str] | None:
    """``NAME[:KEY]`` -> (NAME, KEY) (KEY default :data:`GCS_FT_PASSWORD_KEY`); None for ``none``."""
    if value == NO_PASSWORD:
        return None
    name, _, key = value.partition(":")
    key = key or GCS_FT_PASSWORD_KEY
    if len(name) > 253 or not SECRET_OBJECT.fullmatch(name) or len(key) > 253 or not SECRET_KEY.fullmatch(key):
        raise ValueError("must name a Kubernetes Secret as NAME[:KEY] (a DNS-1123 name, optionally ':' and a key of "
                         f"letters, digits, '-', '_' or '.'; default key {GCS_FT_PASSWORD_KEY!r}), or be "
                         f"{NO_PASSWORD!r} for a Redis without a password")
    return name, key
