"""Every run verb takes -c/--config, as status and submit do: a user who passes ``-c miles-ray.yaml`` to every verb
is never told "No such option: -c". The file is read and checked as every verb reads it, and how it says the
Kubernetes API is reached (kubeconfig, kube_context) is how the run's head is reached (flags first). No cluster."""

from __future__ import annotations

import json

import pytest

RUN_VERBS = (("logs", "r-1"), ("stop", "r-1"), ("runs",), ("runs", "compare", "r-1", "r-2"))


@pytest.fixture
def k8s_runs(clean_env, monkeypatch):
    """Two run records on a KubeRay head (reached through a port-forward, so through a kubeconfig)."""
    from miles_ray.adapters import state

    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(clean_env / "state"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for run in ("r-1", "r-2"):
        state.save_record({"run": run, "submission_id": f"miles-ray-q4-{run}", "address": "k8s://ml/q4",
                           "output_dir": f"/o/{run}", "recipe": "Qwen3-4B", "mode": "direct", "created": run,
                           "cluster": "q4", "backend": "kuberay", "split": {}})
    return clean_env


@pytest.mark.parametrize("verb", RUN_VERBS, ids=" ".join)
@pytest.mark.parametrize("flag", ["-c", "--config"])
def test_run_verbs_read_the_config_file_they_are_given(cli, k8s_runs, verb, flag):
    """The config's kubeconfig is the one the run's head is reached through: a config naming one that does not
    exist says so (exit 2, one line), where without -c the verb reached for another."""
    kubeconfig = k8s_runs / "no-such-kubeconfig"
    (k8s_runs / "team.yaml").write_text(f"kubeconfig: {kubeconfig}\n")
    code, out, err = cli(*verb, flag, "team.yaml")
    assert code == 2 and out == "", err
    assert "No such option" not in err
    assert err.count("error: ") == 1 and f"kubeconfig {kubeconfig} does not exist" in err
    # --kubeconfig on the command line wins over the file's
    code, _, err = cli(*verb, flag, "team.yaml", "--kubeconfig", str(k8s_runs / "flag-kubeconfig"))
    assert code == 2 and f"kubeconfig {k8s_runs / 'flag-kubeconfig'} does not exist" in err


@pytest.mark.parametrize("verb", RUN_VERBS, ids=" ".join)
def test_a_config_file_that_does_not_exist_is_bad_input(cli, k8s_runs, verb):
    code, out, err = cli(*verb, "-c", "missing.yaml")
    assert (code, out) == (2, "") and err.strip() == "error: config file missing.yaml does not exist"


def test_runs_with_a_config_lists_the_runs(cli, k8s_runs):
    (k8s_runs / "miles-ray.yaml").write_text("namespace: ml\n")
    code, out, err = cli("runs", "-c", "miles-ray.yaml", "--no-live", "-o", "json")
    assert code == 0, err
    assert [r["run"] for r in json.loads(out)] == ["r-1", "r-2"]
    # a config that is not valid is said, not a traceback
    (k8s_runs / "bad.yaml").write_text("nodes: many\n")
    code, out, err = cli("runs", "-c", "bad.yaml", "--no-live")
    assert code == 2 and out == "" and err.startswith("error: ") and "Traceback" not in err
