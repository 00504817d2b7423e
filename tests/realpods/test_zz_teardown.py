"""Last in the real_pods tier (file order): stop the tier's real-pod cluster and prove nothing is left —
no process, mount, cgroup, network namespace, interface or iptables rule, and the host's sysctls as they
were. Prints the tier's figures (REAL_PODS_FIGURES) for the closing notes and benchmarks."""

from __future__ import annotations

import json
import sys

import pytest

from tests.infra.realpods import SUMMARY, RealPods, realnodes

pytestmark = pytest.mark.real_pods


def test_teardown_leaves_nothing(real_pods: RealPods) -> None:
    td = real_pods.stop()
    real_pods.figures["teardown_s"] = round(td.seconds, 1)
    line = "REAL_PODS_FIGURES " + json.dumps(real_pods.figures, sort_keys=True)
    print("\n" + line, file=sys.stderr)
    SUMMARY.append(line)  # and in the run's summary (tests/realpods/conftest.py), passed or not
    assert td.leftovers and not any(td.leftovers.values()), td.leftovers  # no process, mount, cgroup, netns
    # The kubelets' sysctls (and forwarding) as they were; no interface, netns, iptables rule or mount added.
    assert realnodes.read_sysctls() == real_pods.host_before["sysctls"]
    assert td.host_changes == {}
    assert all(v in ("stopped", "not running", "removed") or "task(s) killed" in v for v in td.stopped.values()), \
        td.stopped
