"""'up' of a cluster that already runs: the same request is a no-op, another one is refused (exit 2) naming what
differs and the fix, the same way on every backend (services/backends/drift.py)."""

from __future__ import annotations

import pytest

from miles_ray.core.config import load_config
from miles_ray.core.errors import ConfigError
from miles_ray.services.backends.drift import refuse_drift
from miles_ray.services.backends.kuberay import drift, refuse_changed
from miles_ray.services.documents import prepare_cluster
from tests.conftest import IMAGE


def raycluster(**over):
    cfg = load_config({"name": "q4", "namespace": "ml", "nodes": 2, "image": IMAGE, "ray_version": "2.60.0", **over},
                      environ={})
    return cfg, prepare_cluster(cfg, "kuberay").raycluster


def test_the_same_raycluster_is_no_drift():
    cfg, rc = raycluster()
    assert drift(rc, rc) == []
    refuse_changed(cfg, rc, rc, "the")  # no error


def test_another_size_names_scale_and_the_flags_of_the_cluster_as_it_is():
    _, live = raycluster()
    cfg, wanted = raycluster(nodes=4)
    with pytest.raises(ConfigError) as info:
        refuse_changed(cfg, live, wanted, "the")
    text = str(info.value)
    assert info.value.exit_code == 2
    assert "RayCluster ml/q4 is already running and differs from this request: replicas 2 != 4" in text
    assert "'miles-ray scale --nodes 4' resizes it" in text and "--nodes 2 asks for it as it is" in text


def test_another_gpu_count_or_image_names_down_then_up():
    _, live = raycluster()
    cfg, wanted = raycluster(gpus_per_node=4)
    assert drift(live, wanted) == ["GPUs per worker 8 != 4"]
    with pytest.raises(ConfigError, match="'miles-ray down' then 'up' changes the rest"):
        refuse_changed(cfg, live, wanted, "the")


def test_refuse_drift_says_nothing_without_differences():
    refuse_drift("local cluster 'x'", [])
    with pytest.raises(ConfigError, match="--nodes 1 --gpus-per-node 2 asks for it as it is"):
        refuse_drift("local cluster 'x'", ["1 GPU node(s) running, --nodes 2"], live_nodes=1, live_gpus=2, scale_to=2)
