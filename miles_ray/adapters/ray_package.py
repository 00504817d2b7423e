"""A job's ``working_dir`` as Ray's SDK uploads it, made this submission's own (see :func:`own_package`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

PACKAGE_MARK = ".miles-ray-submission"


@contextlib.contextmanager
def own_package(runtime_env: dict | None, submission_id: str | None) -> Iterator[dict | None]:
    """The runtime env with its local ``working_dir`` copied into a directory of this submission's own, marked
    with the submission id and a random token, so its package (named by content hash) is this job's alone. Ray
    deletes a working_dir package once no job references it, and a job that reuses a package of the same hash
    does not pin it in time (ray-project/ray#36703): the next probe found its cwd gone ("getcwd() failed ...
    can't open file 'comm_check.py'"). The copy is removed once the SDK has uploaded it."""
    wd = (runtime_env or {}).get("working_dir")
    if not wd or not os.path.isdir(wd):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="miles-ray-pkg-") as tmp:
        own = os.path.join(tmp, "working_dir")
        shutil.copytree(wd, own, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with open(os.path.join(own, PACKAGE_MARK), "w", encoding="utf-8") as f:
            f.write(f"{submission_id or ''} {uuid.uuid4().hex}\n")
        yield {**(runtime_env or {}), "working_dir": own}
