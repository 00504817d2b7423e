"""Issue 37: the outputs a run keeps. The retention rule (miles_ray/core/supervision.py: Retention, CheckpointScores,
retention_plan; hypothesis: never deletes what it must keep), the supervisor's pruning on a real directory (the
shipped program), the pairing of checkpoints with attempts, metrics and versions (miles_ray/core/outputs.py), the
listing as the probe job and this machine describe it, and submit's bad input (one line, exit 2, nothing made)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_ray.adapters import checkpoint_files
from miles_ray.core import supervision as sv
from miles_ray.core.outputs import checkpoint_rows, scores_of, split_attempts, writer
from tests.conftest import REPO
from tests.infra.fake_ray_head import shipped_program

SPEC = {"run": "r1", "head_url": "http://127.0.0.1:9", "submission_id": "s", "max_restarts": 0,
        "first_job": {"entrypoint": "python3 train.py"}}


# -- the policy and its bad input ------------------------------------------------------------------------------

def test_keep_best_reads_max_by_default_and_min_for_a_loss():
    assert sv.parse_keep_best("eval/aime") == ("eval/aime", "max")
    assert sv.parse_keep_best("min:eval/loss") == ("eval/loss", "min")
    assert sv.parse_keep_best("max:rollout/raw_reward") == ("rollout/raw_reward", "max")
    assert not sv.Retention().active and sv.Retention().describe() == "keep every checkpoint"
    assert sv.Retention.of(2, "eval/aime").describe() == "keep the newest 2 and the best by eval/aime (highest)"


@pytest.mark.parametrize("keep, best, fragment", [
    (0, None, "--keep-checkpoints 0: keep at least 1"), (-3, None, "keep at least 1"), (True, None, "keep at least"),
    (None, "aime", "is not a metric"), (None, "avg:eval/aime", "is not a metric"), (None, "eval/ aime", "not a metric"),
    (None, "min:", "is not a metric"),
])
def test_a_bad_retention_is_refused(keep, best, fragment):
    with pytest.raises(sv.SpecError, match=fragment):
        sv.Retention.of(keep, best)
    with pytest.raises(sv.SpecError):
        sv.SupervisorSpec.of({**SPEC, "keep_checkpoints": keep, "keep_best": best})


def test_the_spec_carries_the_retention():
    spec = sv.SupervisorSpec.of({**SPEC, "keep_checkpoints": 2, "keep_best": "min:eval/loss"})
    assert (spec.keep_checkpoints, spec.keep_best) == (2, "min:eval/loss")
    assert sv.SupervisorSpec.of(json.loads(json.dumps(spec.to_json()))) == spec
    assert sv.SupervisorSpec.of(SPEC).keep_checkpoints is None


# -- which checkpoint a metric belongs to ------------------------------------------------------------------------

LOG1 = ("eval 0: {'eval/aime': 0.0}\nstep 0: {'train/loss': 0.5}\nstep 1: {'train/loss': 0.4}\n"
        "eval 1: {'eval/aime': 0.2}\nstep 2: {'train/loss': 0.3}\n")
LOG2 = ("eval 2: {'eval/aime': 0.25}\nstep 2: {'train/loss': 0.31}\nstep 3: {'train/loss': 0.2}\n"
        "eval 3: {'eval/aime': 0.3}")


def test_an_eval_before_training_measured_the_checkpoint_the_job_loaded():
    scores = sv.checkpoint_scores([(1, LOG1), (2, LOG2)])
    assert 0 not in scores.metrics or "eval/aime" not in scores.metrics[0]  # eval 0 before step 0: the base model
    assert scores.value(1, "eval/aime") == 0.25  # eval 2 of attempt 2, before its step 2: checkpoint 1 (the latest)
    assert scores.value(3, "eval/aime") == 0.3 and scores.value(2, "train/loss") == 0.31


def test_scores_read_in_pieces_are_the_scores_read_whole():
    whole = sv.checkpoint_scores([(1, LOG1), (2, LOG2)]).metrics
    pieces = sv.CheckpointScores()
    for attempt, text in ((1, LOG1), (2, LOG2)):
        for i in range(0, len(text), 7):
            pieces.feed(attempt, text[i:i + 7])
        pieces.feed(attempt, "", final=True)
    assert pieces.metrics == whole


def test_the_logs_of_logs_run_are_cut_at_each_attempt():
    text = f"== attempt 1 (s) ==\n{LOG1}== attempt 2 (s-a2), resumed from /c iter 1, from rollout 2 ==\n{LOG2}"
    assert [a for a, _ in split_attempts(text)] == [1, 2]
    assert scores_of(text).value(1, "eval/aime") == 0.25
    assert split_attempts(LOG1) == [(1, LOG1)]


# -- the rule --------------------------------------------------------------------------------------------------

def scores_for(values: dict[int, float]) -> sv.CheckpointScores:
    s = sv.CheckpointScores()
    for it, v in values.items():
        s.metrics[it] = {"eval/aime": v}
    return s


def test_the_newest_n_and_the_best_stay():
    plan = sv.retention_plan(sv.Retention.of(2, "eval/aime"), [1, 3, 5, 7, 9],
                             scores_for({1: 0.1, 3: 0.5, 5: 0.3, 7: 0.2, 9: 0.1}))
    assert [(k.iteration, k.keep) for k in plan] == [(1, False), (3, True), (5, False), (7, True), (9, True)]
    assert plan[1].why == "the best by eval/aime (0.5)" and plan[0].why.startswith("beyond the newest 2")
    low = sv.retention_plan(sv.Retention.of(1, "min:eval/aime"), [1, 3, 5], scores_for({1: 0.1, 3: 0.5, 5: 0.3}))
    assert [k.iteration for k in low if k.keep] == [1, 5]


def test_no_retention_deletes_nothing_and_a_dead_partial_goes_once_a_newer_complete_exists():
    assert all(k.keep for k in sv.retention_plan(sv.Retention(), [1, 2, 3], partial=[4], dead=[4]))
    plan = {k.iteration: k for k in sv.retention_plan(sv.Retention.of(3), [1, 3], partial=[2, 4], dead=[2, 4])}
    assert not plan[2].keep and "dead attempt" in plan[2].why
    assert plan[4].keep and "no newer complete" in plan[4].why  # nothing newer than it
    live = {k.iteration: k for k in sv.retention_plan(sv.Retention.of(1), [1], partial=[2])}
    assert live[2].keep and live[2].why == "partial: being written"


@settings(max_examples=300, deadline=None)
@given(its=st.sets(st.integers(0, 40), max_size=15), partial=st.sets(st.integers(0, 45), max_size=5),
       dead=st.sets(st.integers(0, 45), max_size=5), protected=st.sets(st.integers(0, 45), max_size=4),
       keep=st.one_of(st.none(), st.integers(1, 5)), best=st.sampled_from([None, "eval/aime", "min:eval/aime"]),
       values=st.dictionaries(st.integers(0, 40), st.floats(allow_nan=True, allow_infinity=False), max_size=15))
def test_the_rule_never_deletes_what_it_must_keep(its, partial, dead, protected, keep, best, values):
    policy = sv.Retention.of(keep, best)
    complete = its - partial
    plan = sv.retention_plan(policy, complete, scores_for(values), partial=partial, dead=dead,
                             protected={p: "registered" for p in protected})
    assert sorted(k.iteration for k in plan) == sorted(complete | partial)  # one verdict each
    deleted = {k.iteration for k in plan if not k.keep}
    if not policy.active:
        assert not deleted
    assert not deleted & protected
    if complete:
        newest = max(complete)
        assert newest not in deleted
        window = sorted(complete)[-(keep or 1):]
        assert not deleted & set(window)
        for it in deleted & partial:  # only a dead attempt's partial, once a newer complete one exists
            assert it in dead and it < newest
        if best:
            top = sv.best_checkpoint(complete, scores_for(values), *sv.parse_keep_best(best))
            assert top is None or top not in deleted
        kept_complete = {k.iteration for k in plan if k.keep and k.iteration in complete}
        if policy.active:  # and nothing more is kept
            assert kept_complete <= set(window) | protected | ({top} if best and top is not None else set())
    else:
        assert not deleted
    assert not deleted & (partial - dead)  # one being written never goes


# -- the supervisor's pruning on a real directory (the shipped program) ---------------------------------------

@pytest.fixture(scope="module")
def program(tmp_path_factory):
    with shipped_program(tmp_path_factory.mktemp("program"), "shipped_supervise_retention") as mod:
        yield mod


def save(root, it: int, tracker: bool = True, size: int = 10) -> None:
    d = root / f"iter_{it:07d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "common.pt").write_bytes(b"x" * size)
    if tracker:
        (root / "latest_checkpointed_iteration.txt").write_text(str(it))


def test_the_supervisor_prunes_after_each_new_checkpoint_and_says_so(program, tmp_path):
    root = tmp_path / "ckpt"
    outside = tmp_path / "elsewhere"
    save(outside, 0)
    lines: list[str] = []
    spec = program.sv.SupervisorSpec.of({**SPEC, "checkpoint_dir": str(root), "keep_checkpoints": 1,
                                          "keep_best": "eval/aime"})
    sup = program.Supervisor(spec, api=None, out=lines.append)
    sup.scores.feed(1, "step 1: {}\neval 1: {'eval/aime': 0.9}\nstep 3: {}\neval 3: {'eval/aime': 0.1}\n")
    for it in (1, 3, 5):
        save(root, it, size=it)
    (root / "iter_0000000").symlink_to(outside / "iter_0000000")  # never followed, never deleted
    save(root, 4, tracker=False)  # older than the tracker: complete by the tracker's rule
    (root / "iter_0000007").mkdir()  # being written (newer than the tracker)
    sup.resumed_iteration[1] = None
    sup.prune(1, live=True)
    events = sv.parse_events("\n".join(lines))
    assert [(e["event"], e["iteration"], e["bytes"]) for e in events] == [("checkpoint_deleted", 3, 3),
                                                                          ("checkpoint_deleted", 4, 10)]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("iter_")) == [
        "iter_0000000", "iter_0000001", "iter_0000005", "iter_0000007"]
    assert (outside / "iter_0000000" / "common.pt").exists()
    # a registered checkpoint stays; the attempt ended: its dir newer than the tracker is a dead attempt's
    checkpoint_files.write_registered(str(root / "iter_0000005"), {"version": "v1"})
    save(root, 6, tracker=False)
    sup.prune(1, live=False)
    assert len(sv.parse_events("\n".join(lines))) == 2 and (root / "iter_0000006").is_dir()
    save(root, 8)  # a newer complete checkpoint: the dead partials go, the registered one stays
    sup.prune(2, live=True)
    gone = [e["iteration"] for e in sv.parse_events("\n".join(lines))[2:]]
    assert sorted(gone) == [6, 7] and (root / "iter_0000005").is_dir() and (root / "iter_0000001").is_dir()


def test_a_dead_partial_written_again_is_not_deleted(program, tmp_path):
    root = tmp_path / "ckpt"
    lines: list[str] = []
    sup = program.Supervisor(program.sv.SupervisorSpec.of({**SPEC, "checkpoint_dir": str(root),
                                                           "keep_checkpoints": 3}), api=None, out=lines.append)
    save(root, 2)
    save(root, 5, tracker=False)
    sup.prune(1, live=False)  # attempt 1 died writing 5
    (root / "iter_0000005" / "common.pt").write_bytes(b"y" * 99)  # attempt 2 writes 5 again, then 8
    os.utime(root / "iter_0000005" / "common.pt", (1, 1))
    save(root, 8)
    sup.prune(2, live=True)
    assert lines == [] and (root / "iter_0000005").is_dir()


# -- what runs outputs shows -----------------------------------------------------------------------------------

def test_rows_pair_attempts_metrics_versions_and_deletions():
    attempts = [{"attempt": 1, "resumed_iteration": None}, {"attempt": 2, "resumed_iteration": 5}]
    listing = {"iterations": [5, 7, 9, 11], "latest": "9",
               "details": {"5": {"bytes": 50, "mtime": 1.7e9, "registered": {"version": "v5"}},
                           "7": {"bytes": 70, "mtime": 1.7e9}, "9": {"bytes": 90}, "11": {"bytes": 1}}}
    scores = scores_for({5: 0.5, 7: 0.2, 9: 0.3})
    deleted = [{"event": "checkpoint_deleted", "iteration": 3, "bytes": 30, "path": "/c/iter_0000003",
                "why": "beyond the newest 2", "at": "T"}]
    rows = {r.iteration: r for r in checkpoint_rows("/c", listing, live=False, attempts=attempts, scores=scores,
                                                    policy=sv.Retention.of(2, "eval/aime"), deleted=deleted,
                                                    registered=[{"iteration": 7, "version": "v7"}])}
    assert sorted(rows) == [3, 5, 7, 9, 11]
    assert [rows[i].attempt for i in (3, 5, 7)] == [1, 1, 2]
    assert rows[5].registered == ["v5"] and rows[7].registered == ["v7"] and rows[5].metrics == {"eval/aime": 0.5}
    assert (rows[3].state, rows[3].kept, rows[3].bytes) == ("deleted", False, 30) and "beyond" in rows[3].why
    assert (rows[11].state, rows[11].complete) == ("partial", False) and "ended before finishing" in rows[11].why
    assert rows[9].complete and rows[9].path == "/c/iter_0000009" and rows[5].written.startswith("2023-11-14")
    assert all(rows[i].kept for i in (5, 7, 9, 11))
    assert writer(0, []) is None


def test_after_the_run_the_checkpoint_its_last_attempt_loaded_is_listed_as_kept_for_that():
    """Its supervisor's last pruning (at that attempt's end) protected it, so it stays: after the run the listing says
    why (not 'the retention would delete it')."""
    attempts = [{"attempt": 1, "resumed_iteration": None}, {"attempt": 2, "resumed_iteration": 2}]
    listing = {"iterations": [2, 8, 11], "latest": "11", "details": {k: {"bytes": 1} for k in ("2", "8", "11")}}
    for live in (True, False):
        rows = {r.iteration: r for r in checkpoint_rows("/c", listing, live=live, attempts=attempts,
                                                        scores=scores_for({2: 0.1, 8: 0.9, 11: 0.5}),
                                                        policy=sv.Retention.of(1, "eval/aime"))}
        assert rows[2].why == "attempt 2 loaded it" and rows[2].kept, rows[2]
        assert "the best by eval/aime" in rows[8].why and "newest complete" in rows[11].why


def test_the_probe_and_this_machine_describe_a_checkpoint_alike(tmp_path):
    spec = importlib.util.spec_from_file_location("list_checkpoints_payload",
                                                  REPO / "launchers" / "list_checkpoints.py")
    payload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(payload)
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "sub" / "x").write_bytes(b"12345")
    (tmp_path / "a" / "__0_0.distcp").write_bytes(b"1")
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        assert payload.describe(str(tmp_path / d)) == checkpoint_files.describe(str(tmp_path / d))
    a = checkpoint_files.describe(str(tmp_path / "a"))
    assert (a["bytes"], a["files"], a["missing"]) == (6, 2, "no .metadata (a torch_dist checkpoint cut off)")
    assert checkpoint_files.describe(str(tmp_path / "b"))["missing"] == "no files"
    assert payload.mark(str(tmp_path), 3, "{}") is not None  # no such checkpoint: said, nothing made
    (tmp_path / "iter_0000003").mkdir()
    assert payload.mark(str(tmp_path), 3, '{"version": "v"}') is None
    assert checkpoint_files.describe(str(tmp_path / "iter_0000003"))["registered"] == {"version": "v"}


# -- submit: bad input, nothing created ------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["--keep-checkpoints", "0"], "--keep-checkpoints 0: keep at least 1"),
    (["--keep-best", "aime"], "--keep-best 'aime' is not a metric"),
    (["--keep-best", "eval/aime", "--max-restarts", "0"], "--keep-best: checkpoints are pruned by the run's "
                                                           "supervisor (--max-restarts 0"),
    (["--keep-checkpoints", "2", "--rehearse"], "a rehearsal writes no checkpoints"),
])
def test_submit_retention_bad_input(cli, clean_env, args, fragment):
    code, out, err = cli("submit", "--nodes", "1", "--address", "http://127.0.0.1:9", "--dry-run", "client", *args)
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert "Traceback" not in err + out
    assert sorted(p.name for p in clean_env.iterdir()) == []


def test_submit_puts_the_retention_in_the_record(cli, clean_env):
    code, out, err = cli("submit", "--nodes", "1", "--address", "http://127.0.0.1:9", "--dry-run", "client",
                         "-o", "json", "--keep-checkpoints", "2", "--keep-best", "min:eval/loss")
    assert code == 0, err
    assert json.loads(out)["record"]["supervisor"] == {"kind": "local", "max_restarts": 3, "keep_checkpoints": 2,
                                                       "keep_best": "min:eval/loss"}


def test_register_marks_the_checkpoint_and_keeps_the_version(clean_env, monkeypatch):
    from miles_ray.services.registry import mark_registered

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    root = clean_env / "ckpt"
    save(root, 4)
    record = {"run": "r1", "checkpoint_dir": str(root), "checkpoint_dirs_from": "job", "output_dir": str(clean_env)}
    assert mark_registered(record, 4, {"version": "r1-iter-4"}, here=True) is None
    assert checkpoint_files.describe(str(root / "iter_0000004"))["registered"] == {"version": "r1-iter-4"}
    assert checkpoint_files.registered("r1") == [{"version": "r1-iter-4", "iteration": 4}]
    assert "no such file" in (mark_registered(record, 6, {"version": "v6"}, here=True) or "").lower()
