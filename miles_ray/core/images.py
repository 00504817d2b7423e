"""Container image references and the digest-pinning policy."""

from __future__ import annotations

import re
from dataclasses import dataclass

from miles_ray.core.errors import ConfigError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
# A first path element is a registry only if it has a dot or a port, or is localhost (Docker's rule).
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*:[0-9]+|{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+|localhost)"
_NAME = rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_REF = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>[^\s]+))?$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

PIN_HINT = (
    "pin the image by digest, e.g. radixark/miles:latest@sha256:<64 hex>; a tag can move, so head, workers "
    "and a resumed run could end up on different builds (find the digest with "
    "'docker buildx imagetools inspect IMAGE' or 'crane digest IMAGE'), or pass --allow-unpinned to accept the risk"
)


@dataclass(frozen=True)
class ImageRef:
    name: str
    tag: str | None
    digest: str | None

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_image(ref: str) -> ImageRef:
    if not ref or len(ref) > 512:
        raise ConfigError("image reference is empty or longer than 512 characters")
    m = _REF.fullmatch(ref)
    if not m:
        raise ConfigError(
            f"image {ref!r} is not a valid image reference",
            hint="expected [registry/]repository[:tag]@sha256:<64 hex>, lower-case repository",
        )
    digest = m.group("digest")
    if digest is not None and not _DIGEST.fullmatch(digest):
        raise ConfigError(
            f"image {ref!r} has a malformed digest {digest!r}",
            hint="a digest is 'sha256:' followed by exactly 64 lower-case hex characters",
        )
    return ImageRef(name=m.group("name"), tag=m.group("tag"), digest=digest)


def check_image(ref: str, allow_unpinned: bool = False) -> tuple[ImageRef, list[str]]:
    """Parse and apply the pinning policy. Returns the reference and warnings."""
    image = parse_image(ref)
    if image.pinned:
        return image, []
    if allow_unpinned:
        return image, [f"image {ref!r} is not pinned by digest; runs are not reproducible ({PIN_HINT.split(';')[0]})"]
    raise ConfigError(f"image {ref!r} is not pinned by digest", hint=PIN_HINT)
