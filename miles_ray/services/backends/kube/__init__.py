"""What the two Kubernetes backends (KubeRay directly, KubeRay through Polyaxon) share, one topic a module: the
cluster's bookkeeping (:mod:`.bookkeeping`), the preflight (:mod:`.preflight`), the waits for pods and Ray
(:mod:`.waits`, with :mod:`.sidecars` for the pods Polyaxon's sidecar keeps), the RayCluster's status read
(:mod:`.status`), scaling the worker group with its guards (:mod:`.scaling`), and idle detection, saving the runs
and deleting a RayCluster (:mod:`.teardown`). What only the Polyaxon backend needs lives in
:mod:`miles_ray.services.backends.polyaxon`."""
