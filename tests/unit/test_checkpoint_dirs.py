"""Where a run's checkpoints are: derived from the job itself (train.py's --save / --load in the direct-mode command
line, the directories resolved), recorded in the run record and read back by every consumer (resume, check-data,
doctor, register) -- never assumed to be <output_dir>/checkpoints, which only some upstream launchers use
(others save under <output_dir>/<run id>/checkpoints or elsewhere). Older records without the fields fall back to
<output_dir>/checkpoints. All pure: the prepare step and the record helpers, no cluster."""

from __future__ import annotations

import json
import shlex

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.entrypoint import checkpoint_dirs, flag_value, set_flag
from miles_ray.core.errors import ConfigError, PlanError
from miles_ray.core.recipes import BUILTIN
from miles_ray.core.runs import ResumeTarget, run_checkpoints, resume_target
from miles_ray.core.submission import SubmitRequest, SubmitTarget, prepare_submit, validate_request
from miles_ray.core.upstream_jobs import JOBS

URL = "http://10.0.0.5:8265"
CREATED = "2026-08-22T00:00:00+00:00"
MOUNT = "/mnt/miles"
CATALOG = sorted(name for name, r in BUILTIN.items() if r.train_args)


def config(recipe: str, nodes: int, **over):
    return load_config({"name": "ck", "namespace": "ml", "recipe": recipe, "nodes": nodes, **over}, environ={})


def prepare(cfg, resume=None, **request):
    valid = validate_request(cfg, SubmitRequest(**request))
    return prepare_submit(cfg, valid, SubmitTarget("address", URL), created=CREATED, launchers_dir="/unused",
                          resume=resume)


def feasible_nodes(name: str, mode: str = "direct") -> int:
    """A node count at which ``mode`` takes the recipe (its launcher's range first)."""
    r = BUILTIN[name]
    for n in dict.fromkeys([r.launcher_min_nodes or 1, *r.capture_nodes, 1, 2, 4, 8, 16, 32]):
        try:
            validate_request(config(name, n), SubmitRequest(mode=mode))
            return n
        except (PlanError, ConfigError):
            continue
    raise AssertionError(f"no feasible size for {name} in {mode} mode")


def template(name: str, flag: str) -> str | None:
    """The raw --save / --load value of the recipe's captured flags (upstream_jobs), or None."""
    args = JOBS[name]["train_args"]
    return args[args.index(flag) + 1] if flag in args else None


def resolved(value: str | None, out: str, run_id: str) -> str | None:
    if value is None:
        return None
    return value.replace("{output_dir}", out).replace("{run_id}", run_id).replace("{model_dir}", f"{MOUNT}/models")


def test_the_catalog_does_not_save_in_one_place():
    """The reason for all this: the captured launchers disagree on where checkpoints go."""
    saves = {template(n, "--save") for n in CATALOG}
    assert {"{output_dir}/checkpoints", "{output_dir}/{run_id}/checkpoints", None} <= saves
    assert any(s and not s.startswith("{output_dir}") for s in saves)  # e.g. /personal/checkpoints/{run_id}


@pytest.mark.parametrize("name", CATALOG)
def test_recorded_dirs_are_the_direct_jobs_save_and_load(name):
    nodes = feasible_nodes(name)
    job = prepare(config(name, nodes), run="ck-run")
    argv = shlex.split(job.entrypoint)
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    load = argv[argv.index("--load") + 1] if "--load" in argv else None
    rec = job.record
    assert (rec["checkpoint_dir"], rec["load_dir"], rec["checkpoint_dirs_from"]) == (save, load, "job")
    out = f"{MOUNT}/runs/ck-run"
    # and that is the capture's template, resolved with this run's output dir and run id
    assert save == resolved(template(name, "--save"), out, "ck-run")
    assert load == resolved(template(name, "--load"), out, "ck-run")
    ck = run_checkpoints(rec)
    assert (ck.save, ck.load, ck.source) == (save, load, "job")


@pytest.mark.parametrize("name", CATALOG)
def test_a_rehearsal_records_the_dirs_of_the_job_it_stands_in_for(name):
    nodes = feasible_nodes(name)
    direct = prepare(config(name, nodes), run="ck-run").record
    rehearsal = prepare(config(name, nodes), run="ck-run", rehearse=True).record
    assert "--save" not in rehearsal["entrypoint"]  # the rehearsal driver writes nothing
    assert (rehearsal["checkpoint_dir"], rehearsal["load_dir"], rehearsal["checkpoint_dirs_from"]) == (
        direct["checkpoint_dir"], direct["load_dir"], "rehearsed-job")


@pytest.mark.parametrize("name", CATALOG)
def test_launcher_mode_records_the_captured_template_and_says_the_launcher_decides(name):
    nodes = feasible_nodes(name, "launcher")
    rec = prepare(config(name, nodes), run="ck-run", mode="launcher").record
    out = f"{MOUNT}/runs/ck-run"
    assert rec["checkpoint_dirs_from"] == "launcher-capture"
    assert rec["checkpoint_dir"] == resolved(template(name, "--save"), out, "ck-run")
    assert "the upstream launcher decides" in run_checkpoints(rec).note


def test_a_recipe_without_save_records_none_and_cannot_be_resumed():
    """gpt-oss-20b's launcher passes no --save: the record says so, and resuming from it (submit, check-data)
    is refused with that reason instead of looking for a tracker in a directory nothing writes."""
    assert template("gpt-oss-20b", "--save") is None
    job = prepare(config("gpt-oss-20b", feasible_nodes("gpt-oss-20b")), run="oss-a")
    rec = job.record
    assert (rec["checkpoint_dir"], rec["load_dir"], rec["checkpoint_dirs_from"]) == (None, None, "job")
    ck = run_checkpoints(rec)
    assert ck.save is None and "passes no --save: Miles writes no checkpoints" in ck.note
    with pytest.raises(ConfigError, match="run oss-a has no checkpoint dir to resume from: .*passes no --save"):
        resume_target(rec)
    with pytest.raises(ConfigError, match="no checkpoint dir to resume from"):
        prepare(config("gpt-oss-20b", feasible_nodes("gpt-oss-20b")), run="oss-b", resume=rec)
    # the job's own command line decides: a --save given through --extra-args is what is recorded
    saved = prepare(config("gpt-oss-20b", feasible_nodes("gpt-oss-20b")), run="oss-c",
                    extra_args=["--save", "/mnt/miles/runs/oss-c/ckpt", "--save-interval", "10"]).record
    assert saved["checkpoint_dir"] == "/mnt/miles/runs/oss-c/ckpt"
    assert resume_target(saved) == ResumeTarget("/mnt/miles/runs/oss-c", "/mnt/miles/runs/oss-c/ckpt", "oss-c")


def from_before(record: dict) -> dict:
    """``record`` as miles-ray wrote it before it kept checkpoint dirs."""
    return {k: v for k, v in record.items() if k not in ("checkpoint_dir", "load_dir", "checkpoint_dirs_from")}


def test_a_record_from_before_falls_back_to_output_dir_checkpoints():
    for mode in ("launcher", "rehearse"):
        rec = from_before(prepare(config("Qwen3-30B-A3B", 1), run="old-a", mode=mode if mode != "rehearse" else
                                  "direct", rehearse=mode == "rehearse").record)
        ck = run_checkpoints(rec)
        assert (ck.save, ck.load, ck.source) == (f"{MOUNT}/runs/old-a/checkpoints",) * 2 + ("assumed",)
        assert "<output_dir>/checkpoints assumed" in ck.note
        assert resume_target(rec).checkpoint_dir == f"{MOUNT}/runs/old-a/checkpoints"


def test_a_direct_record_from_before_says_it_in_its_command_line():
    rec = from_before(prepare(config("Qwen3-30B-A3B", 1), run="old-a").record)
    ck = run_checkpoints(rec)
    assert (ck.save, ck.load, ck.source) == (f"{MOUNT}/runs/old-a/old-a/checkpoints",) * 2 + ("entrypoint",)
    no_save = from_before(prepare(config("gpt-oss-20b", feasible_nodes("gpt-oss-20b")), run="old-b").record)
    assert run_checkpoints(no_save).source == "assumed"  # nothing to read: the old assumption


# -- resume: the new job loads from where the previous one saved ---------------------------------------

def load_of(job) -> list[str]:
    argv = shlex.split(job.entrypoint)
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--load"]


def test_resume_loads_from_the_previous_runs_checkpoint_dir_under_its_run_id():
    base = prepare(config("Qwen3-30B-A3B", 1), run="moe-a")
    assert base.record["checkpoint_dir"] == f"{MOUNT}/runs/moe-a/moe-a/checkpoints"
    job = prepare(config("Qwen3-30B-A3B", 1), run="moe-b", resume=base.record)
    assert load_of(job) == [base.record["checkpoint_dir"]] and job.record["load_dir"] == base.record["checkpoint_dir"]
    assert job.record["checkpoint_dir"] == base.record["checkpoint_dir"]  # it keeps saving there
    assert job.resume == ResumeTarget(f"{MOUNT}/runs/moe-a", base.record["checkpoint_dir"], "moe-a")


@pytest.mark.parametrize("name, before", [
    ("Qwen3-4B-CP4", [f"{MOUNT}/models/Qwen3-4B_torch_dist"]),  # its --load is the base model
    ("Nemotron-3-Nano-4B", []),  # it passes no --load
])
def test_resume_replaces_or_adds_load_when_the_recipe_loads_elsewhere(name, before):
    nodes = feasible_nodes(name)
    base = prepare(config(name, nodes), run="r-a")
    assert load_of(base) == before
    job = prepare(config(name, nodes), run="r-b", resume=base.record)
    assert load_of(job) == [base.record["checkpoint_dir"]] == [job.record["load_dir"]]
    # launcher mode: the launcher passes its own --load; it would not continue the checkpoints, so it is refused
    if BUILTIN[name].launcher_min_nodes is None or nodes >= BUILTIN[name].launcher_min_nodes:
        with pytest.raises(ConfigError, match=r"the upstream launcher .* not from .* where run r-a saved"):
            prepare(config(name, nodes), run="r-c", resume=base.record, mode="launcher")


def test_resume_in_launcher_mode_when_the_launcher_loads_where_it_saved():
    base = prepare(config("Qwen3-30B-A3B", 1), run="moe-a", mode="launcher")
    job = prepare(config("Qwen3-30B-A3B", 1), run="moe-b", resume=base.record, mode="launcher")
    assert job.record["load_dir"] == base.record["checkpoint_dir"] == f"{MOUNT}/runs/moe-a/moe-a/checkpoints"
    assert "--run-id moe-a" in job.entrypoint and f"--output-dir {MOUNT}/runs/moe-a" in job.entrypoint


def test_forced_resume_across_recipes_loads_from_the_previous_dir():
    base = prepare(config("Qwen3-4B", 2), run="x-a")
    job = prepare(config("Qwen3-30B-A3B", 1), run="x-b", resume=base.record, force=True)
    assert load_of(job) == [f"{MOUNT}/runs/x-a/checkpoints"]


def test_resume_from_a_record_from_before():
    base = from_before(prepare(config("Qwen3-30B-A3B", 1), run="old-a", rehearse=True).record)
    job = prepare(config("Qwen3-30B-A3B", 1), run="old-b", resume=json.loads(json.dumps(base)))
    assert load_of(job) == [f"{MOUNT}/runs/old-a/checkpoints"]
    base = from_before(prepare(config("Qwen3-30B-A3B", 1), run="old-c").record)
    job = prepare(config("Qwen3-30B-A3B", 1), run="old-d", resume=base)
    assert load_of(job) == [f"{MOUNT}/runs/old-c/old-c/checkpoints"]


# -- the flag helpers ---------------------------------------------------------------------------------

def test_flag_value_follows_argparse():
    argv = ["train.py", "--save", "/a", "--save-interval", "20", "--load=/b", "--save", "/c"]
    assert flag_value(argv, "--save") == "/c" and flag_value(argv, "--load") == "/b"
    assert flag_value(argv, "--ref-load") is None and flag_value(["--save"], "--save") is None
    assert checkpoint_dirs(argv) == ("/c", "/b")
    assert set_flag(["--load", "/x", "--lr", "1"], "--load", "/y") == ["--load", "/y", "--lr", "1"]
    assert set_flag(["--load=/x"], "--load", "/y") == ["--load=/y"]
    assert set_flag(["--lr", "1"], "--load", "/y") == ["--lr", "1", "--load", "/y"]


# -- the verbs: a run that saves no checkpoints is refused up front, before any cluster is contacted ---------

CLOSED = "http://127.0.0.1:9"  # a closed port: nothing answers there


@pytest.fixture
def records(clean_env, monkeypatch):
    """Run records in a fresh state dir, as submit writes them, on a head nothing answers at."""
    from miles_ray.adapters import state

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))

    def add(recipe: str, run: str, **request) -> dict:
        cfg = config(recipe, feasible_nodes(recipe))
        valid = validate_request(cfg, SubmitRequest(run=run, **request))
        resume = request.get("resume_from") and state.load_record(request["resume_from"])
        rec = prepare_submit(cfg, valid, SubmitTarget("address", CLOSED), created=CREATED, launchers_dir="/unused",
                             resume=resume).record
        state.save_record(rec) if resume else state.create_record(rec)  # as submit does
        return rec

    return add


def test_check_data_refuses_to_resume_a_run_without_save(cli, records):
    records("gpt-oss-20b", "oss-a")
    code, out, err = cli("check-data", "--address", CLOSED, "--recipe", "gpt-oss-20b", "--resume-from", "oss-a")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert "run oss-a has no checkpoint dir to resume from" in err and "passes no --save" in err
    # an output dir no record names: where the recipe's job would save for it -- none for this recipe
    code, _, err = cli("check-data", "--address", CLOSED, "--recipe", "gpt-oss-20b", "--resume-from",
                       "/mnt/miles/runs/elsewhere")
    assert code == 2 and "passes no --save" in err and err.count("\n") == 1


def test_register_refuses_a_run_without_save(cli, records):
    records("gpt-oss-20b", "oss-a")
    code, out, err = cli("register", "oss-a", "--checkpoint", "20", "--polyaxon-host", CLOSED, "-o", "json")
    assert code == 2 and err.count("error: ") == 1 and err.splitlines()[-1].startswith("error: run oss-a has no "
                                                                                      "checkpoint dir")


def test_doctor_reads_the_recorded_dirs(cli, records):
    records("gpt-oss-20b", "oss-a")
    code, out, err = cli("doctor", "oss-a", "-o", "json")
    f = {x["check"]: x for x in json.loads(out)["findings"]}["resume"]
    assert f["status"] == "warning" and "saves no checkpoints" in f["summary"]
    base = records("Qwen3-30B-A3B", "moe-a")
    records("Qwen3-30B-A3B", "moe-b", resume_from="moe-a")
    code, out, err = cli("doctor", "moe-b", "-o", "json")
    f = {x["check"]: x for x in json.loads(out)["findings"]}["resume"]
    assert f["status"] == "ok" and base["checkpoint_dir"] in f["summary"]
    assert base["checkpoint_dir"] == f"{MOUNT}/runs/moe-a/moe-a/checkpoints"


# ---- checkpoints outside the shared volume: submit warns (a KubeRay or Polyaxon cluster made by miles-ray) ----

K8S = "k8s://ml/ck"


def prepare_on(backend: str, address: str, cfg, **request):
    valid = validate_request(cfg, SubmitRequest(**request))
    return prepare_submit(cfg, valid, SubmitTarget(backend, address), created=CREATED, launchers_dir="/unused")


def saves_outside_the_volume(name: str) -> bool:
    """From the capture alone: the launcher's --save is neither absent nor under {output_dir} (which is under the
    mount path): e.g. the LoRA launcher's /personal/checkpoints/{run_id}."""
    save = template(name, "--save")
    return save is not None and not save.startswith("{output_dir}")


@pytest.mark.parametrize("name", CATALOG)
def test_a_save_outside_the_volume_warns_on_a_kubernetes_cluster(name):
    # (a run's record says kuberay for a head on Kubernetes, Polyaxon-made or not: resolve_address says no other)
    job = prepare_on("kuberay", K8S, config(name, feasible_nodes(name)), run="ck-run")
    if saves_outside_the_volume(name):
        [w] = job.warnings
        assert w.startswith(f"run ck-run saves its checkpoints to {job.record['checkpoint_dir']}, outside")
        assert f"miles-data at {MOUNT}" in w
        assert w.endswith(f"--extra-args '--save {MOUNT}/runs/ck-run/checkpoints'")
    else:
        assert job.warnings == ()


def test_the_lora_recipe_is_the_one_that_saves_outside():
    assert [n for n in CATALOG if saves_outside_the_volume(n)] == ["Qwen3.5-35B-A3B-LoRA"]


def test_the_suggested_save_silences_it_and_is_recorded():
    name = "Qwen3.5-35B-A3B-LoRA"
    cfg = config(name, feasible_nodes(name))
    job = prepare_on("kuberay", K8S, cfg, run="lora-1", extra_args=["--save", f"{MOUNT}/runs/lora-1/checkpoints"])
    assert job.warnings == ()
    assert job.record["checkpoint_dir"] == f"{MOUNT}/runs/lora-1/checkpoints"


@pytest.mark.parametrize("mode", ["launcher", "rehearse"])
def test_every_mode_that_knows_the_save_warns(mode):
    name = "Qwen3.5-35B-A3B-LoRA"
    cfg = config(name, feasible_nodes(name, "launcher" if mode == "launcher" else "direct"),
                 image="radixark/miles:v1@sha256:" + "ab" * 32)
    request = {"mode": "launcher"} if mode == "launcher" else {"rehearse": True}
    job = prepare_on("kuberay", K8S, cfg, run="lora-2", **request)
    [w] = job.warnings
    assert "/personal/checkpoints/" in w


@pytest.mark.parametrize("backend,address", [("local", "http://127.0.0.1:8265"), ("address", URL)])
def test_no_warning_where_the_volumes_are_not_miles_rays(backend, address):
    """The local backend is one filesystem; a bare dashboard URL's head has volumes nobody here knows."""
    name = "Qwen3.5-35B-A3B-LoRA"
    job = prepare_on(backend, address, config(name, feasible_nodes(name)), run="ck-run")
    assert job.warnings == ()


@pytest.mark.parametrize("save,warned", [("/data/ckpt", False), ("/data", False), ("/database/ckpt", True),
                                         ("/mnt/miles/ckpt", True), ("/data/../etc/x", True),
                                         ("/data/./ckpt/", False), ("ckpt", True)])
def test_under_the_mount_means_under_its_path(save, warned):
    """A path component prefix, not a string prefix: /database is not under /data; '..' and '.' are taken as the
    kernel takes them; a relative --save is relative to the job's working dir, not on the volume."""
    name = "Qwen3-4B"
    job = prepare_on("kuberay", K8S, config(name, feasible_nodes(name), mount_path="/data"), run="m",
                     extra_args=["--save", save])
    assert bool(job.warnings) is warned, job.warnings


def test_submit_prints_the_warning_and_json_carries_it(cli, tmp_path, monkeypatch):
    """Through the CLI, contacting nothing (--dry-run client): one 'warning:' line on stderr naming where the
    checkpoints would go and the flag that keeps them; -o json has it under "warnings"; exit 0 (a warning)."""
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    name = "Qwen3.5-35B-A3B-LoRA"
    args = ["submit", "--address", K8S, "--recipe", name, "--nodes", str(feasible_nodes(name)), "--run", "lora-3",
            "--dry-run", "client"]
    code, out, err = cli(*args)
    assert code == 0, err
    [line] = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert "/personal/checkpoints/lora-3" in line and line.endswith("/runs/lora-3/checkpoints'"), err
    code, out, err = cli(*args, "-o", "json")
    assert code == 0, err
    [w] = json.loads(out)["warnings"]
    assert w.endswith(f"--extra-args '--save {MOUNT}/runs/lora-3/checkpoints'")
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.json"))  # nothing recorded
