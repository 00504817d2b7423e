"""Which Miles the catalog mirrors, and whether the Miles in the image is that one. Pure.

The recipes and direct mode's job (``train.py`` and its flags, built by miles-ray) mirror the upstream launchers
at ONE commit of radixark/miles, :data:`CATALOG_MILES_COMMIT`. Direct mode runs the ``train.py`` of the Miles IN
THE IMAGE with those flags: when the image holds another Miles, a flag or a file the job relies on may not exist
there (upstream deleted ``scripts/models/*.sh`` on 2026-08-09, for one). ``--mode launcher`` runs the image's own
launcher instead and is exact by construction.

``submit`` (direct mode) reads the image's commit with a probe on a GPU worker
(:func:`miles_ray.core.probes.miles_commit_probe`), and :func:`resolve` says what it is:

* ``match``: the image's commit is the catalog's;
* ``drift``: it is another commit -- refused unless ``--allow-miles-drift`` (:func:`refusal`, exit 1 like the
  other refusals of what the live cluster runs, e.g. a Ray version the config does not name);
* ``unknown``: the commit could not be read (no git checkout at ``miles_root``; upstream images ship no version
  file) -- a notice, not a refusal;
* ``unchecked``: the catalog records no commit (``CATALOG_MILES_COMMIT`` is None) -- nothing to compare.

``--miles-commit`` names the image's commit: an assertion when the probe reads one (they must agree), the value
used when it cannot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from miles_ray.core.errors import ConfigError, Conflict
from miles_ray.core.upstream_jobs import UPSTREAM_MILES_COMMIT

# The radixark/miles commit the catalog mirrors (full 40 hex; the one its captured launcher jobs come from).
# None: unknown, nothing is compared.
CATALOG_MILES_COMMIT: str | None = UPSTREAM_MILES_COMMIT

FULL_COMMIT = re.compile(r"^[0-9a-f]{40}$")
ASSERTED_COMMIT = re.compile(r"^[0-9a-fA-F]{4,40}$")
MATCH, DRIFT, UNKNOWN, UNCHECKED = "match", "drift", "unknown", "unchecked"
LAUNCHER_HINT = ("use --mode launcher (the image's own launcher: exact by construction), update miles-ray to a "
                 "catalog made for that Miles, or pass --allow-miles-drift to submit anyway")


def catalog_commit() -> str | None:
    """The commit the catalog mirrors (read at call time), or None."""
    value = CATALOG_MILES_COMMIT
    if value is not None and not FULL_COMMIT.fullmatch(value):
        raise ValueError(f"CATALOG_MILES_COMMIT {value!r} is not a full 40-hex commit")
    return value


def validate_asserted(value: str | None) -> str | None:
    """``--miles-commit``: 4 to 40 hex digits (a commit or its prefix), lower-cased; bad input is refused."""
    if value is None:
        return None
    if not ASSERTED_COMMIT.fullmatch(value):
        raise ConfigError(f"--miles-commit {value!r} is not a git commit (4 to 40 hex digits)",
                          hint="give the commit of the Miles checkout in the image (git -C /root/miles rev-parse HEAD)")
    return value.lower()


def short(commit: str | None) -> str:
    return commit[:12] if commit else "unknown"


@dataclass(frozen=True)
class MilesVersion:
    """The verdict: ``status`` (match, drift, unknown, unchecked), the catalog's and the image's commit, where the
    image's came from (``probe``: read in the image; ``flag``: --miles-commit), where it was read (evidence),
    and whether a drift was allowed (--allow-miles-drift)."""

    status: str
    catalog: str | None
    image: str | None
    source: str | None
    where: str | None = None
    allowed: bool = False

    def record(self) -> dict[str, Any]:
        """What the run record keeps (besides ``miles_commit``)."""
        return {"status": self.status, "catalog_commit": self.catalog, "image_commit": self.image,
                "source": self.source, "where": self.where, "allowed_drift": self.allowed}


def resolve(catalog: str | None, probed: str | None, asserted: str | None, where: str | None = None,
            allow_drift: bool = False) -> MilesVersion:
    """Compare the image's commit (``probed`` in the image, else ``asserted`` by --miles-commit) with the catalog's.
    A --miles-commit that contradicts the probe is refused (``Conflict``)."""
    asserted = validate_asserted(asserted)
    if probed and asserted and not probed.startswith(asserted):
        raise Conflict(f"--miles-commit {asserted} but the Miles checkout in the image is at {short(probed)}",
                       hint="drop --miles-commit (the commit is read from the image) or fix it")
    image, source = (probed, "probe") if probed else ((asserted, "flag") if asserted else (None, None))
    if catalog is None:
        status = UNCHECKED
    elif image is None:
        status = UNKNOWN
    else:
        status = MATCH if catalog.startswith(image) else DRIFT
    return MilesVersion(status=status, catalog=catalog, image=image, source=source, where=where,
                        allowed=allow_drift and status == DRIFT)


def refusal(version: MilesVersion, miles_root: str) -> Conflict | None:
    """The refusal of a direct-mode job on a drifted image (None when it may go ahead)."""
    if version.status != DRIFT or version.allowed:
        return None
    return Conflict(f"the Miles in the image ({short(version.image)} at {miles_root}) is not the Miles the catalog "
                    f"mirrors ({short(version.catalog)}): direct mode's train.py flags may not fit it",
                    hint=LAUNCHER_HINT)


def notice(version: MilesVersion, miles_root: str) -> str | None:
    """One line for the user when the job goes ahead without a verified match (None: nothing to say)."""
    if version.status == UNKNOWN:
        return (f"the Miles commit in the image could not be read (no git checkout at {miles_root}): not compared "
                f"with the catalog's {short(version.catalog)}; --mode launcher is exact whatever the image holds")
    if version.status == DRIFT and version.allowed:
        return (f"--allow-miles-drift: the image's Miles {short(version.image)} is not the catalog's "
                f"{short(version.catalog)}; the run record keeps both")
    return None
