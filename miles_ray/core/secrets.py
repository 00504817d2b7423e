"""Recognise credentials so they never land in plain text in a rendered spec, a run record, job metadata
or a log line. Pure: strings in, a reason (or None) out.

Two checks: a secret-looking variable NAME (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, ...) and a
secret-looking VALUE (known token prefixes such as ``hf_``, ``sk-``, ``AKIA``; URLs with a password;
private keys; JWTs; long high-entropy strings). Credentials belong in Kubernetes Secrets
(``secret_env``) or Polyaxon connections, referenced by name.
"""

from __future__ import annotations

import math
import re
from collections import Counter

# PASSWORD/SECRET/CREDENTIAL anywhere (PGPASSWORD); TOKEN and *_KEY only as a whole '_' component, so
# TOKENIZERS_PARALLELISM or KEYBOARD pass. Names of paths to a credential (..._FILE, ..._PATH) are fine.
SECRET_NAME = re.compile(
    r"(PASSWORD|PASSWD|SECRET|CREDENTIAL)|(^|_)(TOKEN|API_?KEY|ACCESS_KEY|PRIVATE_KEY|AUTH_KEY|SESSION_KEY)(_|$)",
    re.I)
_PATH_NAME = re.compile(r"_(FILE|PATH|DIR|MODE)$", re.I)

# (pattern, what it looks like). Prefixes are those the issuers document for their tokens.
_VALUE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"), "a Hugging Face token (hf_...)"),
    (re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{16,}"), "an API secret key (sk-...)"),
    (re.compile(r"(?<![A-Z0-9])(AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[0-9A-Z]{16}(?![A-Z0-9])"), "an AWS access key id"),
    (re.compile(r"(?<![A-Za-z0-9])(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}"), "a GitHub token"),
    (re.compile(r"(?<![A-Za-z0-9])github_pat_[A-Za-z0-9_]{20,}"), "a GitHub token"),
    (re.compile(r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_\-]{16,}"), "a GitLab token"),
    (re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9\-]{10,}"), "a Slack token"),
    (re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}"), "a Google API key"),
    (re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), "a JSON Web Token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]+:[^/\s@]+@"), "a URL with a password"),
]
_HIGH_ENTROPY_CHARS = re.compile(r"^[A-Za-z0-9+/=_\-]+$")
MIN_SECRET_LEN = 32
MIN_ENTROPY = 4.2  # bits per character; hex (commit ids, digests) tops out at 4.0


def entropy(text: str) -> float:
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _high_entropy(token: str) -> bool:
    if len(token) < MIN_SECRET_LEN or not _HIGH_ENTROPY_CHARS.fullmatch(token) or token.startswith("/"):
        return False
    segments = [x for x in re.split(r"[/\-_.]+", token) if x]
    if not segments or len(token) / len(segments) < 10:  # paths and names: short words between separators
        return False
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    return classes >= 3 and entropy(token) >= MIN_ENTROPY


def secret_name(name: str) -> bool:
    """True for a variable name that usually holds a credential."""
    return bool(SECRET_NAME.search(name or "")) and not _PATH_NAME.search(name or "")


def secret_value(value: str) -> str | None:
    """What the value looks like ('a Hugging Face token (hf_...)', ...) if it looks like a credential."""
    if not value:
        return None
    for pattern, what in _VALUE_PATTERNS:
        if pattern.search(value):
            return what
    for token in re.split(r"[\s,;:'\"=@]+", value):
        if _high_entropy(token):
            return "a long random string (a key or token?)"
    return None


HINT = ("put it in a Kubernetes Secret and reference it with 'secret_env: {NAME: secret-name/key}' in "
        "miles-ray.yaml (or a Polyaxon connection); miles-ray never writes credentials into specs or run records")


def redact(text: str) -> str:
    """``text`` with every credential-looking part replaced by '<redacted>' (for error lines and logs)."""
    if not text:
        return text
    for pattern, _ in _VALUE_PATTERNS:
        text = pattern.sub("<redacted>", text)
    return re.sub(r"[A-Za-z0-9+/=_\-]{%d,}" % MIN_SECRET_LEN,
                  lambda m: "<redacted>" if _high_entropy(m.group(0)) else m.group(0), text)
