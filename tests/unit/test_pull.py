"""Issue 37 item 3: ``runs pull`` and what surrounds it. The pure part (miles_ray/core/pull.py: which checkpoint, what
DIR still needs; hypothesis: the plan never skips a file DIR does not hold whole and never leaves DIR), then the
verb on local runs built from files (their cluster is gone: the head is a closed port; their checkpoints are on this
machine, as on the embedded cluster): byte for byte, an interrupted pull resumed without copying its finished files
again, the bad input (one line, exit 2, nothing written), ``runs compare``'s checkpoints, and the memory fit check
counting the checkpoints a retention keeps."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_ray.adapters import pull_files, state
from miles_ray.core import supervision as sv
from miles_ray.core.config import load_config
from miles_ray.core.errors import ConfigError
from miles_ray.core.outputs import (CheckpointRow, checkpoint_rows, checkpoint_summary, complete_iterations,
                                    headline_eval)
from miles_ray.core.pull import (PART_SUFFIX, PULL_MANIFEST, ManifestEntry, choose_checkpoint, copy_plan,
                                 needs_hash, safe_path)
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request

CLOSED = "http://127.0.0.1:9"
CREATED = "2026-08-22T00:00:00+00:00"


# -- which checkpoint ------------------------------------------------------------------------------------------

def row(it: int, state_: str = "complete", why: str = "kept") -> CheckpointRow:
    return CheckpointRow(iteration=it, complete=state_ != "partial", state=state_, bytes=1, path=f"/c/iter_{it:07d}",
                         written=None, attempt=1, metrics={}, registered=[], kept=state_ != "deleted", why=why)


def scores(values: dict[int, float], metric: str = "eval/aime") -> sv.CheckpointScores:
    s = sv.CheckpointScores()
    for it, v in values.items():
        s.metrics[it] = {metric: v}
    return s


ROWS = [row(1, "deleted", "deleted by the retention at T: beyond the newest 2"), row(3), row(5), row(7),
        row(9, "partial", "partial: newer than the tracker (7), being written")]


def test_the_newest_complete_checkpoint_by_default_and_iteration_or_best_on_request():
    s = scores({1: 0.9, 3: 0.5, 5: 0.2, 7: 0.3, 9: 0.8})
    assert choose_checkpoint("r", ROWS, s).row.iteration == 7
    assert choose_checkpoint("r", ROWS, s).why == "the newest complete checkpoint"
    assert choose_checkpoint("r", ROWS, s, iteration=5).row.iteration == 5
    best = choose_checkpoint("r", ROWS, s, best="eval/aime")  # 1 is deleted and 9 partial: 3 of those on disk
    assert best.row.iteration == 3 and best.why == "the best by eval/aime (highest: 0.5)"
    assert choose_checkpoint("r", ROWS, s, best="min:eval/aime").row.iteration == 5


@pytest.mark.parametrize("kwargs, fragment", [
    ({"iteration": 4}, "run r has no checkpoint 4 (complete on disk: 3, 5, 7)"),
    ({"iteration": 1}, "checkpoint 1 of run r is gone: deleted by the retention"),
    ({"iteration": 9}, "checkpoint 9 of run r is partial: newer than the tracker (7), being written: only a complete"),
    ({"best": "eval/math"}, "run r never logged eval/math (its eval metrics: eval/aime)"),
    ({"best": "aime"}, "--best 'aime' is not a metric"),
    ({"best": "eval/aime", "iteration": 3}, "not both"),
])
def test_bad_choices_are_one_line(kwargs, fragment):
    with pytest.raises(ConfigError, match=None) as e:
        choose_checkpoint("r", ROWS, scores({3: 0.5}), **kwargs)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_a_metric_logged_only_for_checkpoints_not_on_disk_is_said_so():
    with pytest.raises(ConfigError, match="no complete checkpoint of run r on disk has eval/aime logged "
                                          r"\(logged for checkpoint\(s\) 1, 9"):
        choose_checkpoint("r", ROWS, scores({1: 0.9, 9: 0.8}), best="eval/aime")
    with pytest.raises(ConfigError, match=r"no complete checkpoint to pull \(partial: 9\)"):
        choose_checkpoint("r", [ROWS[-1]], scores({}))


# -- what DIR needs ----------------------------------------------------------------------------------------------

names = st.lists(st.sampled_from(["a", "b", "iter_0000003", "x.distcp", ".metadata", "sub"]), min_size=1,
                 max_size=3).map("/".join)
contents = st.sampled_from([b"", b"1", b"22", b"other"])


@settings(max_examples=300, deadline=None)
@given(files=st.dictionaries(names, contents, max_size=6), there=st.dictionaries(names, contents, max_size=6),
       ours=st.booleans())
def test_the_plan_skips_only_what_dir_holds_whole_and_names_every_other_file(files, there, ours):
    # a dir and a file of the same name cannot both be: keep the manifest's paths prefix-free
    files = {p: c for p, c in files.items() if not any(q.startswith(p + "/") for q in files)}
    manifest = [ManifestEntry(path=p, bytes=len(c), sha256=hashlib.sha256(c).hexdigest()) for p, c in files.items()]
    have_content = dict(there)
    if ours:
        have_content[PULL_MANIFEST] = b"{}"
        have_content[f"a{PART_SUFFIX}"] = b"half"
    sizes = {p: len(c) for p, c in have_content.items()}
    hashed = set(needs_hash(manifest, sizes))
    have = {p: (len(c), hashlib.sha256(c).hexdigest() if p in hashed else None) for p, c in have_content.items()}
    plan = copy_plan(manifest, have)
    assert sorted(e.path for e in plan.to_copy + plan.skip) == sorted(files)  # each file once
    for e in plan.skip:
        assert have_content[e.path] == files[e.path]  # skipped: DIR holds it whole
    for e in plan.to_copy:
        assert have_content.get(e.path) != files[e.path]
    assert plan.differ == sorted(p for p in files if p in have_content and have_content[p] != files[p])
    assert plan.extra == sorted(p for p in there if p not in files)  # the pull's own files are not DIR's content
    done = copy_plan(manifest, {e.path: (e.bytes, e.sha256) for e in manifest})  # after a whole pull
    assert done.to_copy == [] and done.conflicts == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab./\\\x00-_", max_size=12))
def test_a_manifest_path_never_leaves_dir(path):
    if safe_path(path):
        joined = posixpath.normpath(posixpath.join("/dir", path))
        assert joined.startswith("/dir/") and not path.startswith("/")
        assert PULL_MANIFEST not in path.split("/") and not path.endswith(PART_SUFFIX)
    assert not safe_path("../x") and not safe_path("a/../../x") and not safe_path("/etc/passwd")
    assert safe_path("iter_0000003/__0_0.distcp")


@settings(max_examples=200, deadline=None)
@given(its=st.sets(st.integers(0, 30), max_size=8), latest=st.one_of(st.none(), st.integers(0, 30)),
       missing=st.sets(st.integers(0, 30), max_size=3))
def test_compare_and_outputs_agree_on_what_is_complete(its, latest, missing):
    listing = {"iterations": sorted(its), "latest": None if latest is None else str(latest),
               "details": {str(i): {"bytes": 1, "missing": "no files" if i in missing else None} for i in its}}
    rows = checkpoint_rows("/c", listing, live=False, attempts=[], scores=sv.CheckpointScores(),
                           policy=sv.Retention())
    assert complete_iterations(listing) == [r.iteration for r in rows if r.complete]


def test_the_summary_runs_compare_shows():
    seen = {"at": "T", "listing": {"iterations": [3, 5, 7, 9], "latest": "7", "details": {}}}
    s = scores({3: 0.5, 5: 0.2, 7: 0.3, 9: 0.9})
    s.metrics[3]["eval/aime-truncated_ratio"] = 9.0
    assert headline_eval(s) == "eval/aime"
    got = checkpoint_summary("r", seen, s)
    assert (got.newest, got.best, got.metric, got.value, got.seen_at) == (7, 3, "eval/aime", 0.5, "T")
    assert checkpoint_summary("r", seen, s, "min:eval/aime").best == 5
    none = checkpoint_summary("r", None, s)
    assert none.newest is None and "'miles-ray runs outputs r' reads one" in none.note


# -- the verb on local runs built from files ---------------------------------------------------------------------

def miles_log(evals: dict[int, float]) -> str:
    lines = []
    for rid in range(10):
        lines.append(f"[2026-08-22 00:00:{rid:02d} rank0] actor.py:601 - step {rid}: {{'train/loss': {0.5 / (rid + 1)}}}")
        if rid in evals:
            lines.append(f"[2026-08-22 00:00:{rid:02d} rank0] rollout.py:61 - eval {rid}: "
                         f"{{'eval/aime': {evals[rid]}, 'eval/aime-truncated_ratio': 0.03}}")
    return "\n".join(lines) + "\n"


EVALS = {1: 0.1, 3: 0.4, 5: 0.2, 7: 0.3, 9: 0.25}


@pytest.fixture
def world(clean_env, monkeypatch):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    return clean_env


def local_run(world: Path, run: str, iterations=(1, 3, 5), latest: int | None = 5, partial=(7,)) -> Path:
    """A direct-mode run recorded on the embedded cluster whose head is gone, its logs saved, its checkpoints
    written here as Megatron writes them (a torch_dist dir: shards, .metadata, common.pt)."""
    cfg = load_config({"name": "gone", "recipe": "Qwen3-4B", "nodes": 1, "mount_path": str(world / "mnt")},
                      environ={})
    valid = validate_request(cfg, SubmitRequest(run=run, num_rollout=10, max_restarts=0,
                                                extra_args=["--save-interval", "2"], no_memory_check=True))
    job = prepare_submit(cfg, valid, SubmitTarget("local", CLOSED, supervisors=frozenset()), created=CREATED,
                         launchers_dir="/unused")
    state.create_record(job.record)
    sid = job.record["submission_id"]
    state.save_run_copy(run, {"job_id": sid, "submission_id": sid, "status": "SUCCEEDED", "start_time": 1},
                        miles_log(EVALS), "down", CREATED)
    root = Path(job.record["checkpoint_dir"])
    for it in (*iterations, *partial):
        d = root / f"iter_{it:07d}"
        (d / "sub").mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(os.urandom(300_000 + it))
        (d / "__1_0.distcp").write_bytes(os.urandom(200_000))
        (d / "common.pt").write_bytes(f"common {it}".encode())
        (d / "sub" / "rng.pt").write_bytes(b"")  # an empty file is a file too
        if it not in partial:
            (d / ".metadata").write_bytes(b"meta")
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(str(latest))
    return root


def one_error(err: str) -> str:
    """The one error line a failed command ends with (its progress lines come before it, on stderr too)."""
    lines = err.splitlines()
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:] and "Traceback" not in err, err
    return lines[-1]


def files_of(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_pull_brings_the_newest_complete_checkpoint_byte_for_byte(cli, world):
    root = local_run(world, "r1")
    dest = world / "home" / "newest"
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest), "-o", "json")
    assert code == 0, err
    got = json.loads(out)
    assert (got["iteration"], got["why"], got["what"], got["verified"]) == (5, "the newest complete checkpoint",
                                                                             "checkpoint", True)
    assert files_of(dest / "iter_0000005") == files_of(root / "iter_0000005")
    assert (dest / "latest_checkpointed_iteration.txt").read_text() == "5"  # DIR loads as --load DIR
    manifest = json.loads((dest / PULL_MANIFEST).read_text())
    by_path = {f["path"]: f for f in manifest["files"]}
    for rel, data in files_of(root / "iter_0000005").items():
        assert by_path[f"iter_0000005/{rel}"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert (got["files"], got["copied_files"], got["skipped_files"]) == (6, 6, 0)
    assert got["bytes"] == got["copied_bytes"] == sum(len(v) for v in files_of(root / "iter_0000005").values()) + 1
    assert not list(dest.rglob(f"*{PART_SUFFIX}"))
    # again: everything is there, verified, nothing copied
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest), "-o", "json")
    assert code == 0, err
    again = json.loads(out)
    assert (again["copied_files"], again["skipped_files"], again["copied_bytes"]) == (0, 6, 0)
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest))
    assert code == 0 and "checkpoint 5 (the newest complete checkpoint)" in out and "each verified" in out


def test_iteration_and_best_and_evals(cli, world):
    root = local_run(world, "r1")
    code, out, err = cli("runs", "pull", "r1", "--iteration", "1", "--to", str(world / "one"), "-o", "json")
    assert code == 0, err
    assert files_of(world / "one" / "iter_0000001") == files_of(root / "iter_0000001")
    code, out, err = cli("runs", "pull", "r1", "--best", "eval/aime", "--to", str(world / "best"), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["iteration"] == 3 and files_of(world / "best" / "iter_0000003") == \
        files_of(root / "iter_0000003")
    code, out, err = cli("runs", "pull", "r1", "--best", "min:train/loss", "--to", str(world / "loss"), "-o", "json")
    assert code == 0 and json.loads(out)["iteration"] == 5, err
    code, out, err = cli("runs", "pull", "r1", "--evals", "--to", str(world / "evals"), "-o", "json")
    assert code == 0, err
    evals = json.loads((world / "evals" / "evals.json").read_text())
    assert {c["iteration"]: c["metrics"]["eval/aime"] for c in evals["checkpoints"]} == EVALS
    code, out, err = cli("runs", "pull", "r1", "--evals", "--to", str(world / "evals"), "-o", "json")
    assert code == 0 and json.loads(out)["skipped_files"] == 1 and json.loads(out)["copied_files"] == 0


def test_an_interrupted_pull_resumes_without_copying_finished_files_again(cli, world, monkeypatch):
    root = local_run(world, "r1")
    dest = world / "home"
    real = pull_files.copy_verified
    calls: list[str] = []

    def cut_at_the_third_file(source, directory, entry, on_bytes=None):
        calls.append(entry.path)
        if len(calls) == 3:  # the destination's copy of one file fails half way
            with open(os.path.join(directory, *entry.path.split("/")) + PART_SUFFIX, "wb") as fh:
                fh.write(b"half of it")
            raise OSError(28, "No space left on device")
        return real(source, directory, entry, on_bytes)

    monkeypatch.setattr(pull_files, "copy_verified", cut_at_the_third_file)
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest))
    assert code == 1 and out == ""
    line = one_error(err)
    assert "No space left on device" in line and "2 of 6 file(s) are in" in line and "verified" in line
    assert "run the same command again" in line
    finished = calls[:2]
    stamps = {p: os.stat(dest / p).st_mtime_ns for p in finished}
    assert not (dest / PULL_MANIFEST).exists()

    calls.clear()
    monkeypatch.setattr(pull_files, "copy_verified", lambda *a, **k: (calls.append(a[2].path), real(*a, **k)))
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest), "-o", "json")
    assert code == 0, err
    got = json.loads(out)
    assert (got["copied_files"], got["skipped_files"]) == (4, 2)
    assert not set(calls) & set(finished) and len(calls) == 4  # the finished files were not copied again
    assert {p: os.stat(dest / p).st_mtime_ns for p in finished} == stamps
    assert files_of(dest / "iter_0000005") == files_of(root / "iter_0000005")
    assert not list(dest.rglob(f"*{PART_SUFFIX}"))


def test_a_file_that_changes_while_pulled_is_not_kept(cli, world, monkeypatch):
    root = local_run(world, "r1")
    real = pull_files.source_manifest

    def then_changed(path, prefix, on_file=None):
        got = real(path, prefix, on_file)
        (root / "iter_0000005" / "common.pt").write_bytes(b"written again")
        return got

    monkeypatch.setattr(pull_files, "source_manifest", then_changed)
    code, out, err = cli("runs", "pull", "r1", "--to", str(world / "home"))
    assert code == 1 and "changed while it was pulled" in one_error(err)
    assert not (world / "home" / "iter_0000005" / "common.pt").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--iteration", "4"], "run r1 has no checkpoint 4 (complete on disk: 1, 3, 5)"),
    (["--iteration", "7"], "checkpoint 7 of run r1 is partial"),
    (["--best", "eval/math"], "run r1 never logged eval/math (its eval metrics: eval/aime"),
    (["--best", "aime"], "--best 'aime' is not a metric"),
    (["--evals", "--iteration", "3"], "--evals pulls the eval results: give it without --iteration"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, world, args, fragment):
    local_run(world, "r1")
    dest = world / "home"
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest), *args)
    assert code == 2 and out == "" and fragment in one_error(err), err
    assert not dest.exists()


def test_an_unknown_run_and_an_unwritable_dir(cli, world):
    local_run(world, "r1")
    code, _, err = cli("runs", "pull", "nope", "--to", str(world / "home"))
    assert code == 1 and "no run named 'nope'" in one_error(err)  # not found: exit 1, as for every verb
    (world / "a-file").write_text("x")
    code, _, err = cli("runs", "pull", "r1", "--to", str(world / "a-file" / "home"))
    assert code == 2 and "cannot be written" in one_error(err) and "a-file is not a directory" in err
    assert not (world / "home").exists()


def test_a_dir_with_other_content_needs_force(cli, world):
    root = local_run(world, "r1")
    dest = world / "home"
    (dest / "iter_0000005").mkdir(parents=True)
    (dest / "iter_0000005" / "common.pt").write_bytes(b"something else")
    (dest / "notes.txt").write_text("mine")
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest))
    assert code == 2 and "1 file(s) with other content and 1 file(s) that are not part" in one_error(err)
    assert "--force" in err and sorted(files_of(dest)) == ["iter_0000005/common.pt", "notes.txt"]
    code, out, err = cli("runs", "pull", "r1", "--to", str(dest), "--force", "-o", "json")
    assert code == 0, err
    got = json.loads(out)
    assert got["overwritten"] == ["iter_0000005/common.pt"] and got["left"] == ["notes.txt"]
    assert files_of(dest / "iter_0000005") == files_of(root / "iter_0000005") and (dest / "notes.txt").exists()
    # another checkpoint into the same DIR is other content too
    code, _, err = cli("runs", "pull", "r1", "--iteration", "3", "--to", str(dest))
    assert code == 2 and "not part of it" in err


def test_a_kubernetes_run_whose_cluster_cannot_be_read_is_one_line_and_no_pod(cli, world):
    """A Kubernetes run is pulled through a pod on its cluster (tests/realpods/test_outputs_pull.py); here its
    kubeconfig does not exist: one line, exit 2, nothing written."""
    state.create_record({"run": "onk8s", "cluster": "miles", "address": "k8s://ml/miles", "backend": "kuberay",
                         "created": CREATED, "submission_id": "s", "output_dir": "/mnt/miles/runs/onk8s",
                         "checkpoint_dir": "/mnt/miles/runs/onk8s/checkpoints", "checkpoint_dirs_from": "job",
                         "kubeconfig": str(world / "no-kubeconfig")})
    code, out, err = cli("runs", "pull", "onk8s", "--to", str(world / "home"))
    assert code == 2 and "no-kubeconfig does not exist" in one_error(err), err
    assert not (world / "home").exists()


def _raycluster(world: Path, **over):
    from miles_ray.core.builders import build_raycluster
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN

    cfg = load_config({"name": "c1", "namespace": "ml", "recipe": "Qwen3-4B", "nodes": 1, **over}, environ={})
    recipe = BUILTIN["Qwen3-4B"]
    return cfg, build_raycluster(cfg, plan_split(recipe, 1, 8), "reg/miles@sha256:" + "a" * 64, "2.60.0")


def test_the_pull_pod_mounts_the_clusters_claim_read_only_in_its_image(world):
    from miles_ray.core.pull_pod import POD_SCRIPT, pull_pod, run_selector

    cfg, rc = _raycluster(world, pod_security="restricted")
    pod = pull_pod(rc, f"{cfg.mount_path}/runs/r1/checkpoints/iter_0000005", "miles-ray-pull-r1-00001", "r1")
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    [c] = pod["spec"]["containers"]
    assert c["image"] == head["containers"][0]["image"] and c["command"][:3] == ["python3", "-c", POD_SCRIPT]
    claim = next(m for m in c["volumeMounts"] if m["name"] == cfg.claim)
    assert claim == {"name": cfg.claim, "mountPath": cfg.mount_path, "readOnly": True}
    assert {"name": cfg.claim, "persistentVolumeClaim": {"claimName": cfg.claim}} in pod["spec"]["volumes"]
    assert c["securityContext"] == head["containers"][0]["securityContext"]  # restricted: admitted there too
    assert pod["spec"]["securityContext"] == head["securityContext"]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["automountServiceAccountToken"] is False
    assert "cpu" not in c["resources"]["limits"]  # sha256 and tar are CPU bound: not throttled
    assert pod["metadata"]["namespace"] == "ml"
    labels = pod["metadata"]["labels"]
    assert all(f"{k}={labels[k]}" in run_selector("r1").split(",") for k in ("app.kubernetes.io/name", "miles-ray/run"))
    with pytest.raises(ConfigError, match="is on no volume of RayCluster ml/c1's pods"):
        pull_pod(rc, "/tmp/ckpt/iter_0000005", "p", "r1")


def test_tar_batches_keep_the_order_and_the_budget():
    from miles_ray.core.pull_pod import tar_batches

    paths = [f"d/{i:04d}.distcp" for i in range(100)]
    batches = tar_batches(paths, budget=200)
    assert [p for b in batches for p in b] == paths
    assert all(sum(len(p) + 1 for p in b) <= 200 for b in batches) and len(batches) > 1
    assert tar_batches([]) == []


def test_compare_shows_each_runs_newest_and_best_checkpoint(cli, world):
    local_run(world, "r1")
    local_run(world, "r2", iterations=(1, 3), latest=3, partial=())
    code, out, err = cli("runs", "outputs", "r1", "-o", "json")  # reads and saves r1's listing
    assert code == 0, err
    code, out, err = cli("runs", "compare", "r1", "r2", "-o", "json")
    assert code == 0, err
    got = json.loads(out)
    assert {"a", "b", "provenance", "split", "eval", "metrics", "metric_lines", "errors", "verdict"} <= set(got)
    a, b = got["checkpoints"]["a"], got["checkpoints"]["b"]
    assert (a["newest"], a["best"], a["metric"], a["value"]) == (5, 3, "eval/aime", 0.4)
    assert b["newest"] is None and "'miles-ray runs outputs r2' reads one" in b["note"]
    code, out, err = cli("runs", "compare", "r1", "r2")
    assert code == 0 and "newest complete" in out and "3 (eval/aime 0.4)" in out


# -- the memory fit check counts the checkpoints the retention keeps ----------------------------------------------

def test_the_storage_part_counts_what_the_retention_keeps(world, monkeypatch):
    from miles_ray.core import memory
    from miles_ray.core.planner import plan_split
    from miles_ray.core.recipes import BUILTIN
    from miles_ray.core.submission import validation

    recipe = BUILTIN["Qwen3-4B"]  # --save-interval 20 of 3000 rollouts: 150 checkpoints without a retention
    plan = plan_split(recipe, 1, 8)
    assert memory.estimate(recipe, plan).storage.checkpoints_kept == 150
    assert memory.estimate(recipe, plan, keep_checkpoints=2).storage.checkpoints_kept == 2
    assert memory.estimate(recipe, plan, keep_checkpoints=2, keep_best=True).storage.checkpoints_kept == 3
    assert memory.estimate(recipe, plan, keep_best=True).storage.checkpoints_kept == 2  # the newest and the best
    assert memory.estimate(recipe, plan, keep_checkpoints=400).storage.checkpoints_kept == 150
    kept = memory.estimate(recipe, plan, keep_checkpoints=2, keep_best=True).storage
    assert kept.bytes_needed == 3 * kept.checkpoint_bytes

    seen = []
    real = validation.check_fit
    monkeypatch.setattr(validation, "check_fit", lambda *a, **k: (seen.append(k), real(*a, **k))[1])
    cfg = load_config({"name": "c", "recipe": "Qwen3-4B", "nodes": 1}, environ={})
    validate_request(cfg, SubmitRequest(run="k", keep_checkpoints=2, keep_best="eval/aime"))
    validate_request(cfg, SubmitRequest(run="k"))
    assert (seen[0]["keep_checkpoints"], seen[0]["keep_best"]) == (2, True)
    assert "keep_checkpoints" not in seen[1] or seen[1]["keep_checkpoints"] is None


@pytest.mark.parametrize("address,made,here", [
    ("http://127.0.0.1:8265", True, True),  # the embedded cluster given by its address: its workers are here
    ("http://localhost:8265", True, True),
    ("http://127.0.0.1:8265", False, False),  # a remote head through a hand-made port-forward: not here
    ("http://10.1.2.3:8265", True, False),
    ("k8s://ns/miles", True, False),
])
def test_whose_checkpoints_are_on_this_machine(tmp_path, monkeypatch, address, made, here):
    from miles_ray.services import outputs

    ckpt = tmp_path / "checkpoints"
    if made:
        ckpt.mkdir()
    monkeypatch.setattr(outputs, "checkpoint_root", lambda record: str(ckpt))
    assert outputs.checkpoints_here({"run": "r", "backend": "address", "address": address}) is here
    assert outputs.checkpoints_here({"run": "r", "backend": "local", "address": address}) is True


class _ProcessPod:
    """STAND-IN for the pull pod (no Kubernetes in the unit tier): its own program (POD_SCRIPT) run here as a
    process, its stdout read as the exec stream is."""

    def __init__(self) -> None:
        self.tars: list[list[str]] = []

    def _run(self, *args: str):
        import subprocess
        import sys

        from miles_ray.core.pull_pod import POD_SCRIPT

        return subprocess.Popen([sys.executable, "-c", POD_SCRIPT, *args], stdout=subprocess.PIPE)

    def manifest(self, root: str) -> list[dict]:
        proc = self._run("manifest", root)
        lines = proc.communicate()[0].decode().splitlines()
        assert lines[-1] == f"MILES_RAY_PULL_END {len(lines) - 1}"
        return [json.loads(line) for line in lines[:-1]]

    def tar(self, root: str, paths: list[str]):
        self.tars.append(paths)
        return self._run("tar", root, *paths).stdout


def test_the_pod_transport_verifies_each_tar_member_and_resumes(tmp_path, monkeypatch):
    """The pod's program (its manifest: size + sha256 of each file; its tar of the files asked for, in order) read
    by the Kubernetes transport through the one verify/resume path: byte for byte, only what DIR lacks is asked for,
    and a file that changed after the manifest is not kept."""
    from miles_ray.core import pull_pod
    from miles_ray.services.pull_sources import PodSource

    src = tmp_path / "iter_0000005"
    (src / "sub").mkdir(parents=True)
    for i in range(5):
        (src / f"__{i}_0.distcp").write_bytes(os.urandom(70_000 * (i + 1)))
    (src / "sub" / "rng.pt").write_bytes(b"")
    pod = _ProcessPod()
    source = PodSource(pod, str(src), "iter_0000005", "the pod")
    manifest = sorted(source.manifest(), key=lambda e: e.path)
    assert {e.path: e.sha256 for e in manifest} == {
        f"iter_0000005/{p.relative_to(src)}": hashlib.sha256(p.read_bytes()).hexdigest()
        for p in src.rglob("*") if p.is_file()}
    dest = tmp_path / "home"
    done: list = []
    monkeypatch.setattr(pull_pod, "ARGV_BUDGET", 30)  # 2 paths per tar exec
    source.copy(manifest[:3], str(dest), None, done.append)
    assert done == manifest[:3] and files_of(dest / "iter_0000005") == {
        e.path.split("/", 1)[1]: (src / e.path.split("/", 1)[1]).read_bytes() for e in manifest[:3]}
    (src / "__4_0.distcp").write_bytes(b"written again")  # after the manifest
    with pytest.raises(Exception, match="changed while it was pulled"):
        source.copy(manifest[3:], str(dest), None, done.append)
    assert not (dest / "iter_0000005" / "__4_0.distcp").exists() and not list(dest.rglob(f"*{PART_SUFFIX}"))
    assert len(pod.tars) >= 3  # 2 for the first 3 files (2 paths each at most), 1 at least for the rest
    assert [p for batch in pod.tars for p in batch][:3] == [e.path.split("/", 1)[1] for e in manifest[:3]]
