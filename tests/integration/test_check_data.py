"""`miles-ray check-data` against the real embedded Ray cluster (head + 4 worker raylets x 8 fake GPUs).

The payload really runs as a Ray job with one task pinned to each node. All nodes of the embedded cluster
share this machine's filesystem, so the shared volume is a tmp dir. Nodes that do NOT see the volume are real:
the test backend (tests/infra/faulty_nodes.py) adds extra worker nodes whose raylets run in their own mount
namespace, where the volume is an empty local directory or absent -- the product has no switch for it."""

from __future__ import annotations

from miles_ray.core.errors import EXIT_CHECKS_FAILED
import json
from pathlib import Path

import pytest

from miles_ray.adapters.ray_jobs import cluster_topology
from tests.infra.faulty_nodes import NodeSpec, extra_nodes

pytestmark = pytest.mark.ray

PROBLEMS_FOUND = EXIT_CHECKS_FAILED  # checks found problems (the report is printed first)


def prepare(mount: Path, *, eval_data: bool = True, megatron: bool = True) -> None:
    """The Polyaxon-Miles guide's layout: models/Qwen3-4B, models/Qwen3-4B_torch_dist, datasets/dapo-math-17k, datasets/aime-2024."""
    (mount / "models" / "Qwen3-4B").mkdir(parents=True)
    (mount / "models" / "Qwen3-4B" / "config.json").write_text("{}")
    if megatron:
        (mount / "models" / "Qwen3-4B_torch_dist").mkdir()
    (mount / "datasets" / "dapo-math-17k").mkdir(parents=True)
    (mount / "datasets" / "dapo-math-17k" / "dapo-math-17k.jsonl").write_text('{"prompt": "1+1", "label": "2"}\n')
    if eval_data:
        (mount / "datasets" / "aime-2024").mkdir()
        (mount / "datasets" / "aime-2024" / "aime-2024.jsonl").write_text('{"prompt": "x", "label": "y"}\n')
    (mount / "runs").mkdir()


@pytest.fixture
def mount(env, tmp_path) -> Path:
    m = tmp_path / "volume"
    m.mkdir()
    (tmp_path / "miles-ray.yaml").write_text(f"mount_path: {m}\nrecipe: Qwen3-4B\n")
    return m


def worker_ips(address: str) -> list[str]:
    return [n["ip"] for n in cluster_topology(address)["nodes"] if n["gpus"] > 0]


def check(cli, address: str, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli("check-data", "--address", address, "-o", "json", "--timeout", "60", *args)
    try:
        return code, json.loads(out), err
    except ValueError:
        return code, None, err


def test_everything_present_on_every_node(env, cli, mount):
    prepare(mount)
    code, rep, err = check(cli, env.address)
    assert code == 0, (err, rep)
    assert rep["ok"] and rep["missing"] == []
    roles = sorted(n["role"] for n in rep["nodes"])
    assert roles == ["gpu worker"] * 4 + ["head"]  # the head AND every alive GPU worker
    assert len({n["node_ip"] for n in rep["nodes"]}) == 5
    for n in rep["nodes"]:
        assert n["same_storage"] is True and n["mount_exists"] is True
        assert n["writable_dir"] == str(mount / "runs")
        assert {c["what"] for c in n["checks"]} >= {"HF model (SGLang, tokenizer)", "Megatron checkpoint (--ref-load)",
                                                    "training data", "evaluation data", "output dir parent writable"}
    assert rep["same_storage"]["reference"] == next(n["node_ip"] for n in rep["nodes"] if n["role"] == "head")
    assert not [p for p in (mount / "runs").iterdir()]  # probe files and the token were removed


def test_every_missing_path_reported_at_once(env, cli, mount):
    prepare(mount, eval_data=False, megatron=False)
    code, rep, err = check(cli, env.address)
    assert code == PROBLEMS_FOUND
    assert not rep["ok"]
    assert len(rep["missing"]) == 2 * 5, rep["missing"]  # two paths x (head + 4 workers), in one run
    assert sum(f"{mount}/models/Qwen3-4B_torch_dist" in line for line in rep["missing"]) == 5
    assert sum(f"{mount}/datasets/aime-2024/aime-2024.jsonl" in line for line in rep["missing"]) == 5
    # the table form says the same, one line per problem
    code, out, _ = cli("check-data", "--address", env.address, "--timeout", "60")
    assert code == PROBLEMS_FOUND and out.count("✗") == 10 and "does not exist" in out


def test_volume_on_the_head_but_not_on_two_workers(env, cli, mount, tmp_path, tmp_path_factory):
    """Per-node filesystems, injected by the test backend: two extra GPU workers join the cluster, each in its own
    mount namespace where the volume's parent directory is replaced -- on worker A the volume is an empty local
    directory (the node's own disk), on worker B it does not exist. The head and the other workers see the real
    volume."""
    prepare(mount)
    healthy = worker_ips(env.address)
    local_disk = tmp_path_factory.mktemp("node-a-view")
    (local_disk / mount.name).mkdir()  # an empty directory where the volume should be
    nothing = tmp_path_factory.mktemp("node-b-view")  # no volume at all
    a, b = "127.0.0.61", "127.0.0.62"
    specs = [NodeSpec(a, "local-disk", mounts=[(local_disk, mount.parent)]),
             NodeSpec(b, "no-volume", mounts=[(nothing, mount.parent)])]
    with extra_nodes(env.status(), specs):
        code, rep, err = check(cli, env.address)
    assert code == PROBLEMS_FOUND, err
    by_ip = {n["node_ip"]: n for n in rep["nodes"]}
    assert sorted(n["role"] for n in rep["nodes"]) == ["gpu worker"] * 6 + ["head"]
    assert set(by_ip) >= {a, b, *healthy} and len(healthy) == 4
    assert (by_ip[a]["mount_exists"], by_ip[a]["mount_is_mountpoint"]) == (True, False)  # a plain local dir
    assert by_ip[b]["mount_exists"] is False
    for ip, n in by_ip.items():
        if ip in (a, b):
            assert n["same_storage"] is False
            whats = {m["what"] for m in n["missing"]}
            assert {"HF model (SGLang, tokenizer)", "training data", "same storage as the reference node"} <= whats
        else:
            assert n["missing"] == [] and n["same_storage"] is True
    assert "shared volume mounted" in {m["what"] for m in by_ip[a]["missing"]}       # a local dir, not the volume
    assert "shared volume" in {m["what"] for m in by_ip[b]["missing"]}               # nothing mounted at all
    assert any(line.startswith(f"{b} (gpu worker): shared volume {mount}: does not exist") for line in rep["missing"])


def test_resume_needs_the_checkpoint_tracker(env, cli, mount):
    prepare(mount)
    prev = mount / "runs" / "q4-a"
    (prev / "checkpoints").mkdir(parents=True)
    code, rep, _ = check(cli, env.address, "--resume-from", str(prev))
    assert code == PROBLEMS_FOUND
    assert len(rep["missing"]) == 5
    assert all("latest_checkpointed_iteration.txt" in line and "start from scratch" in line for line in rep["missing"])
    (prev / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("40\n")
    code, rep, err = check(cli, env.address, "--resume-from", str(prev))
    assert code == 0, (err, rep)
    trackers = [c for n in rep["nodes"] for c in n["checks"] if c["what"] == "resume checkpoint tracker"]
    assert len(trackers) == 5 and {c["iteration"] for c in trackers} == {"40"}


def test_resume_looks_where_the_run_saved(env, cli, mount):
    """Qwen3-30B-A3B's launcher saves under <output dir>/<run id>/checkpoints: the run record says so (the --save of
    the job, here of the direct-mode job a placement rehearsal stands in for), and check-data --resume-from RUN looks
    for the tracker there -- not in <output dir>/checkpoints."""
    prepare(mount)
    code, _, err = cli("submit", "--address", env.address, "--name", "miles-test", "--rehearse", "--nodes", "1",
                       "--recipe", "Qwen3-30B-A3B", "--run", "moe-a", "--no-check-data", "-o", "json")
    assert code == 0, err
    code, _, err = cli("stop", "moe-a")  # check-data reads the run's record, not its job: the rehearsal need not run
    assert code == 0, err
    saved = mount / "runs" / "moe-a" / "moe-a" / "checkpoints"
    (mount / "runs" / "moe-a" / "checkpoints").mkdir(parents=True)  # the old assumption's dir, with a tracker
    (mount / "runs" / "moe-a" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("99\n")
    code, rep, err = check(cli, env.address, "--recipe", "Qwen3-30B-A3B", "--resume-from", "moe-a")
    assert code == PROBLEMS_FOUND and rep["resume_checkpoint_dir"] == str(saved), (err, rep)
    missing = [line for line in rep["missing"] if "resume checkpoint tracker" in line]
    assert len(missing) == 5 and all(f"{saved}/latest_checkpointed_iteration.txt" in line for line in missing)
    saved.mkdir(parents=True)
    (saved / "latest_checkpointed_iteration.txt").write_text("40\n")
    code, rep, err = check(cli, env.address, "--recipe", "Qwen3-30B-A3B", "--resume-from", "moe-a")
    trackers = [c for n in rep["nodes"] for c in n["checks"] if c["what"] == "resume checkpoint tracker"]
    assert len(trackers) == 5 and {c["iteration"] for c in trackers} == {"40"}, (err, rep)
    assert not [line for line in rep["missing"] if "resume checkpoint tracker" in line]


def test_service_callable_from_submit(env, mount):
    from miles_ray.core.config import load_config
    from miles_ray.core.recipes import get_recipe
    from miles_ray.services.check_data import check_data

    prepare(mount, eval_data=False)
    cfg = load_config({"mount_path": str(mount)}, environ={})
    rep = check_data(cfg, env.address, get_recipe("Qwen3-4B"), timeout=60)
    assert rep.ok is False and len(rep.missing) == 5 and rep.job.startswith("miles-ray-check-data-")


def test_unreachable_head_is_one_error_line(env, cli, mount):
    code, _, err = cli("check-data", "--address", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach the Ray Jobs API" in err
    assert err.count("error:") == 1 and "Traceback" not in err
    code, _, err = cli("check-data", "--address", "k8s://only-a-namespace")
    assert code == 2 and "is not k8s://NAMESPACE/RAYCLUSTER" in err and err.count("error:") == 1


def test_the_local_cluster_by_name(env, cli, mount, tmp_path):
    """--address local://NAME: the local cluster of that name on this machine (the session cluster, seen through
    this test's state dir)."""
    prepare(mount)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "local").symlink_to(env.state_dir)
    code, rep, err = check(cli, f"local://{env.name}")
    assert code == 0, (err, rep)
    assert rep["address"] == env.address and len(rep["nodes"]) == 5


# -- doctor on the embedded cluster: the Ray-side subset (Ray version, data, checkpoints of a run) -------------

def doctor(cli, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli("doctor", *args, "-o", "json", "--timeout", "60")
    assert out, err
    return code, json.loads(out), err


def test_doctor_address_runs_the_data_checks(env, cli, mount):
    prepare(mount, megatron=False)
    code, rep, err = doctor(cli, "--address", env.address)
    assert code == PROBLEMS_FOUND, err
    f = {x["check"]: x for x in rep["findings"]}
    assert rep["backend"] == "address"
    assert f["ray_version"]["status"] == "ok"
    assert f["data"]["status"] == "problem"
    assert f["data"]["checklist"] == "The launcher cannot find a checkpoint or dataset"
    assert sum("Qwen3-4B_torch_dist" in e for e in f["data"]["evidence"]) == 5  # every node, with the path
    (mount / "models" / "Qwen3-4B_torch_dist").mkdir()
    code, rep, err = doctor(cli, "--address", env.address)
    assert code == 0, (err, rep)
    assert rep["problems"] == 0


def test_doctor_run_that_would_restart_from_scratch(env, cli, mount):
    """A resumed run (submitted as a placement rehearsal: Miles cannot run here) whose output dir has no
    checkpoint tracker yet: doctor RUN says training would restart from scratch; with the tracker it is fine."""
    prepare(mount)
    for run, extra in (("q4-a", []), ("q4-b", ["--resume-from", "q4-a"])):
        code, _, err = cli("submit", "--address", env.address, "--name", "miles-test", "--rehearse", "--nodes", "1",
                           "--run", run, "--no-check-data", "-o", "json", *extra)  # (doctor runs the data checks)
        assert code == 0, err
        code, _, err = cli("stop", run)  # doctor reads the run's record, not its job: the rehearsal need not run
        assert code == 0, err
    code, rep, err = doctor(cli, "q4-b")
    assert code == PROBLEMS_FOUND, err
    assert rep["kind"] == "run" and rep["backend"] == "address"
    f = {x["check"]: x for x in rep["findings"]}
    assert f["resume"]["status"] == "ok"  # q4-b points at q4-a's output dir
    assert f"q4-a wrote to {mount}/runs/q4-a" in f["resume"]["evidence"]
    t = f["resume_tracker"]
    assert t["status"] == "problem" and "training restarts from scratch" in t["summary"]
    assert t["checklist"] == "Training restarts from scratch" and len(t["evidence"]) == 5
    (mount / "runs" / "q4-a" / "checkpoints").mkdir(parents=True)
    (mount / "runs" / "q4-a" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("20\n")
    code, rep, err = doctor(cli, "q4-b")
    assert code == 0, (err, rep)
    assert "iteration 20" in {x["check"]: x for x in rep["findings"]}["resume_tracker"]["summary"]
