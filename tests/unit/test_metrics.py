"""The Miles log parser and the run comparison (pure)."""

from __future__ import annotations

import copy
import math
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from miles_ray.core.metrics import NOT_PROOF, compare_runs, eval_metric_names, eval_setup, parse_dict, parse_metrics

# Lines in the shapes Miles prints them (miles/ray/rollout/metrics.py, the Megatron actor), with the
# prefixes a Ray job log adds.
LOG = """\
(RolloutManager pid=4711, ip=10.0.0.3) [2026-12-02 10:00:01 rank0] metrics.py:61 - eval 0: {'eval/aime': 0.1, 'eval/aime-none_reward_ratio': 0.0, 'eval/aime-truncated_ratio': 0.05}
(MegatronTrainRayActor pid=99, ip=10.0.0.4) [2026-12-02 10:00:09 rank0] actor.py:512 - rollout 0: {'rollout/raw_reward': 0.2, 'rollout/log_probs': -0.31}
[2026-12-02 10:00:10 rank0] metrics.py:110 - perf 0: {'rollout/episode_raw_reward': 0.2, 'perf/rollout_time': 81.5}
[2026-12-02 10:00:11 rank0] model.py:601 - step 0: {'train/loss': 0.05, 'train/grad_norm': np.float64(0.21)}
some unrelated line: {'not': 'a metric'}
[2026-12-02 11:00:01 rank0] actor.py:512 - rollout 19: {'rollout/raw_reward': 0.45, 'rollout/log_probs': nan}
[2026-12-02 11:00:02 rank0] metrics.py:61 - eval 19: {'eval/aime': 0.35, 'eval/aime-truncated_ratio': 0.02, 'eval/gpqa': 0.5}
[2026-12-02 11:00:03 rank0] metrics.py:61 - eval 20: {'eval/aime': 0.
"""


def record(run: str, **kw) -> dict:
    entry = shlex.join(["bash", "-c", "x", "miles-train", "--eval-interval", "20", "--eval-prompt-data", "aime",
                        "/mnt/miles/datasets/aime-2024/aime-2024.jsonl", "--n-samples-per-eval-prompt", "16",
                        "--eval-max-response-len", "16384", "--eval-top-p", "1", "--rm-type", "deepscaler"])
    base = {"run": run, "recipe": "Qwen3-4B", "recipe_hash": "sha256:aa", "image": "img@sha256:" + "1" * 64,
            "image_digest": "sha256:" + "1" * 64, "miles_commit": "abc", "model_revision": "m1",
            "dataset_revision": "d1", "ray_version": "2.60.0", "output_dir": f"/mnt/miles/runs/{run}",
            "mode": "direct", "cluster": "miles", "created": "2026-12-02T10:00:00+00:00", "entrypoint": entry,
            "split": {"layout": "colocated", "nodes": 4, "gpus_per_node": 8}, "recipe_spec": {"eval_data": "aime-2024/aime-2024.jsonl"}}
    base.update(kw)
    return base


def test_last_value_of_each_metric_with_its_rollout_id():
    parsed = parse_metrics(LOG)
    m = parsed["metrics"]
    assert m["eval/aime"] == {"value": 0.35, "kind": "eval", "id": 19, "count": 2}  # the cut-off line is ignored
    assert m["rollout/raw_reward"]["value"] == 0.45 and m["rollout/raw_reward"]["id"] == 19
    assert m["train/grad_norm"]["value"] == 0.21  # np.float64(...) read as a number
    assert math.isnan(m["rollout/log_probs"]["value"])
    assert m["perf/rollout_time"]["kind"] == "perf"
    assert "not" not in m
    assert parsed["lines"] == 6
    assert eval_metric_names(m) == ["eval/aime", "eval/gpqa"]


def test_parse_dict_leniency():
    assert parse_dict("{'a': 1, 'b': True, 'c': 'text', 'd': -inf}") == {"a": 1.0, "b": 1.0, "d": -math.inf}
    assert parse_dict("{'a': tensor(0.5, device='cuda:0'), 'nan_count': 3}") == {"a": 0.5, "nan_count": 3.0}
    assert parse_dict("{'a': <object at 0x1>, 'b': 2.5}") == {"b": 2.5}
    assert parse_dict("{}") == {}
    assert parse_dict("{garbage") is None


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z]{1,8}/[a-z_]{1,10}", fullmatch=True),
                       st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=8),
       st.integers(0, 10_000), st.sampled_from(["eval", "rollout", "perf", "step"]))
def test_round_trip_of_any_logged_dict(values, ident, kind):
    line = f"(Actor pid=1, ip=10.0.0.1) [t rank0] x.py:1 - {kind} {ident}: {values!r}"
    m = parse_metrics(line + "\n")["metrics"]
    assert {k: v["value"] for k, v in m.items()} == values
    assert all(v["id"] == ident and v["kind"] == kind for v in m.values())


def test_eval_setup_from_the_entrypoint():
    setup = eval_setup(record("a"))
    assert setup["data"] == {"aime": "/mnt/miles/datasets/aime-2024/aime-2024.jsonl"}
    assert setup["procedure"]["--n-samples-per-eval-prompt"] == "16"
    assert setup["dataset_revision"] == "d1"


def metrics_for(eval_value: float) -> dict:
    return parse_metrics(f"eval 39: {{'eval/aime': {eval_value}}}\nrollout 39: {{'rollout/raw_reward': 0.4}}\n")


def test_same_eval_names_the_better_run_with_the_caveat():
    result = compare_runs(record("a"), record("b", image_digest="sha256:" + "2" * 64), metrics_for(0.3),
                          metrics_for(0.42))
    v = result["verdict"]
    assert v["better"] == "b" and v["metric"] == "eval/aime" and not v["refused"]
    assert "0.42 vs 0.3" in v["statement"] and v["caveat"] == NOT_PROOF
    assert "not by itself proof of a better model" in v["caveat"]
    assert result["eval"]["same"] is True
    digest = next(r for r in result["provenance"] if r["field"] == "image_digest")
    assert digest["same"] is False


def test_different_eval_data_refuses_to_judge_but_shows_metrics():
    other = record("b")
    other["entrypoint"] = other["entrypoint"].replace("aime-2024/aime-2024.jsonl", "aime-2025/aime-2025.jsonl")
    result = compare_runs(record("a"), other, metrics_for(0.3), metrics_for(0.9))
    v = result["verdict"]
    assert v["better"] is None and v["refused"] is True
    assert "evaluation data differ" in v["statement"] and "aime-2025" in v["statement"]
    rows = {r["metric"]: (r["a"], r["b"]) for r in result["metrics"]}
    assert rows["eval/aime"] == (0.3, 0.9)


def test_missing_or_different_dataset_revision_refuses():
    r = compare_runs(record("a"), record("b", dataset_revision=None), metrics_for(0.3), metrics_for(0.4))
    assert r["verdict"]["refused"] and "dataset revision not recorded for b" in r["verdict"]["statement"]
    r = compare_runs(record("a"), record("b", dataset_revision="d2"), metrics_for(0.3), metrics_for(0.4))
    assert r["verdict"]["refused"] and "dataset revisions differ" in r["verdict"]["statement"]


def test_different_eval_procedure_refuses():
    other = record("b")
    other["entrypoint"] = other["entrypoint"].replace("--n-samples-per-eval-prompt 16", "--n-samples-per-eval-prompt 4")
    r = compare_runs(record("a"), other, metrics_for(0.3), metrics_for(0.4))
    assert r["verdict"]["refused"] and "--n-samples-per-eval-prompt 16 vs 4" in r["verdict"]["statement"]


def test_no_eval_metric_or_missing_logs_refuse():
    only_reward = parse_metrics("rollout 3: {'rollout/raw_reward': 0.9}\n")
    r = compare_runs(record("a"), record("b"), only_reward, only_reward)
    assert r["verdict"]["refused"] and "no final eval metric" in r["verdict"]["statement"]
    r = compare_runs(record("a"), record("b"), metrics_for(0.3), None, errors={"b": "no job log"})
    assert r["verdict"]["refused"] and "b: no job log" in r["verdict"]["statement"]


def test_tie_and_non_finite():
    r = compare_runs(record("a"), record("b"), metrics_for(0.3), metrics_for(0.3))
    assert r["verdict"]["better"] is None and "tie" in r["verdict"]["statement"]
    r = compare_runs(record("a"), record("b"), metrics_for(0.3), parse_metrics("eval 1: {'eval/aime': nan}\n"))
    assert r["verdict"]["refused"] and "not a finite number" in r["verdict"]["statement"]


def test_compare_is_pure():
    a, b = record("a"), record("b")
    ca, cb = copy.deepcopy(a), copy.deepcopy(b)
    compare_runs(a, b, metrics_for(0.1), metrics_for(0.2))
    assert (a, b) == (ca, cb)
