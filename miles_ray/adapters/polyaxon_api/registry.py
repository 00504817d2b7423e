"""Polyaxon's model registry: model versions of a project, and MODEL lineage logged on a run
(polyaxon 2.18 ``ProjectClient.register_model_version`` / ``RunClient.log_artifact_lineage``)."""

from __future__ import annotations

import json
from typing import Any

from miles_ray.adapters.polyaxon_api.client import PolyaxonApi
from miles_ray.adapters.polyaxon_api.convert import plain
from miles_ray.core.errors import NotFound


class ModelRegistry:
    """The registry of one project, through a configured :class:`PolyaxonApi`."""

    def __init__(self, api: PolyaxonApi, owner: str, project: str) -> None:
        self.api, self.owner, self.project = api, owner, project
        self._pc = api.project_client(owner, project)

    @property
    def where(self) -> str:
        return f"{self.owner}/{self.project} on {self.api.host}"

    def get_version(self, version: str) -> dict[str, Any] | None:
        """The model version as a dict (``content`` parsed from JSON when it is), or None when it does not exist."""
        try:
            v = self.api.call(f"read model version {version}", lambda: self._pc.get_model_version(version),
                              not_found=f"model version {version} not found in {self.where}")
        except NotFound:
            return None
        data = plain(v)
        if isinstance(data.get("content"), str):
            try:
                data["content"] = json.loads(data["content"])
            except ValueError:
                pass
        return data

    def register_version(self, version: str, *, description: str, tags: list[str], content: dict[str, Any],
                         run_uuid: str | None, artifacts: list[str] | None, force: bool) -> None:
        """Create (or with ``force`` update) the version; ``content`` is stored as JSON."""
        self.api.call(f"register model version {version}",
                      lambda: self._pc.register_model_version(
                          version, description=description, tags=tags, content=json.dumps(content, sort_keys=True),
                          run=run_uuid, artifacts=artifacts, force=force),
                      not_found=f"Polyaxon project {self.owner}/{self.project} not found on {self.api.host}")

    def log_model_lineage(self, run_uuid: str, artifact: dict[str, Any], summary: dict[str, Any]) -> None:
        """Log ``artifact`` (``name``, ``path``) as an output MODEL artifact of run ``run_uuid``."""
        from polyaxon.schemas import V1ArtifactKind, V1RunArtifact

        rc = self.api.run_client(self.owner, self.project, run_uuid)
        body = V1RunArtifact(name=artifact["name"], kind=V1ArtifactKind.MODEL, path=artifact["path"],
                             is_input=False, summary=summary)
        self.api.call(f"log lineage {artifact['name']} on run {run_uuid}",
                      lambda: rc.log_artifact_lineage(body=body, async_req=False),
                      not_found=f"Polyaxon run {run_uuid} not found in {self.owner}/{self.project}")
