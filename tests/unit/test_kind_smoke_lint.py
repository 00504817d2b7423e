"""The kind smoke test (scripts/kind-smoke.sh) and the GitHub workflows cannot run here (no Docker engine,
no registry): they are linted (shellcheck, actionlint) and their pins and structure are checked here.

The linters are installed by scripts/test-tools.sh (ShellCheck: the Debian package; actionlint: built from its
Go module into ${MILESRAY_TEST_CACHE:-~/.cache/miles-ray}/bin/actionlint-<version>) and found on PATH or in that
cache. A missing linter skips its test with the reason, or fails it when MILESRAY_TEST_STRICT=1 (the test
switch scripts/test.sh sets in CI). Everything else is plain Python.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import DIGEST, REPO

SMOKE = REPO / "scripts" / "kind-smoke.sh"
SEQUENCE = REPO / "scripts" / "smoke-sequence.sh"  # the miles-ray steps, shared with tests/realpods
WORKFLOWS = REPO / ".github" / "workflows"
SHA_PIN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")


def _workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def _load(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in wf and "on" not in wf:  # YAML 1.1: a bare `on:` key loads as True
        wf["on"] = wf.pop(True)
    return wf


def _steps(wf: dict) -> list[dict]:
    return [s for job in (wf.get("jobs") or {}).values() for s in (job.get("steps") or [])]


def _script_vars(text: str) -> dict[str, str]:
    """Top-level NAME=value assignments of the smoke script, with ${SMOKE_X:-default} taken at its default
    and $((NAME + k)) evaluated. The first assignment of a name wins (later ones are run-time state)."""
    out: dict[str, str] = {}
    for name, rhs in re.findall(r"^([A-Z][A-Z0-9_]*)=(.+?)\s*(?:#.*)?$", text, re.M):
        if len(rhs) >= 2 and rhs[0] == rhs[-1] == '"':
            rhs = rhs[1:-1]
        default = re.fullmatch(r"\$\{SMOKE_[A-Z0-9_]+:-(.*)\}", rhs)
        if default:
            rhs = default.group(1)
        arith = re.fullmatch(r"\$\(\(([A-Z_]+) \+ (\d+)\)\)", rhs)
        if arith:
            rhs = str(int(out[arith.group(1)]) + int(arith.group(2)))
        out.setdefault(name, rhs)
    return out


def _heredoc(text: str, opener: str) -> str:
    """The body of the heredoc started by the line ``opener`` (ending at the line EOF)."""
    start = text.index(opener + "\n") + len(opener) + 1
    return text[start:text.index("\nEOF\n", start)]


def _expand(body: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{([A-Z_]+)\}", lambda m: values[m.group(1)], body)


@pytest.fixture(scope="module")
def smoke() -> str:
    return SMOKE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def smoke_vars(smoke) -> dict[str, str]:
    return _script_vars(smoke)


# -- linters ----------------------------------------------------------------------------------------

TOOLS_SCRIPT = REPO / "scripts" / "test-tools.sh"


def _missing(what: str) -> None:
    """Skip the test for a linter that is not installed, or fail under MILESRAY_TEST_STRICT=1."""
    message = f"{what} is not installed (scripts/test-tools.sh installs it)"
    if os.environ.get("MILESRAY_TEST_STRICT") == "1":
        pytest.fail(f"MILESRAY_TEST_STRICT=1 but {message}", pytrace=False)
    pytest.skip(message)


def _tools_cache() -> Path:
    return Path(os.environ.get("MILESRAY_TEST_CACHE") or Path.home() / ".cache" / "miles-ray") / "bin"


def _shellcheck() -> str | None:
    return shutil.which("shellcheck")


def _actionlint() -> str | None:
    """The pinned actionlint from the tools cache, else one on PATH."""
    version = re.search(r"^ACTIONLINT_VERSION=(v\d+\.\d+\.\d+)$", TOOLS_SCRIPT.read_text(), re.M).group(1)
    cached = _tools_cache() / f"actionlint-{version}"
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("actionlint")


def test_shell_scripts_pass_shellcheck():
    shellcheck = _shellcheck()
    if not shellcheck:
        _missing("shellcheck")
    scripts = sorted([*(REPO / "scripts").glob("*.sh"), *(REPO / "cluster").glob("*.sh")])
    assert SMOKE in scripts
    proc = subprocess.run([shellcheck, "-x", *(str(p.relative_to(REPO)) for p in scripts)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"shellcheck:\n{proc.stdout}{proc.stderr}"


def test_workflows_pass_actionlint():
    actionlint = _actionlint()
    if not actionlint:
        _missing("actionlint")
    files = _workflow_files()
    assert files, "no workflows in .github/workflows"
    # actionlint also runs shellcheck on every `run:` block: give it the same shellcheck (required)
    shellcheck = _shellcheck()
    if not shellcheck:
        _missing("shellcheck")
    proc = subprocess.run([actionlint, "-color=false", f"-shellcheck={shellcheck}",
                           *(str(p.relative_to(REPO)) for p in files)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"actionlint:\n{proc.stdout}{proc.stderr}"


# -- workflows --------------------------------------------------------------------------------------

def test_every_action_is_pinned_to_a_commit_sha_with_its_version_in_a_comment():
    files = _workflow_files()
    assert {p.name for p in files} >= {"kind-smoke.yml", "ci.yml"}
    for path in files:
        wf = _load(path)
        uses = [s["uses"] for s in _steps(wf) if "uses" in s]
        uses += [j["uses"] for j in (wf.get("jobs") or {}).values() if "uses" in j]  # reusable workflows
        assert uses, f"{path.name}: no actions at all?"
        for ref in uses:
            if ref.startswith("./"):
                continue  # local action: versioned with the repository
            assert SHA_PIN.match(ref), f"{path.name}: {ref!r} is not pinned to a 40-hex commit SHA"
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"^\s*(-\s+)?uses:\s*[^.\s]", line):
                assert re.search(r"@[0-9a-f]{40}\s+#\s*v\d+(\.\d+)*\b", line), \
                    f"{path.name}: say which version the SHA is, e.g. '# v1.2.3': {line.strip()}"


def test_kind_smoke_workflow(smoke_vars):
    wf = _load(WORKFLOWS / "kind-smoke.yml")
    assert {"pull_request", "workflow_dispatch"} <= set(wf["on"])
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert 0 < int(job["timeout-minutes"]) <= 90
    steps = job["steps"]
    runs = [s.get("run", "") for s in steps]
    assert any(r.strip() == "scripts/kind-smoke.sh" for r in runs)
    assert any("pip install -c constraints.txt -e ." in r for r in runs)
    uploads = [s for s in steps if "actions/upload-artifact@" in s.get("uses", "")]
    assert len(uploads) == 1 and "failure()" in uploads[0]["if"]
    smoke_step = next(s for s in steps if s.get("run", "").strip() == "scripts/kind-smoke.sh")
    assert uploads[0]["with"]["path"] == smoke_step["env"]["SMOKE_ARTIFACTS_DIR"]
    setup_python = next(s for s in steps if "actions/setup-python@" in s.get("uses", ""))
    assert str(setup_python["with"]["python-version"]) == "3.11"
    # tool versions pinned exactly; kind is the release the pinned node image was built for
    env = wf["env"]
    for key in ("KIND_VERSION", "KUBECTL_VERSION", "HELM_VERSION"):
        assert re.fullmatch(r"v\d+\.\d+\.\d+", env[key]), f"{key}={env[key]!r} is not an exact version"
    assert env["KIND_VERSION"] == smoke_vars["KIND_VERSION_BUILT_FOR"]
    node_minor = re.match(r"kindest/node:v(\d+)\.(\d+)\.", smoke_vars["KIND_NODE_IMAGE"]).groups()
    kubectl_minor = re.match(r"v(\d+)\.(\d+)\.", env["KUBECTL_VERSION"]).groups()
    assert abs(int(node_minor[1]) - int(kubectl_minor[1])) <= 1 and node_minor[0] == kubectl_minor[0]
    kind = next(s for s in steps if "helm/kind-action@" in s.get("uses", ""))
    assert kind["with"]["install_only"] is True  # the script owns the cluster's life cycle


def test_ci_workflow_runs_our_suite_with_the_pinned_go():
    wf = _load(WORKFLOWS / "ci.yml")
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and int(job["timeout-minutes"]) > 0
    [suite] = [s for s in job["steps"] if "./scripts/test.sh" in s.get("run", "")]
    # the README's test command, strict (its default: no MILESRAY_TEST_STRICT=0), deselecting only the real-pod
    # tier this runner cannot run, and saying why
    lines = [ln.strip() for ln in suite["run"].strip().splitlines()]
    assert lines[-1] == './scripts/test.sh -m "not real_pods"', lines
    assert "STRICT" not in suite["run"] and "root" in suite["run"] and "cgroup" in suite["run"], suite["run"]
    go = next(s for s in job["steps"] if "actions/setup-go@" in s.get("uses", ""))
    versions = dict(re.findall(r"^([A-Z_]+)=(\S+)$", (REPO / "cluster" / "versions.env").read_text(), re.M))
    assert str(go["with"]["go-version"]) == versions["GO_VERSION"]
    assert str(go["with"]["go-version"]).startswith("1.26.")


# -- the smoke script's pins ------------------------------------------------------------------------

def test_smoke_pins_the_kind_node_image_by_digest(smoke, smoke_vars):
    image = smoke_vars["KIND_NODE_IMAGE"]
    assert re.fullmatch(r"kindest/node:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", image), image
    cfg = yaml.safe_load(_expand(_heredoc(smoke, 'cat >"${WORKDIR}/kind.yaml" <<EOF'),
                                 {**smoke_vars, "CLUSTER": "miles-ray-smoke"}))
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4" and cfg["kind"] == "Cluster"
    assert [n["role"] for n in cfg["nodes"]] == ["control-plane", "worker", "worker"]
    assert all(n["image"] == image for n in cfg["nodes"])
    assert smoke.count("image: ${KIND_NODE_IMAGE}") == 3


def test_smoke_pins_the_ray_image_by_digest(smoke, smoke_vars):
    ray_pin = re.search(r"^ray(?:\[[^\]]*\])?==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert ray_pin, "ray is not pinned in constraints.txt"
    assert smoke_vars["RAY_VERSION"] == ray_pin.group(1), "image, client and pods run one Ray"
    assert smoke_vars["RAY_IMAGE_TAG"] == f"rayproject/ray:{smoke_vars['RAY_VERSION']}-py311-cpu"
    digest = smoke_vars["RAY_IMAGE_DIGEST"]
    if digest:
        assert SHA256.match(digest), digest
    else:
        # no digest pinned in the file: resolved once at run time, and the run fails without one
        assert "resolve_ray_digest" in smoke
        assert 'RAY_IMAGE="${RAY_IMAGE_TAG}@${RAY_IMAGE_DIGEST}"' in smoke
        assert '[[ "${RAY_IMAGE_DIGEST}" =~ ^sha256:[0-9a-f]{64}$ ]] ||' in smoke
    assert '[[ "${RAY_IMAGE}" =~ @sha256:[0-9a-f]{64}$ ]] || die' in smoke
    # every image handed to miles-ray or pulled into a node is the pinned reference, never the bare tag
    assert 'SMOKE_IMAGE="${RAY_IMAGE}"' in smoke and not re.findall(r"--image\s+(\S+)", smoke)
    sequence = SEQUENCE.read_text(encoding="utf-8")
    image_args = re.findall(r"--image\s+(\S+)", sequence)
    assert image_args and set(image_args) == {'"${SMOKE_IMAGE}"'}
    assert 'crictl pull "${RAY_IMAGE}"' in smoke


def test_smoke_pins_the_kuberay_helm_chart(smoke, smoke_vars):
    assert re.fullmatch(r"\d+\.\d+\.\d+", smoke_vars["KUBERAY_CHART_VERSION"])
    assert smoke_vars["KUBERAY_CHART_REPO"] == "https://ray-project.github.io/kuberay-helm/"
    joined = re.sub(r"\\\n\s*", " ", smoke)  # join continuation lines
    helm = re.search(r"^helm install kuberay-operator kuberay-operator .*$", joined, re.M)
    assert helm, "helm install of the kuberay-operator chart not found"
    assert '--version "${KUBERAY_CHART_VERSION}"' in helm.group(0)
    assert '--repo "${KUBERAY_CHART_REPO}"' in helm.group(0)
    versions = dict(re.findall(r"^([A-Z_]+)=(\S+)$", (REPO / "cluster" / "versions.env").read_text(), re.M))
    assert smoke_vars["KUBERAY_CHART_VERSION"] == versions["KUBERAY_VERSION"].lstrip("v"), \
        "the smoke's operator is the one our e2e tests run"


def test_smoke_fake_gpu_nodes_and_cleanup(smoke):
    assert "--subresource=status --type=json" in smoke
    assert "/status/capacity/nvidia.com~1gpu" in smoke and "/status/allocatable/nvidia.com~1gpu" in smoke
    assert "nvidia.com/gpu.present=true" in smoke
    assert "nvidia.com/gpu=present:NoSchedule" in smoke
    assert "node-role.kubernetes.io/control-plane:NoSchedule-" in smoke  # head goes to the control plane
    assert re.search(r"^trap on_exit EXIT$", smoke, re.M)
    assert 'kind delete cluster --name "${CLUSTER}"' in smoke
    assert '"$(dirname "${BASH_SOURCE[0]}")/smoke-sequence.sh"' in smoke  # the shared sequence runs
    sequence = SEQUENCE.read_text(encoding="utf-8")
    assert "UP=(up --via kuberay " in sequence and 'mr "${UP[@]}" --nodes 2 --timeout' in sequence
    for verb in ("submit --rehearse --nodes 2", "scale --nodes 1", "scale --nodes 2", "logs",
                 "status --backend kubernetes --ray -o json", "down -y"):
        assert f"mr {verb}" in sequence, verb


def test_smoke_config_is_valid_and_fits_a_4_vcpu_runner(smoke, smoke_vars, cli, clean_env):
    """The miles-ray.yaml the script generates loads, plans and renders; its pods fit ubuntu-latest."""
    env = {"PATH": os.environ["PATH"], "SMOKE_NAMESPACE": "miles-smoke", "SMOKE_NAME": smoke_vars["NAME"],
           "SMOKE_GPUS_PER_NODE": smoke_vars["GPUS_PER_NODE"], "SMOKE_WORKER_MEMORY": smoke_vars["WORKER_MEMORY"],
           "SMOKE_HEAD_MEMORY": smoke_vars["HEAD_MEMORY"]}
    for name in env:
        if name.startswith("SMOKE_"):
            assert f'{name}="${{' in smoke, f"kind-smoke.sh does not hand {name} to the sequence"
    proc = subprocess.run(["bash", str(SEQUENCE), "--print-config"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout
    cfg_file = clean_env / "miles-ray.yaml"
    cfg_file.write_text(body)
    cfg = yaml.safe_load(body)
    g, cpus = int(smoke_vars["GPUS_PER_NODE"]), int(smoke_vars["CPUS_PER_NODE"])
    assert cfg["gpus_per_node"] == g and cfg["cpus_per_node"] == cpus == g + 1
    # every kind node sees the runner's 4 vCPUs; kindnet and coredns already request ~0.3 CPU
    assert cpus <= 3 and int(cfg["head_cpus"]) <= 2
    for nodes in (1, 2, 4):  # scale target, up, and the preflight's too-many probe
        # the smoke's pods are sized for a rehearsal on a 4-vCPU runner (no model loaded), not for Qwen3-4B's host
        # memory: plan says so, and --no-memory-check plans the split anyway
        code, out, err = cli("plan", "--nodes", str(nodes), "-G", str(g), "-c", str(cfg_file), "-o", "json")
        assert code == 2 and "does not fit (GPU memory unknown, GPU parts not checked): host needs" in err, \
            f"plan --nodes {nodes}: {out}{err}"
        code, out, err = cli("plan", "--nodes", str(nodes), "-G", str(g), "-c", str(cfg_file), "-o", "json",
                             "--no-memory-check")
        assert code == 0 and json.loads(out)["memory"]["fits"] is False, f"plan --nodes {nodes}: {out}{err}"
    image = f"{smoke_vars['RAY_IMAGE_TAG']}@{DIGEST}"
    code, out, err = cli("render", "-F", "kuberay", "--nodes", "2", "--image", image,
                         "--ray-version", smoke_vars["RAY_VERSION"], "-c", str(cfg_file))
    assert code == 0, err
    rc = yaml.safe_load(out)
    assert rc["metadata"]["name"] == smoke_vars["NAME"] and rc["metadata"]["namespace"] == "miles-smoke"
    (group,) = rc["spec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    requests = pod["containers"][0]["resources"]["requests"]
    assert requests["cpu"] == str(cpus) and requests["nvidia.com/gpu"] == str(g)
    assert group["rayStartParams"]["num-gpus"] == str(g)
    # the workers tolerate the taint the script puts on the fake GPU nodes
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"miles-data"}
