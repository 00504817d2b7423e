"""Kubernetes adapter, one module per responsibility:

* :mod:`.client` -- an ApiClient for a kubeconfig/context (kubectl's rules) or in-cluster config, and the typed
  error (:mod:`miles_ray.core.errors`: ``NotFound``, ``Conflict``, ``Forbidden``, ``Invalid``, ``Unreachable``
  ...) a failed call becomes, chosen from the HTTP status or the exception type, never from the message text;
* :mod:`.rayclusters` -- :class:`RayClusters`: a thin RayCluster layer over ``CustomObjectsApi`` that raises
  real errors (the upstream KubeRay Python client is not on PyPI and swallows them), and the guarded scale patch;
* :mod:`.crds` -- installed CRDs (the RayCluster CRD, its served versions and schema; the queue CRDs) and
  whether a custom object of another kind exists;
* :mod:`.preflight` -- the namespace, a PersistentVolumeClaim, ResourceQuotas, a Service's ports, a probe pod;
* :mod:`.capacity` -- free GPUs, CPUs and memory per GPU node, and Kubernetes quantities;
* :mod:`.gpu_nodes` -- the GPU nodes a RayCluster's workers run on and their GPU feature discovery labels;
* :mod:`.pods` -- a RayCluster's pods (raw or summarised), fatal waiting reasons, the running head pod, a
  Polyaxon-made pod that lingers while being deleted, and deleting a pod;
* :mod:`.secrets` -- the head pod's Ray auth and the Secret its token is read from;
* :mod:`.portforward` -- port-forwarding to the Ray head through the API server; whether a pod's port refuses;
* :mod:`.kueue` -- the Kueue Workload of a RayCluster.

kubernetes is imported lazily inside the functions.
"""

from miles_ray.adapters.kube.capacity import GPU, gpu_capacity, quantity
from miles_ray.adapters.kube.client import load_client, missing_kubeconfig
from miles_ray.adapters.kube.crds import (crd_schema, crd_served_versions, custom_object_exists, installed_crd_versions,
                                          raycluster_crd)
from miles_ray.adapters.kube.gpu_nodes import gpu_node_labels
from miles_ray.adapters.kube.kueue import kueue_workload
from miles_ray.adapters.kube.pods import (CRASHLOOP_RESTARTS, cluster_pods, cluster_selector, delete_pod,
                                          lingering_sidecar, list_pods, pod_rows, running_head_pod, waiting_is_fatal)
from miles_ray.adapters.kube.portforward import port_forward, port_refused
from miles_ray.adapters.kube.preflight import list_quotas, namespace_exists, pvc_exists, run_pod_once, service_ports
from miles_ray.adapters.kube.rayclusters import RayClusters
from miles_ray.adapters.kube.secrets import head_auth_ref, head_ray_token, secret_has_key

# the names other modules use (``from miles_ray.adapters import kube; kube.load_client(...)``)
__all__ = ["CRASHLOOP_RESTARTS", "GPU", "RayClusters", "cluster_pods", "cluster_selector", "crd_schema",
           "crd_served_versions", "custom_object_exists", "delete_pod", "gpu_capacity", "gpu_node_labels", "head_auth_ref",
           "head_ray_token", "installed_crd_versions", "kueue_workload", "lingering_sidecar", "list_pods",
           "list_quotas", "load_client", "missing_kubeconfig", "namespace_exists", "pod_rows", "port_forward",
           "port_refused", "pvc_exists", "quantity", "raycluster_crd", "run_pod_once", "running_head_pod",
           "secret_has_key", "service_ports", "waiting_is_fatal"]
