"""``-o json`` key for key: the key paths of the verbs' JSON that this checkout prints without a cluster (plan,
render, the client dry runs, recipes, init, clusters) and on the run records an older main wrote (status, logs,
runs, runs outputs, doctor, runs compare of tests/data/records/, their clusters gone) are those the commit named in
tests/data/json_keys_before.txt printed (tools/json_keys.py made it). A key added, gone or renamed fails here; a
change that means it writes that file again (``.venv/bin/python tools/json_keys.py > tests/data/json_keys_before.txt``)
and says so. The launcher job's case is left out here (its reads wait on the gone Polyaxon server's retries: ~20 s);
the tool covers it."""

from __future__ import annotations

from tests.conftest import REPO
from tests.infra.scripts import load_script

CASES = ["supervised_local", "kuberay", "polyaxon_tracked"]


def test_the_json_keys_are_those_of_the_older_main():
    tool = load_script("tools/json_keys.py", "miles_ray_json_keys")
    live = tool.all_keys(CASES)
    labels = {line.split("\t")[0] for line in live}
    before = [line for line in (REPO / "tests" / "data" / "json_keys_before.txt").read_text().splitlines()
              if not line.startswith("#") and line.split("\t")[0] in labels]
    gone, added = sorted(set(before) - set(live)), sorted(set(live) - set(before))
    assert not gone and not added, "key paths gone:\n" + "\n".join(gone) + "\nkey paths added:\n" + "\n".join(added)
