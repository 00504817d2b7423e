"""Miles version awareness, the pure part (miles_ray.core.miles_version): the verdict from the catalog's commit, the
commit read in the image and --miles-commit; the refusal and the notices. The probe on a real cluster:
tests/integration/test_miles_version.py."""

from __future__ import annotations

import pytest

from miles_ray.core import miles_version as mv
from miles_ray.core.errors import ConfigError, Conflict
from miles_ray.launchers import miles_commit

A, B = "a" * 40, "b" * 40


@pytest.mark.parametrize(("catalog", "probed", "asserted", "status", "image", "source"), [
    (A, A, None, mv.MATCH, A, "probe"),
    (A, B, None, mv.DRIFT, B, "probe"),
    (A, None, None, mv.UNKNOWN, None, None),
    (A, None, "aaaaaaa", mv.MATCH, "aaaaaaa", "flag"),  # unreadable: --miles-commit (a prefix) is what is compared
    (A, None, "BBBB", mv.DRIFT, "bbbb", "flag"),
    (None, B, None, mv.UNCHECKED, B, "probe"),  # no catalog commit: nothing to compare, the image's is recorded
    (None, None, None, mv.UNCHECKED, None, None),
])
def test_the_verdict(catalog, probed, asserted, status, image, source):
    v = mv.resolve(catalog, probed, asserted)
    assert (v.status, v.image, v.source) == (status, image, source)
    assert v.record()["catalog_commit"] == catalog and v.record()["allowed_drift"] is False


def test_a_drift_is_refused_pointing_to_launcher_mode_unless_allowed():
    refused = mv.refusal(mv.resolve(A, B, None), "/root/miles")
    assert isinstance(refused, Conflict) and refused.exit_code == 1
    assert "bbbbbbbbbbbb at /root/miles" in refused.message and "aaaaaaaaaaaa" in refused.message
    assert "--mode launcher" in refused.hint and "--allow-miles-drift" in refused.hint
    allowed = mv.resolve(A, B, None, allow_drift=True)
    assert mv.refusal(allowed, "/root/miles") is None and allowed.record()["allowed_drift"] is True
    assert "--allow-miles-drift" in mv.notice(allowed, "/root/miles")
    assert mv.refusal(mv.resolve(A, None, None), "/r") is None  # unknown: a notice, not a refusal
    assert "could not be read (no git checkout at /r)" in mv.notice(mv.resolve(A, None, None), "/r")
    assert mv.notice(mv.resolve(A, A, None), "/r") is None and mv.notice(mv.resolve(None, B, None), "/r") is None


def test_miles_commit_is_an_assertion_when_the_image_is_read():
    assert mv.resolve(A, A, "AAAA").status == mv.MATCH
    with pytest.raises(Conflict, match="--miles-commit bbbb but the Miles checkout in the image is at aaaaaaaaaaaa"):
        mv.resolve(A, A, "bbbb")
    for bad in ("abc", "not-a-commit", "g" * 40, "a" * 41):
        with pytest.raises(ConfigError, match="is not a git commit"):
            mv.validate_asserted(bad)


def test_the_catalog_commit_must_be_a_full_commit(monkeypatch):
    assert mv.CATALOG_MILES_COMMIT is None or mv.FULL_COMMIT.fullmatch(mv.CATALOG_MILES_COMMIT)
    monkeypatch.setattr(mv, "CATALOG_MILES_COMMIT", "31f1ca9")
    with pytest.raises(ValueError, match="not a full 40-hex commit"):
        mv.catalog_commit()


def test_the_payload_reads_a_checkout_without_git(tmp_path):
    """The fallback of launchers/miles_commit.py when git is not installed: HEAD, loose refs, packed refs,
    a detached HEAD and a worktree's .git file (hand-made git directories)."""
    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    assert miles_commit.commit_from_files(str(git)) is None  # an unborn branch
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{B} refs/heads/main\n")
    assert miles_commit.commit_from_files(str(git)) == B
    (git / "refs" / "heads" / "main").write_text(A + "\n")  # a loose ref wins over the packed one
    assert miles_commit.commit_from_files(str(git)) == A
    (git / "HEAD").write_text(B + "\n")
    assert miles_commit.commit_from_files(str(git)) == B
    wt = tmp_path / "wt"
    wt.mkdir()
    (git / "worktrees" / "wt").mkdir(parents=True)
    (git / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (wt / ".git").write_text(f"gitdir: {git / 'worktrees' / 'wt'}\n")
    assert miles_commit.commit_from_files(miles_commit._git_dir(str(wt))) == A
    out = miles_commit.read_commit(str(tmp_path / "nowhere"))
    assert out["commit"] is None and "does not exist" in out["problem"]
    (tmp_path / "plain").mkdir()
    out = miles_commit.read_commit(str(tmp_path / "plain"))
    assert out["commit"] is None and "not a git checkout" in out["problem"]
