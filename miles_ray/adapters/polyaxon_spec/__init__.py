"""Polyaxon 2.18 operation specs: validation with Polyaxon's own check, offline conversion to the
custom resource the Polyaxon agent would create.

Shape facts, verified against polyaxon==2.18.0 (tests/integration/test_polyaxon_spec.py pins them):

* ``run.workers`` is a DICT keyed by group name (``workers: {gpu: {replicas: 4, ...}}``);
  a list is rejected ("Input should be a valid dictionary"). The key becomes the KubeRay
  ``groupName``; the head gets ``groupName: head``.
* ``plugins`` (``shm: true``) is valid on the COMPONENT and also on the OPERATION (the operation's
  value overrides the component's when compiled). Keep it on the component; either way the converted
  pods get an ``shm`` emptyDir (medium Memory) mounted at ``/dev/shm`` on head and workers.
* The container ``name`` is free and optional: Polyaxon always renames the main container to
  ``polyaxon-main`` and keeps it FIRST in the pod (KubeRay's rule), followed by the
  ``polyaxon-sidecar`` container; the name given in the spec never reaches Kubernetes.
* ``nodeSelector``/``tolerations`` (and affinity, labels, annotations, serviceAccountName, ...) go in
  the replica's ``environment`` section (``head.environment`` / ``workers.<g>.environment``); put
  directly on the replica they are rejected as unknown fields.
* ``kind: rayjob`` is rejected ("Unsupported run.kind"); unknown fields anywhere are rejected.
* Templates: ``{{ globals.uuid }}`` works in ``run.head`` but NOT in ``run.workers.<group>`` (the
  server's compile fails: "'globals' is undefined" -- a 2.18 bug; :func:`validate_operation` rejects
  it up front). Params work everywhere when written ``{{ name }}``; ``{{ params.name }}`` renders the
  whole param object as JSON. Every main container gets ``POLYAXON_RUN_INSTANCE=<owner>.<project>.
  runs.<uuid>`` from Polyaxon, so workers can read the run uuid at runtime.
* The server stores the operation as sent (``raw_content``) and the compiled one (``content``), in
  which quoted numbers such as env ``"1"`` or cpu ``"8"`` come back as JSON numbers; the agent's
  converter turns them back into strings, so the resulting pods are unaffected.
* ``rayStartParams`` values may be numbers: Polyaxon turns them into strings (KubeRay needs strings).
* ``connections`` are per replica; each named connection becomes a volume named after the connection
  (so a connection name must be a valid DNS-1123 label: ``artifacts_store`` is not, see
  :func:`invalid_volume_names`). The converter mounts the agent's artifacts store in the sidecar and
  init containers of every pod, plus an ``artifacts-context`` emptyDir in all containers.
* Head-only quirks of the converter: ``replicas: null`` on the head group, the dashboard/gcs/client/
  serve ports added to the head container, ``NVIDIA_VISIBLE_DEVICES=none`` set on any container without
  a GPU limit, ``runtimeEnv: "null"`` (the JSON text of ``None``) when no runtimeEnv is given,
  ``restartPolicy: Never`` on every group, a ``preStop: ray stop`` hook on worker containers.
  ``POLYAXON_HOST`` in the injected env comes from the local client config (``POLYAXON_HOST``).
* :func:`to_custom_resource` == what the agent builds from the server's compiled run (checked against
  the real haupt sandbox in tests/integration/test_polyaxon_api.py).

polyaxon is imported lazily inside the functions: importing this module costs nothing.

The package's parts, by topic: ``validation`` (Polyaxon's check and the line naming the field) and ``conversion``
(the offline agent conversion). Import from here.
"""

from __future__ import annotations

from miles_ray.adapters.polyaxon_spec.conversion import (DEFAULT_ARTIFACTS_STORE, DEFAULT_CONNECTIONS,
                                                         connection_names, invalid_volume_names, to_custom_resource)
from miles_ray.adapters.polyaxon_spec.validation import validate_operation, worker_template_paths

__all__ = ["DEFAULT_ARTIFACTS_STORE", "DEFAULT_CONNECTIONS", "connection_names", "invalid_volume_names",
           "to_custom_resource", "validate_operation", "worker_template_paths"]
