"""Miles metrics from job logs, and the comparison of two runs. Pure (no I/O).

What Miles prints (radixark/miles, ``miles/ray/rollout/metrics.py`` and the Megatron actor), one
Python-dict repr per line, on the logger of rank 0 (a Ray job log adds prefixes such as
``(MegatronTrainRayActor pid=123, ip=10.0.0.2)`` or ``[2026-... rank0] file.py:12 - ``):

    eval 19: {'eval/aime': 0.35, 'eval/aime-truncated_ratio': 0.02, 'eval/aime-none_reward_ratio': 0.0}
    rollout 19: {'rollout/raw_reward': 0.41, 'rollout/log_probs': -0.3, ...}      (trainer side)
    perf 19: {'rollout/episode_raw_reward': 0.41, 'perf/rollout_time': 80.1, ...}  (rollout side)
    step 19: {'train/loss': 0.01, 'train/grad_norm': 0.2, ...}

:func:`parse_metrics` keeps the LAST value of every metric (and the id of the line it came from).
Values Python prints that ``ast.literal_eval`` cannot read (``nan``, ``inf``, ``np.float64(0.5)``,
``tensor(0.5)``) are read leniently; a line that is cut off or garbled is skipped, never fatal.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from typing import Any

# "<kind> <id>: {...}" anywhere in a line (after any logger / Ray prefix), dict to the end of the line
METRIC_LINE = re.compile(r"(?:^|[\s\-\]):])(eval|rollout|perf|step) (\d+): (\{.*\})\s*$")
_WRAPPED_NUMBER = re.compile(r"\b(?:np\.\w+|numpy\.\w+|tensor|torch\.tensor)\(\s*([^(),]+?)\s*(?:,[^()]*)?\)")
_BARE_SPECIAL = re.compile(r"(?<![\w'\"])(-?)(nan|inf)(?![\w'\"])")
_SENTINEL = "__miles_ray_number__:"
_PAIR = re.compile(r"""['"]([^'"]+)['"]\s*:\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)|True|False)""")

# Eval flags that define the evaluation PROCEDURE (same data is not enough: same sampling too)
EVAL_PROCEDURE_FLAGS = ("--n-samples-per-eval-prompt", "--eval-max-response-len", "--eval-top-p",
                        "--eval-top-k", "--eval-temperature", "--eval-function-path", "--eval-reward-key",
                        "--eval-input-key", "--eval-label-key", "--rm-type")

NOT_PROOF = ("a better final eval metric is not by itself proof of a better model: it is one number on one "
             "data set; inspect the training loss, rollout reward, evaluation samples and checkpoints, and "
             "validate the candidate in its serving environment before release")


def _number(text: str) -> float | None:
    t = text.strip()
    if t in ("True", "False"):
        return 1.0 if t == "True" else 0.0
    try:
        return float(t)
    except ValueError:
        return None


def parse_dict(text: str) -> dict[str, float] | None:
    """Numeric entries of one logged dict repr; None if it is not readable at all."""
    cleaned = _WRAPPED_NUMBER.sub(r"\1", text)
    cleaned = _BARE_SPECIAL.sub(lambda m: f"'{_SENTINEL}{m.group(1)}{m.group(2)}'", cleaned)
    try:
        data: Any = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        data = None
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, str) and v.startswith(_SENTINEL):
                v = float(v[len(_SENTINEL):])
            if isinstance(v, bool):
                out[str(k)] = 1.0 if v else 0.0
            elif isinstance(v, (int, float)):
                out[str(k)] = float(v)
        return out
    pairs = _PAIR.findall(text)  # an odd line: take the pairs that are readable
    if pairs and not text.rstrip().endswith("}"):
        pairs = pairs[:-1]  # the last value may be cut off
    if not pairs:
        return None
    for k, v in pairs:
        n = _number(v)
        if n is not None:
            out[k] = n
    return out


def parse_metrics(log_text: str) -> dict[str, Any]:
    """Last value of every metric in a Miles job log.

    Returns ``{"metrics": {name: {"value", "kind", "id", "count"}}, "lines": N, "skipped": N}`` where
    ``kind`` is the line kind (eval/rollout/perf/step) and ``id`` the rollout id or step of its last line.
    """
    metrics: dict[str, dict[str, Any]] = {}
    lines = skipped = 0
    for raw in log_text.splitlines():
        if ": {" not in raw:
            continue
        m = METRIC_LINE.search(raw)
        if not m:
            continue
        kind, ident, body = m.group(1), int(m.group(2)), m.group(3)
        values = parse_dict(body)
        if values is None:
            skipped += 1
            continue
        lines += 1
        for name, value in values.items():
            prev = metrics.get(name)
            metrics[name] = {"value": value, "kind": kind, "id": ident, "count": (prev["count"] + 1) if prev else 1}
    return {"metrics": dict(sorted(metrics.items())), "lines": lines, "skipped": skipped}


def eval_metric_names(metrics: dict[str, Any]) -> list[str]:
    """The headline eval metrics: ``eval/<dataset>`` (not its ratios or sub-keys)."""
    return sorted(k for k in metrics if re.fullmatch(r"eval/[^/]+", k) and "-" not in k.split("/", 1)[1]
                  and k != "eval/step")


HEADLINE = ("rollout/raw_reward", "rollout/episode_raw_reward", "train/loss", "train/grad_norm")


# ------------------------------------------------------------------------------------------------
# what a run evaluated on
# ------------------------------------------------------------------------------------------------

def _entry_args(entrypoint: str) -> list[str]:
    try:
        return shlex.split(entrypoint or "")
    except ValueError:
        return (entrypoint or "").split()


def eval_setup(record: dict[str, Any]) -> dict[str, Any]:
    """The evaluation data and procedure a run used: ``--eval-prompt-data NAME PATH ...`` and the eval
    sampling flags from the entrypoint that ran (falling back to the recipe's eval_data), plus the
    recorded dataset revision."""
    args = _entry_args(record.get("entrypoint", ""))
    data: dict[str, str] = {}
    procedure: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--eval-prompt-data":
            j = i + 1
            vals = []
            while j < len(args) and not args[j].startswith("--"):
                vals.append(args[j])
                j += 1
            for k in range(0, len(vals) - 1, 2):
                data[vals[k]] = vals[k + 1]
            if len(vals) % 2:
                data.setdefault("eval", vals[-1])
            i = j
            continue
        if a in EVAL_PROCEDURE_FLAGS and i + 1 < len(args) and not args[i + 1].startswith("--"):
            procedure[a] = args[i + 1]
            i += 2
            continue
        i += 1
    source = "entrypoint"
    if not data and args and record.get("mode") != "launcher":
        source = "entrypoint (no --eval-prompt-data: eval disabled)"
    if record.get("mode") == "launcher" or not args:
        spec = record.get("recipe_spec") or {}
        if spec.get("eval_data"):
            data = {"eval": f"<data_dir>/{spec['eval_data']}"}
            source = "recipe (launcher run: the launcher builds its own flags)"
    return {"data": data, "procedure": procedure, "dataset_revision": record.get("dataset_revision"),
            "source": source}


def same_eval(a: dict[str, Any], b: dict[str, Any], run_a: str, run_b: str) -> list[str]:
    """Why two eval setups cannot be taken as the same (empty: same data, revision and procedure)."""
    reasons: list[str] = []
    if not a["data"] or not b["data"]:
        missing = [r for r, s in ((run_a, a), (run_b, b)) if not s["data"]]
        reasons.append(f"no evaluation data recorded for {', '.join(missing)}")
    elif a["data"] != b["data"]:
        reasons.append(f"evaluation data differ: {run_a} {_fmt_data(a['data'])} vs {run_b} {_fmt_data(b['data'])}")
    ra, rb = a.get("dataset_revision"), b.get("dataset_revision")
    if not ra or not rb:
        missing = [r for r, v in ((run_a, ra), (run_b, rb)) if not v]
        reasons.append(f"dataset revision not recorded for {', '.join(missing)}: the same path may hold different "
                       "data (pin it with submit --dataset-revision)")
    elif ra != rb:
        reasons.append(f"dataset revisions differ: {run_a} {ra} vs {run_b} {rb}")
    if a["procedure"] != b["procedure"]:
        keys = sorted(set(a["procedure"]) | set(b["procedure"]))
        diff = [f"{k} {a['procedure'].get(k, '-')} vs {b['procedure'].get(k, '-')}" for k in keys
                if a["procedure"].get(k) != b["procedure"].get(k)]
        reasons.append("evaluation procedure differs: " + "; ".join(diff))
    return reasons


def _fmt_data(data: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(data.items()))


# ------------------------------------------------------------------------------------------------
# the comparison
# ------------------------------------------------------------------------------------------------

# the run record's provenance fields in their order (RunRecord.fields_for("provenance"): this module ships with the
# supervisor and imports nothing of miles_ray; tests/unit/test_run_records.py holds the two the same)
PROVENANCE = ("recipe", "recipe_hash", "image", "image_digest", "miles_commit", "model_revision",
              "dataset_revision", "ray_version", "output_dir", "resumed_from", "mode", "cluster",
              "polyaxon_run_uuid", "created")
SPLIT_KEYS = ("layout", "nodes", "gpus_per_node", "actor_num_nodes", "trainer_gpus", "rollout_num_gpus",
              "rollout_num_gpus_per_engine")


def _json_number(x: Any) -> Any:
    """NaN/inf as strings, so -o json stays strict JSON."""
    return x if x is None or _finite(x) else str(x)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def compare_runs(rec_a: dict[str, Any], rec_b: dict[str, Any], logs_a: dict[str, Any] | None,
                 logs_b: dict[str, Any] | None, errors: dict[str, str] | None = None) -> dict[str, Any]:
    """Provenance, split, eval setup and final metrics of two runs side by side, and a verdict that only
    names a better run when both evaluated on the same data with the same procedure."""
    a, b = rec_a["run"], rec_b["run"]
    errors = errors or {}
    prov = []
    for key in PROVENANCE:
        va, vb = rec_a.get(key), rec_b.get(key)
        prov.append({"field": key, "a": va, "b": vb, "same": va == vb})
    sa, sb = rec_a.get("split") or {}, rec_b.get("split") or {}
    split = [{"field": k, "a": sa.get(k), "b": sb.get(k), "same": sa.get(k) == sb.get(k)} for k in SPLIT_KEYS]

    ea, eb = eval_setup(rec_a), eval_setup(rec_b)
    reasons = same_eval(ea, eb, a, b)

    ma = (logs_a or {}).get("metrics") or {}
    mb = (logs_b or {}).get("metrics") or {}
    names = sorted(set(ma) | set(mb), key=lambda n: (0 if n.startswith("eval/") else 1 if n in HEADLINE else 2, n))
    shown = [n for n in names if n.startswith("eval/") or n in HEADLINE]
    rows = [{"metric": n, "a": _json_number((ma.get(n) or {}).get("value")), "a_at": (ma.get(n) or {}).get("id"),
             "b": _json_number((mb.get(n) or {}).get("value")), "b_at": (mb.get(n) or {}).get("id")} for n in shown]

    verdict: dict[str, Any] = {"better": None, "metric": None, "statement": "", "caveat": NOT_PROOF}
    evals = [n for n in eval_metric_names(ma) if n in eval_metric_names(mb)]
    if reasons:
        verdict["statement"] = (f"not saying which run is better: {'; '.join(reasons)}. Metrics on different "
                                "evaluation data or procedures are not comparable.")
        verdict["refused"] = True
    elif errors:
        verdict["statement"] = "not saying which run is better: " + "; ".join(f"{r}: {e}" for r, e in errors.items())
        verdict["refused"] = True
    elif not evals:
        have = [r for r, m in ((a, ma), (b, mb)) if eval_metric_names(m)]
        verdict["statement"] = ("not saying which run is better: no final eval metric in both logs "
                                f"(found in: {', '.join(have) or 'neither'}); training loss or rollout reward "
                                "alone do not establish a better model")
        verdict["refused"] = True
    else:
        metric = evals[0]
        xa, xb = ma[metric]["value"], mb[metric]["value"]
        verdict["metric"] = metric
        verdict["refused"] = False
        if not (_finite(xa) and _finite(xb)):
            verdict["statement"] = f"not saying which run is better: {metric} is not a finite number ({xa} vs {xb})"
            verdict["refused"] = True
        elif xa == xb:
            verdict["statement"] = f"same final {metric} ({xa:g}) on the same evaluation data: a tie"
        else:
            better, worse = (a, b) if xa > xb else (b, a)
            hi, lo = max(xa, xb), min(xa, xb)
            verdict["better"] = better
            verdict["statement"] = (f"{better} has the better final {metric}: {hi:g} vs {lo:g} ({worse}), "
                                    "on the same evaluation data and procedure")
    return {
        "a": a, "b": b,
        "provenance": prov,
        "split": split,
        "eval": {"a": ea, "b": eb, "same": not reasons, "differences": reasons},
        "metrics": rows,
        "metric_lines": {"a": (logs_a or {}).get("lines", 0), "b": (logs_b or {}).get("lines", 0)},
        "errors": errors,
        "verdict": verdict,
    }
