"""The outputs listing kept when a Kubernetes cluster goes (``down``/``park``): ``keep_listings`` takes the records as
the teardown finds them (typed :class:`RunRecord`, what ``saved_runs.records_on`` returns) and says, per run, why a
listing could not be kept. (A whole run found ``down`` failing with "'RunRecord' object is not subscriptable".)"""

from __future__ import annotations

from miles_ray.core.records.upgrade import read_record
from miles_ray.services.backends.results import SavedRuns
from miles_ray.services.outputs import keep_listings


def _record(run: str, **extra):
    return read_record({"run": run, "cluster": "c", "address": "k8s://ns/c", "mode": "direct",
                        "entrypoint": "python3 train.py", "output_dir": f"/mnt/runs/{run}", **extra})


def test_typed_records_of_a_cluster_going_down_are_listed_or_told_why_not(tmp_path):
    missing = str(tmp_path / "no-kubeconfig")
    out = SavedRuns(saved=[], not_saved={})
    keep_listings([_record("a", kubeconfig=missing), _record("b", kubeconfig=missing).dump()], out)
    assert set(out.outputs_not_saved) == {"a", "b"}
    assert all("no-kubeconfig" in why for why in out.outputs_not_saved.values()), out.outputs_not_saved
