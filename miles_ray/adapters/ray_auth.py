"""Ray token authentication on the client side: which token goes with a request to a head, and local token files.

A head started with ``RAY_AUTH_MODE=token`` answers 401 to a request without a token and 403 to a wrong one
(Ray >= 2.52). miles-ray sends ``Authorization: Bearer <token>`` on every request to a head it knows the token
of. Where the token comes from:

* a local cluster (``up --backend local``): the token file ``up`` wrote (0600) beside the cluster's state;
  reading the cluster's state makes its token known for its dashboard URL (:func:`remember`);
* a KubeRay head: the Secret its head pod reads ``RAY_AUTH_TOKEN`` from, for the lifetime of the port-forward
  (:func:`using`, by :func:`miles_ray.adapters.ray_head.open_head`);
* any other head given by URL: ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH`` (Ray's own variables).

The token is held in this process's memory only: never in a spec, a run record, a log line or ``-o json``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

from miles_ray.core.errors import ConfigError

TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
MODE_ENV = "RAY_AUTH_MODE"

_lock = threading.Lock()
_known: dict[str, str] = {}  # normalized head URL -> token


def _key(url: str) -> str:
    url = (url or "").strip().rstrip("/")
    return url if "://" in url else "http://" + url


def remember(url: str, token: str | None) -> None:
    """Send ``token`` with every request to the head at ``url`` from now on in this process."""
    if token:
        with _lock:
            _known[_key(url)] = token


@contextlib.contextmanager
def using(url: str, token: str | None) -> Iterator[None]:
    """Send ``token`` with requests to ``url`` inside the block only (a port-forward's URL is reused later)."""
    if not token:
        yield
        return
    key = _key(url)
    with _lock:
        before = _known.get(key)
        _known[key] = token
    try:
        yield
    finally:
        with _lock:
            if before is None:
                _known.pop(key, None)
            else:
                _known[key] = before


def token_from_env(environ: dict[str, str] | None = None) -> str | None:
    """``$RAY_AUTH_TOKEN``, else the contents of ``$RAY_AUTH_TOKEN_PATH`` (None when neither is set)."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    path = env.get(TOKEN_PATH_ENV, "").strip()
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"{TOKEN_PATH_ENV}={path} cannot be read ({e.strerror})",
                          hint=f"point {TOKEN_PATH_ENV} at the Ray token file, or unset it") from None
    if not token:
        raise ConfigError(f"{TOKEN_PATH_ENV}={path} is empty", hint=f"point {TOKEN_PATH_ENV} at the Ray token file")
    return token


def token_for(url: str) -> str | None:
    """The token to send to the head at ``url``: the one known for it, else the environment's."""
    with _lock:
        known = _known.get(_key(url))
    return known or token_from_env()


def headers(url: str) -> dict[str, str]:
    """HTTP headers that authenticate a request to the head at ``url`` (empty when no token is known)."""
    token = token_for(url)
    return {"Authorization": f"Bearer {token}"} if token else {}


# -- local token files ---------------------------------------------------------------------------------


def new_token() -> str:
    """A fresh random token (256 bits, hex: the form Ray's own generator uses)."""
    return secrets.token_hex(32)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable by this user only (0600 from its creation; replaces an old file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_token_file(path: str | Path) -> str | None:
    """The token in ``path``, or None when the file is gone or empty."""
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
