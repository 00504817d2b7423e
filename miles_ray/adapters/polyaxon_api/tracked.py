"""Non-managed Polyaxon runs: the record of a Miles run that Polyaxon holds but does not execute.

A run created with no operation (``RunClient.create(is_managed=False)``: ``managed_by=user``) is a record that a
client keeps current through the API -- no agent picks it up, no pod is made for it (polyaxon 2.18). The Miles run
itself is a Ray job; its reporter on the cluster (``launchers/polyaxon_report.py``) logs its status, logs,
metrics and checkpoint lineage to that record through Polyaxon's client.

Facts measured against the real API server (haupt 2.18 sandbox):

* a non-managed run stays ``created`` (the scheduler leaves it alone) until a client logs a status;
* ``stop`` of a non-managed run answers at once with ``stopped`` (there is no agent to wait for);
* metric names are Polyaxon's "fqn" names: ``/`` becomes ``__`` (``train/loss`` -> ``train__loss``), so they are
  read back under those names (:func:`polyaxon_metric_name`);
* a run's logs, events and outputs are what its artifacts store holds (uploaded through the streams API).
"""

from __future__ import annotations

import re
from typing import Any

from miles_ray.adapters.polyaxon_api.client import FINAL_STATUSES, PolyaxonApi
from miles_ray.adapters.polyaxon_api.convert import plain, run_dict
from miles_ray.core.errors import ClusterError


def sidecar_image() -> str:
    """Polyaxon's sidecar image at this client's version (``polyaxon/polyaxon-sidecar:<version>``, the name the
    agent's converter gives every Polyaxon pod): python3 + polyaxon, what a run's supervisor runs in on a
    Polyaxon-made Kubernetes cluster (the Miles image has no polyaxon)."""
    from polyaxon.pkg import VERSION

    return f"polyaxon/polyaxon-sidecar:{VERSION}"


def polyaxon_metric_name(name: str) -> str:
    """The name Polyaxon keeps a metric under (its ``to_fqn_name``: ``/`` -> ``__``, ``.``/spaces -> ``-``)."""
    value = re.sub(r"[^\w\\/.\s-]", "", name).strip()
    value = re.sub(r"[\\/]+", "__", value)
    return re.sub(r"[-.\s]+", "-", value)


class TrackedRuns:
    """Non-managed runs of one project, through a configured :class:`PolyaxonApi`."""

    def __init__(self, api: PolyaxonApi, owner: str, project: str) -> None:
        self.api, self.owner, self.project = api, owner, project

    @property
    def where(self) -> str:
        return f"{self.owner}/{self.project} on {self.api.host}"

    def _not_found(self, uuid: str | None = None) -> str:
        return (f"Polyaxon run {uuid} not found in {self.where}" if uuid else
                f"Polyaxon project {self.owner}/{self.project} not found on {self.api.host}")

    def create(self, name: str, *, inputs: dict[str, Any], tags: list[str], meta: dict[str, Any],
               description: str | None = None) -> str:
        """A new non-managed run named ``name`` with ``inputs`` as its inputs; its uuid. A live run of that name
        whose ``meta_info`` holds ``meta`` (the same Miles run and request) is returned instead (a submit repeated, or
        a create whose answer was lost). Nothing is left behind when logging the inputs fails."""
        def _same() -> str | None:
            for run in self.api.runs_named(self.owner, self.project, name):
                have = run.get("meta_info") or {}
                if run["status"] not in FINAL_STATUSES and all(have.get(k) == v for k, v in meta.items()):
                    return run["uuid"]
            return None

        found = _same()
        if found:
            return found
        rc = self.api.run_client(self.owner, self.project)

        def _create():
            return rc.create(name=name, description=description, tags=list(tags), is_managed=False, meta_info=meta)

        def _already():
            try:
                uuid = _same()
            except ClusterError:
                return None
            return _Created(uuid) if uuid else None

        uuid = self.api.call(f"create a run in {self.owner}/{self.project}", _create,
                             not_found=self._not_found(), before_retry=_already).uuid
        try:
            self.log_inputs(uuid, inputs)
        except BaseException:
            self.api.delete_run(self.owner, self.project, uuid)
            raise
        return uuid

    def log_inputs(self, uuid: str, inputs: dict[str, Any]) -> None:
        rc = self.api.run_client(self.owner, self.project, uuid)
        self.api.call(f"log the inputs of run {uuid}", lambda: rc.log_inputs(async_req=False, **inputs),
                      not_found=self._not_found(uuid))

    def stop(self, uuid: str) -> str:
        """Stop the run (a non-managed run is ``stopped`` at once); a run already ended is left as it is. Returns
        its status afterwards."""
        status = self.api.get_run(self.owner, self.project, uuid, with_conditions=False)["status"]
        if status in FINAL_STATUSES:
            return status
        self.api.stop_run(self.owner, self.project, uuid)
        return self.api.get_run(self.owner, self.project, uuid, with_conditions=False)["status"]

    def delete(self, uuid: str) -> None:
        self.api.delete_run(self.owner, self.project, uuid)

    # -- reading back (what Polyaxon shows) -------------------------------------------------------

    def run(self, uuid: str) -> dict[str, Any]:
        """The run with its ``inputs``, ``outputs``, ``is_managed`` and ``status``."""
        rc = self.api.run_client(self.owner, self.project, uuid)
        self.api.call(f"read run {uuid}", rc.refresh_data, not_found=self._not_found(uuid))
        data = rc.run_data
        return {**run_dict(data), "inputs": plain(data.inputs), "outputs": plain(data.outputs),
                "is_managed": data.is_managed, "managed_by": str(getattr(data.managed_by, "value", data.managed_by))}

    def metrics(self, uuid: str, names: list[str]) -> dict[str, list[tuple[int | None, float]]]:
        """The logged points ``[(step, value)]`` of each metric in ``names`` (Miles' names; read under Polyaxon's)."""
        rc = self.api.run_client(self.owner, self.project, uuid)
        wanted = {polyaxon_metric_name(n): n for n in names}
        got = self.api.call(f"read metrics of run {uuid}", lambda: rc.get_metrics(names=sorted(wanted), force=True),
                            not_found=self._not_found(uuid))
        out: dict[str, list[tuple[int | None, float]]] = {}
        for px_name, event in (got or {}).items():
            data = event.get("data") or {}
            out[wanted.get(px_name, px_name)] = list(zip(data.get("step") or [], data.get("metric") or []))
        return out

    def lineage(self, uuid: str) -> list[dict[str, Any]]:
        """The run's artifacts lineage (``name``, ``kind``, ``path``, ``is_input``, ``summary``)."""
        rc = self.api.run_client(self.owner, self.project, uuid)
        res = self.api.call(f"read lineage of run {uuid}", lambda: rc.get_artifacts_lineage(limit=100),
                            not_found=self._not_found(uuid))
        return [plain(a) for a in getattr(res, "results", None) or []]

    def logs(self, uuid: str) -> list[str]:
        """The run's log lines as Polyaxon serves them (every log file of the run, read afresh: the streams API
        keeps a copy of a file it served once unless asked with ``force``), oldest first."""
        rc = self.api.run_client(self.owner, self.project, uuid)
        self.api.call(f"read run {uuid}", rc.refresh_data, not_found=self._not_found(uuid))
        lines: list[dict[str, Any]] = []
        last_file = None
        for _ in range(1000):  # one answer per log file
            page = self.api.call(
                f"read logs of run {uuid}",
                lambda: rc.client.runs_v1.get_run_logs(rc.namespace, self.owner, self.project, uuid,
                                                       last_file=last_file, force=True),
                not_found=self._not_found(uuid))
            lines += [plain(x) for x in getattr(page, "logs", None) or []]
            if not getattr(page, "last_file", None) or page.last_file == last_file:
                break
            last_file = page.last_file
        return [str(x.get("value", "")) for x in sorted(lines, key=lambda x: str(x.get("timestamp") or ""))]


class _Created:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
