"""'up' and 'down' are idempotent the right way round, on a real embedded cluster made by the CLI: the same 'up'
again changes nothing, another size is refused (exit 2) naming the fix, and 'down' of a cluster already down
exits 0 saying so (a 'trap "miles-ray down -y" EXIT' clean-up must not fail)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.ray


@pytest.fixture
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("MILES_RAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # auto: no Kubernetes to look in either
    monkeypatch.chdir(tmp_path)
    return tmp_path / "state"


def test_up_again_is_a_no_op_another_size_is_refused_and_down_twice_exits_0(cli, state):
    from miles_ray.adapters import local_ray as lr

    name = "idem"
    try:
        code, out, err = cli("up", "--backend", "local", "--name", name, "-N", "1", "-G", "2", "--timeout", "200",
                             "-o", "json")
        assert code == 0, err
        assert json.loads(out)["already_running"] is False
        code, out, err = cli("up", "--name", name, "-N", "1", "-G", "2", "-o", "json")
        assert code == 0 and json.loads(out)["already_running"] is True, err
        assert "nothing changed" in err
        code, _, err = cli("up", "--name", name, "-N", "2", "-G", "2")
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(lines) == 1, err
        assert "1 GPU node(s) running, --nodes 2" in lines[0] and "'miles-ray scale --nodes 2'" in lines[0]
        code, _, err = cli("up", "--name", name, "-N", "1", "-G", "4")
        assert code == 2 and "2 GPUs per node running, --gpus-per-node 4" in err and "'miles-ray down' then 'up'" in err
        assert lr.status(state / "local", name)["gpu_node_count"] == 1  # nothing changed
    finally:
        code, _, err = cli("down", "-y", "--name", name)
    assert code == 0 and "is down (local)" in err, err
    for backend in ("local", "auto"):
        code, out, err = cli("down", "-y", "--name", name, "--backend", backend, "-o", "json")
        assert code == 0, err
        assert json.loads(out)["already_down"] is True
    code, _, err = cli("down", "-y", "--name", name, "--backend", "local")
    assert code == 0 and f"cluster '{name}' was already down (local); nothing to do" in err
