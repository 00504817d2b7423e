"""The field walk preflight uses to refuse what the user's operator does not know (miles_ray/core/crd_fields.py),
against KubeRay's own CRDs: the current one (tests/data/kuberay, v1.6.2) and an older operator's
(tests/data/kuberay/v1.5.0), each checked against its recorded sha256."""

from __future__ import annotations

import copy
import functools
import hashlib

import pytest
import yaml

from miles_ray.core.builders import build_raycluster
from miles_ray.core.config import load_config
from miles_ray.core.crd_fields import (FIELD_SINCE, SCHEMA_KUBERAY_VERSION, first_unknown_field,
                                       kuberay_version_needed, unknown_fields)
from miles_ray.core.errors import EXIT_BAD_INPUT, Invalid
from miles_ray.core.planner import plan_split
from miles_ray.core.recipes import BUILTIN
from tests.conftest import IMAGE, REPO

DATA = REPO / "tests" / "data" / "kuberay"


def _source(directory) -> dict[str, str]:
    lines = [ln for ln in (directory / "SOURCE").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return dict(ln.split("=", 1) for ln in lines)


@functools.lru_cache(maxsize=None)
def _schema(version_dir: str) -> dict:
    directory = DATA / version_dir if version_dir else DATA
    raw = (directory / "ray.io_rayclusters.yaml").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == _source(directory)["SHA256"]
    crd = yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def current() -> dict:
    return _schema("")


def v150() -> dict:
    return _schema("v1.5.0")


def _rendered(**extra) -> dict:
    cfg = load_config({"recipe": "Qwen3-4B", "nodes": 2, "name": "walk", **extra}, environ={})
    return build_raycluster(cfg, plan_split(BUILTIN["Qwen3-4B"], 2, 8), IMAGE, "2.60.0")


def test_schema_version_constant_is_the_recorded_crd() -> None:
    assert _source(DATA)["VERSION"] == SCHEMA_KUBERAY_VERSION
    assert _source(DATA / "v1.5.0")["VERSION"] == "v1.5.0"


def test_what_we_render_is_known_to_the_current_operator() -> None:
    assert unknown_fields(_rendered(), current()) == []


def test_on_v150_only_fields_newer_than_v150_can_be_unknown() -> None:
    # today's render has none; with token auth rendered (spec.authOptions) exactly that one is named
    for path in unknown_fields(_rendered(), v150()):
        assert kuberay_version_needed(path) != SCHEMA_KUBERAY_VERSION or path in FIELD_SINCE, path


def test_auth_options_on_an_older_operator_is_named_with_the_version_it_needs() -> None:
    rc = _rendered()
    rc["spec"]["authOptions"] = {"mode": "token"}
    assert first_unknown_field(rc, current()) is None
    assert first_unknown_field(rc, v150()) == ("spec.authOptions", {"mode": "token"})
    assert kuberay_version_needed("spec.authOptions", {"mode": "token"}) == "v1.5.1"
    # a Secret reference needs v1.6.0, whether the whole block or only that subfield is unknown
    rc["spec"]["authOptions"]["secretName"] = "walk-ray-token"
    path, value = first_unknown_field(rc, v150())
    assert kuberay_version_needed(path, value) == "v1.6.0"
    v151_like = copy.deepcopy(current())
    del v151_like["properties"]["spec"]["properties"]["authOptions"]["properties"]["secretName"]
    assert first_unknown_field(rc, v151_like) == ("spec.authOptions.secretName", "walk-ray-token")
    assert kuberay_version_needed("spec.authOptions.secretName") == "v1.6.0"


def test_unknown_fields_deep_in_lists_are_named_by_index() -> None:
    rc = _rendered()
    rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["gpuMagic"] = True
    rc["spec"]["headGroupSpec"]["template"]["metadata"]["bogus"] = 1
    assert unknown_fields(rc, current()) == ["spec.headGroupSpec.template.metadata.bogus",
                                             "spec.workerGroupSpecs[0].template.spec.containers[0].gpuMagic"]
    # a field not in the table: the version miles-ray validates against is named
    assert kuberay_version_needed("spec.workerGroupSpecs[0].template.spec.containers[0].gpuMagic") \
        == SCHEMA_KUBERAY_VERSION


def test_maps_preserved_objects_and_root_metadata_take_anything() -> None:
    rc = _rendered()
    rc["metadata"]["labels"]["anything.example/x"] = "y"  # root ObjectMeta: the API server's, not the CRD's
    rc["spec"]["headGroupSpec"]["rayStartParams"]["some-new-flag"] = "1"  # a map of strings
    rc["spec"]["headGroupSpec"]["template"]["metadata"].setdefault("labels", {})["k"] = "v"
    assert unknown_fields(rc, current()) == []
    schema = {"type": "object", "properties": {"a": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                               "b": {"type": "object", "additionalProperties": True},
                                               "c": {"type": "object", "properties": {"d": {"type": "string"}}}}}
    assert unknown_fields({"a": {"z": 1}, "b": {"z": 1}, "c": {"d": "x", "e": 1}, "f": 2}, schema) == ["c.e", "f"]


def test_field_since_matches_kuberays_crds() -> None:
    """Every listed field is in the current CRD; those newer than v1.5.0 are missing from v1.5.0's."""
    for path, since in FIELD_SINCE.items():
        obj: dict = {}
        cur = obj
        parts = path.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = "x"
        assert first_unknown_field(obj, current()) is None, path
        if since != "v1.5.0":
            found = first_unknown_field(obj, v150())
            assert found is not None and path.startswith(found[0]), path


def test_preflight_refusal_is_one_line_exit_2() -> None:
    from miles_ray.services.k8s_clusters import check_fields_known

    rc = _rendered()
    rc["spec"]["authOptions"] = {"mode": "token", "secretName": "walk-ray-token"}
    with pytest.raises(Invalid) as e:
        check_fields_known(rc, v150())
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert "\n" not in str(e.value)
    assert "spec.authOptions" in str(e.value) and "KubeRay >= v1.6.0" in str(e.value)
    check_fields_known(rc, current())  # the current operator knows it
    check_fields_known(rc, None)  # a CRD without a schema prunes nothing



def test_preflight_names_every_field_the_installed_crd_would_drop() -> None:
    from miles_ray.core.errors import Invalid
    from miles_ray.services.backends.kube.preflight import check_fields_known

    rc = _rendered()
    rc["spec"]["authOptions"] = {"mode": "token"}
    rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["gpuMagic"] = True
    with pytest.raises(Invalid) as e:
        check_fields_known(rc, v150())
    # the first in document order with the version it needs, then the others
    assert "does not know RayCluster field spec.workerGroupSpecs[0].template.spec.containers[0].gpuMagic" \
        in e.value.message
    assert e.value.message.endswith("it does not know spec.authOptions either"), e.value.message
    check_fields_known(_rendered(), current())  # nothing unknown: no error
