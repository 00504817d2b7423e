#!/usr/bin/env bash
# kind smoke test: miles-ray against a REAL Kubernetes cluster (kind: nodes are Docker containers) with
# the real KubeRay operator (Helm chart) and REAL Ray pods on fake GPU nodes.
#
#   scripts/kind-smoke.sh            needs: docker (a running engine), kind, kubectl, helm, jq, curl,
#                                    and miles-ray on PATH (or SMOKE_MILES_RAY=.venv/bin/miles-ray)
#
# What it does: kind cluster (1 control plane + 2 workers, node image pinned by digest) -> the workers
# become fake GPU nodes (status patch nvidia.com/gpu, label, taint) -> KubeRay operator (chart pinned)
# -> namespace + claim miles-data -> the miles-ray smoke sequence, scripts/smoke-sequence.sh (up --via
# kuberay --nodes 2 with the Ray image pinned by digest -> status -> submit --rehearse through miles-ray's
# own k8s:// port-forward, followed to SUCCEEDED -> logs -> scale --nodes 1 -> scale --nodes 2 -> down -y;
# every step's exit code and key JSON fields asserted). The project's test suite runs that same sequence
# on real kubelets on every change; only the kind steps of this file are not exercised there. On any exit
# the kind cluster is deleted; on failure, diagnostics (describe, events, operator and Ray pod logs, kind
# logs, every step's output) are written to $SMOKE_ARTIFACTS_DIR first.
#
# See docs/kind-smoke.md. Knobs (environment):
#   SMOKE_GPUS_PER_NODE   fake GPUs per GPU node = Ray --num-gpus of each worker (default 2, see below)
#   SMOKE_RAY_IMAGE_DIGEST  sha256:<64 hex> of RAY_IMAGE_TAG; unset: resolved at run time (see below)
#   SMOKE_CLUSTER_NAME    kind cluster name (default miles-ray-smoke; must not exist yet)
#   SMOKE_NAMESPACE       namespace for the RayCluster and the claim (default miles-smoke)
#   SMOKE_MILES_RAY       the miles-ray command (default: miles-ray)
#   SMOKE_ARTIFACTS_DIR   where diagnostics go on failure (default: a temp dir, printed)
#   SMOKE_KEEP_CLUSTER=1  do not delete the kind cluster at the end (debugging)
set -euo pipefail
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 404)); then
    echo "kind-smoke: needs bash >= 4.4 (this is ${BASH_VERSION})" >&2
    exit 2
fi

# ---- pinned versions: the only place they are set -------------------------------------------------
# kind v0.33.0's own default node image: the constant in sigs.k8s.io/kind@v0.33.0
# pkg/apis/config/defaults/image.go (read from the Go module proxy's copy of that release); the v0.33.0
# release notes list the same image for Kubernetes 1.37. kind supports a node image with the kind release
# it was built for; other kind versions are best effort (we warn).
KIND_NODE_IMAGE="kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"
KIND_VERSION_BUILT_FOR="v0.33.0"
# KubeRay operator Helm chart, same version as the operator in our tests (cluster/versions.env).
KUBERAY_CHART_REPO="https://ray-project.github.io/kuberay-helm/"
KUBERAY_CHART_VERSION="1.6.2"
# Ray inside the image (= ray in constraints.txt: client, head and workers run one Ray version).
RAY_VERSION="2.60.0"
RAY_IMAGE_TAG="rayproject/ray:2.60.0-py311-cpu"
# The digest of RAY_IMAGE_TAG. No published digest for this tag could be found when this script was
# written (and this machine cannot reach Docker Hub), so when it is empty the script resolves the tag
# ONCE at run time (docker buildx imagetools / crane / skopeo), prints the digest, and uses
# tag@digest everywhere -- or fails if it cannot. Put the printed value here to pin it for good.
RAY_IMAGE_DIGEST="${SMOKE_RAY_IMAGE_DIGEST:-}"

# ---- sizing ---------------------------------------------------------------------------------------
# miles-ray sizes a GPU worker pod at cpus_per_node CPUs with requests == limits, and cpus_per_node must
# be >= gpus_per_node + 1 (one CPU per GPU bundle plus Miles's RolloutManager). Every kind node sees the
# Docker host's CPUs, so an 8-GPU worker (9 CPUs) only schedules on a host with >= 10 CPUs. GitHub's
# ubuntu-latest has 4 vCPUs (public repositories), hence 2 fake GPUs per node by default: 3-CPU workers.
# Each GPU node advertises exactly that many GPUs, so one Ray worker pod owns one whole (fake) GPU node,
# as on real 8-GPU nodes. SMOKE_GPUS_PER_NODE=8 gives the full 8-GPU layout on a >= 10-CPU runner.
GPUS_PER_NODE="${SMOKE_GPUS_PER_NODE:-2}"
CPUS_PER_NODE=$((GPUS_PER_NODE + 1))
WORKER_MEMORY="4Gi"
HEAD_MEMORY="3Gi" # GCS, dashboard, job supervisor and the rehearsal driver all run on the head

CLUSTER="${SMOKE_CLUSTER_NAME:-miles-ray-smoke}"
NS="${SMOKE_NAMESPACE:-miles-smoke}"
NAME="smoke" # the RayCluster; KubeRay names its head service ${NAME}-head-svc
read -r -a MILES_RAY <<<"${SMOKE_MILES_RAY:-miles-ray}"

WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/kind-smoke.XXXXXX")"
ARTIFACTS="${SMOKE_ARTIFACTS_DIR:-${WORKDIR}/artifacts}"
# Everything this run touches lives in WORKDIR: its own kubeconfig (never ~/.kube/config), its own
# miles-ray config and run records.
export KUBECONFIG="${WORKDIR}/kubeconfig"
export MILES_RAY_CONFIG="${WORKDIR}/sequence/miles-ray.yaml" # written by scripts/smoke-sequence.sh
export MILES_RAY_STATE_DIR="${WORKDIR}/sequence/state"
# The head in the pod runs without Ray token auth (no token in the image); say so for the client too,
# instead of depending on whatever ~/.ray/auth_token holds on this machine.
export RAY_AUTH_MODE=disabled
export RAY_USAGE_STATS_ENABLED=0

CREATED_CLUSTER=0
STEP=""

log() { printf '%s kind-smoke: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    local where=""
    if [[ -n "${STEP}" ]]; then where=" in step '${STEP}'"; fi
    log "FAILED${where}: $*"
    exit 1
}
step() {
    STEP="$1"
    log "== ${STEP}"
}

mr() { "${MILES_RAY[@]}" "$@"; }

# ---- cleanup and diagnostics ----------------------------------------------------------------------

collect_diagnostics() {
    mkdir -p "${ARTIFACTS}"
    log "collecting diagnostics into ${ARTIFACTS}"
    cp -r "${WORKDIR}"/sequence "${ARTIFACTS}/" 2>/dev/null || true
    cp -r "${WORKDIR}"/*.json "${WORKDIR}"/*.log "${WORKDIR}"/*.txt "${WORKDIR}"/*.yaml "${ARTIFACTS}/" 2>/dev/null || true
    [[ -d "${MILES_RAY_STATE_DIR}" ]] && cp -r "${MILES_RAY_STATE_DIR}" "${ARTIFACTS}/miles-ray-state" 2>/dev/null
    [[ -f "${KUBECONFIG}" ]] || return 0
    {
        kubectl get nodes -o wide
        kubectl get nodes -o custom-columns='NODE:.metadata.name,GPU:.status.allocatable.nvidia\.com/gpu,CPU:.status.allocatable.cpu,MEM:.status.allocatable.memory,TAINTS:.spec.taints[*].key'
        kubectl get pods -A -o wide
        kubectl get rayclusters -A -o wide
        kubectl get pv,pvc -A
    } >"${ARTIFACTS}/overview.txt" 2>&1 || true
    kubectl describe nodes >"${ARTIFACTS}/describe-nodes.txt" 2>&1 || true
    kubectl -n "${NS}" describe pods >"${ARTIFACTS}/describe-pods-${NS}.txt" 2>&1 || true
    kubectl -n "${NS}" get rayclusters -o yaml >"${ARTIFACTS}/rayclusters.yaml" 2>&1 || true
    kubectl get events -A --sort-by=.lastTimestamp >"${ARTIFACTS}/events.txt" 2>&1 || true
    kubectl -n kuberay-system logs deploy/kuberay-operator --all-containers --tail=-1 \
        >"${ARTIFACTS}/kuberay-operator.log" 2>&1 || true
    local pod
    for pod in $(kubectl -n "${NS}" get pods -o name 2>/dev/null); do
        kubectl -n "${NS}" logs "${pod}" --all-containers --tail=-1 >"${ARTIFACTS}/${pod#pod/}.log" 2>&1 || true
        kubectl -n "${NS}" logs "${pod}" --all-containers --previous --tail=-1 \
            >"${ARTIFACTS}/${pod#pod/}.previous.log" 2>/dev/null || true
        # Ray's own logs (raylet, gcs, dashboard, job driver) from inside the pod
        kubectl -n "${NS}" exec "${pod}" -c ray -- tar -C /tmp/ray/session_latest -czf - logs \
            >"${ARTIFACTS}/${pod#pod/}.ray-logs.tgz" 2>/dev/null || true
    done
    mr status --backend kubernetes -o json >"${ARTIFACTS}/miles-ray-status.json" 2>&1 || true
    if [[ "${CREATED_CLUSTER}" -eq 1 ]]; then
        kind export logs "${ARTIFACTS}/kind-logs" --name "${CLUSTER}" >/dev/null 2>&1 || true
    fi
}

on_exit() {
    local rc=$?
    set +e
    if [[ "${rc}" -ne 0 ]]; then
        collect_diagnostics
    fi
    if [[ "${CREATED_CLUSTER}" -eq 1 ]]; then
        if [[ "${SMOKE_KEEP_CLUSTER:-0}" == "1" ]]; then
            log "keeping kind cluster ${CLUSTER} (SMOKE_KEEP_CLUSTER=1): export KUBECONFIG=${KUBECONFIG}; " \
                "delete with: kind delete cluster --name ${CLUSTER}"
        else
            log "deleting kind cluster ${CLUSTER}"
            kind delete cluster --name "${CLUSTER}" >/dev/null 2>&1 || log "warning: kind delete cluster failed"
        fi
    fi
    if [[ "${rc}" -eq 0 ]]; then
        log "PASSED"
        [[ "${SMOKE_KEEP_CLUSTER:-0}" == "1" ]] || rm -rf "${WORKDIR}"
    else
        log "FAILED (exit ${rc}); diagnostics in ${ARTIFACTS}"
    fi
    exit "${rc}"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- helpers --------------------------------------------------------------------------------------

resolve_ray_digest() {
    local d=""
    if docker buildx version >/dev/null 2>&1; then
        d="$(docker buildx imagetools inspect "${RAY_IMAGE_TAG}" --format '{{json .Manifest}}' 2>/dev/null |
            jq -r '.digest // empty')" || d=""
    fi
    if [[ -z "${d}" ]] && command -v crane >/dev/null 2>&1; then
        d="$(crane digest "${RAY_IMAGE_TAG}" 2>/dev/null)" || d=""
    fi
    if [[ -z "${d}" ]] && command -v skopeo >/dev/null 2>&1; then
        d="$(skopeo inspect --format '{{.Digest}}' "docker://${RAY_IMAGE_TAG}" 2>/dev/null)" || d=""
    fi
    printf '%s' "${d}"
}

# A fake GPU node: label, taint and nvidia.com/gpu in status capacity/allocatable (no device plugin:
# containers start as plain CPU containers). Idempotent; re-apply if a kind node restarts.
make_fake_gpu_node() {
    local node="$1"
    kubectl label node "${node}" nvidia.com/gpu.present=true --overwrite >/dev/null
    kubectl taint node "${node}" nvidia.com/gpu=present:NoSchedule --overwrite >/dev/null
    kubectl patch node "${node}" --subresource=status --type=json -p "[
        {\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"${GPUS_PER_NODE}\"},
        {\"op\": \"add\", \"path\": \"/status/allocatable/nvidia.com~1gpu\", \"value\": \"${GPUS_PER_NODE}\"}]" >/dev/null
}

gpu_allocatable() {
    kubectl get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'
}

# ==== 0. prerequisites =============================================================================
step "prerequisites"
for tool in docker kind kubectl helm jq curl; do
    command -v "${tool}" >/dev/null 2>&1 || die "${tool} is not on PATH"
done
command -v "${MILES_RAY[0]}" >/dev/null 2>&1 || die "${MILES_RAY[0]} is not on PATH (pip install -c constraints.txt -e .)"
docker info >/dev/null 2>&1 || die "no running Docker engine (docker info failed)"
# 2, 4 or 8: Qwen3-4B (TP2) then has a feasible split on 1, 2 and 4 nodes, which the steps below use
[[ "${GPUS_PER_NODE}" =~ ^(2|4|8)$ ]] || die "SMOKE_GPUS_PER_NODE must be 2, 4 or 8, not '${GPUS_PER_NODE}'"
host_cpus="$(docker info --format '{{.NCPU}}')"
# a worker pod requests CPUS_PER_NODE whole CPUs, and kindnet/kube-proxy/coredns already take ~0.3 CPU
if ((host_cpus < CPUS_PER_NODE + 1)); then
    die "the Docker engine has ${host_cpus} CPUs; GPU worker pods of ${GPUS_PER_NODE} GPUs request ${CPUS_PER_NODE} CPUs" \
        "and would not schedule: use a runner with >= $((CPUS_PER_NODE + 1)) CPUs or a smaller SMOKE_GPUS_PER_NODE"
fi
kind_version="$(kind version)"
if [[ "${kind_version}" != *"${KIND_VERSION_BUILT_FOR}"* ]]; then
    log "warning: ${kind_version}: the node image is built for kind ${KIND_VERSION_BUILT_FOR} (other kind versions: best effort)"
fi
if kind get clusters 2>/dev/null | grep -Fxq "${CLUSTER}"; then
    die "a kind cluster named ${CLUSTER} already exists; delete it or set SMOKE_CLUSTER_NAME"
fi
{
    echo "${kind_version}"
    kubectl version --client 2>&1 | head -1
    helm version --short
    docker version --format 'docker {{.Server.Version}}' 2>&1
    echo "docker CPUs ${host_cpus}"
} | tee "${WORKDIR}/versions.txt" >&2

if [[ -z "${RAY_IMAGE_DIGEST}" ]]; then
    log "resolving ${RAY_IMAGE_TAG} to a digest (no digest pinned in this script)"
    RAY_IMAGE_DIGEST="$(resolve_ray_digest)"
fi
[[ "${RAY_IMAGE_DIGEST}" =~ ^sha256:[0-9a-f]{64}$ ]] ||
    die "no digest for ${RAY_IMAGE_TAG} ('${RAY_IMAGE_DIGEST}'): need docker buildx, crane or skopeo and registry access," \
        "or set SMOKE_RAY_IMAGE_DIGEST=sha256:<64 hex>"
RAY_IMAGE="${RAY_IMAGE_TAG}@${RAY_IMAGE_DIGEST}"
[[ "${RAY_IMAGE}" =~ @sha256:[0-9a-f]{64}$ ]] || die "Ray image ${RAY_IMAGE} is not pinned by digest"
log "Ray image ${RAY_IMAGE} (pin it: RAY_IMAGE_DIGEST=${RAY_IMAGE_DIGEST})"
echo "ray image ${RAY_IMAGE}" >>"${WORKDIR}/versions.txt"

# ==== 1. kind cluster ==============================================================================
step "kind cluster ${CLUSTER} (1 control plane + 2 workers, ${KIND_NODE_IMAGE%%@*})"
cat >"${WORKDIR}/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
name: ${CLUSTER}
nodes:
  - role: control-plane
    image: ${KIND_NODE_IMAGE}
  - role: worker
    image: ${KIND_NODE_IMAGE}
  - role: worker
    image: ${KIND_NODE_IMAGE}
EOF
CREATED_CLUSTER=1 # from here on, the EXIT trap deletes the cluster (also a half-created one)
kind create cluster --config "${WORKDIR}/kind.yaml" --kubeconfig "${KUBECONFIG}" --wait 180s
kubectl wait --for=condition=Ready nodes --all --timeout=180s

CONTROL_PLANE="$(kubectl get nodes -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[0].metadata.name}')"
mapfile -t WORKERS < <(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
[[ -n "${CONTROL_PLANE}" && "${#WORKERS[@]}" -eq 2 ]] || die "expected 1 control plane and 2 workers, got '${CONTROL_PLANE}' and ${#WORKERS[@]} worker(s)"

# ==== 2. fake GPU nodes and where the head goes ====================================================
step "fake GPU nodes ${WORKERS[*]} (nvidia.com/gpu=${GPUS_PER_NODE}); head on ${CONTROL_PLANE}"
# The head must not land on a GPU node. miles-ray gives ONLY the GPU workers a toleration (nvidia.com/gpu
# Exists NoSchedule); the head pod it renders tolerates nothing. So tolerating kind's control-plane taint
# is not an option without changing what we test, and we REMOVE that taint instead: the control plane is
# then the only node a toleration-free pod fits on (the workers carry the GPU taint) -- the same shape as
# production, where the head goes to a CPU pool and GPU nodes are tainted. The operator lands there too.
if kubectl get node "${CONTROL_PLANE}" -o jsonpath='{.spec.taints[*].key}' | tr ' ' '\n' |
    grep -Fxq node-role.kubernetes.io/control-plane; then
    kubectl taint node "${CONTROL_PLANE}" node-role.kubernetes.io/control-plane:NoSchedule-
fi
for node in "${WORKERS[@]}"; do
    make_fake_gpu_node "${node}"
done
for node in "${WORKERS[@]}"; do
    for _ in $(seq 1 30); do
        [[ "$(gpu_allocatable "${node}")" == "${GPUS_PER_NODE}" ]] && break
        sleep 1
    done
    [[ "$(gpu_allocatable "${node}")" == "${GPUS_PER_NODE}" ]] || die "${node} does not advertise nvidia.com/gpu=${GPUS_PER_NODE}"
    log "ok: ${node} allocatable nvidia.com/gpu=${GPUS_PER_NODE}, tainted nvidia.com/gpu=present:NoSchedule"
done

# ==== 3. Ray image into every node =================================================================
# Pulled once per node up front (by digest, through each node's containerd), so that 'up' measures
# scheduling and Ray start-up rather than a ~1 GB download, and a slow registry is reported as such.
# (kind load docker-image cannot be used: it does not keep the registry digest the pods refer to.)
step "pull ${RAY_IMAGE} into every node"
PULL_TIMEOUT=()
command -v timeout >/dev/null 2>&1 && PULL_TIMEOUT=(timeout 900)
pids=()
for node in "${CONTROL_PLANE}" "${WORKERS[@]}"; do
    "${PULL_TIMEOUT[@]}" docker exec "${node}" crictl pull "${RAY_IMAGE}" >"${WORKDIR}/pull-${node}.log" 2>&1 &
    pids+=("$!")
done
for pid in "${pids[@]}"; do
    wait "${pid}" || die "pulling ${RAY_IMAGE} into a node failed: $(cat "${WORKDIR}"/pull-*.log)"
done

# ==== 4. KubeRay operator ==========================================================================
step "KubeRay operator (chart kuberay-operator ${KUBERAY_CHART_VERSION} from ${KUBERAY_CHART_REPO})"
helm install kuberay-operator kuberay-operator \
    --repo "${KUBERAY_CHART_REPO}" --version "${KUBERAY_CHART_VERSION}" \
    --namespace kuberay-system --create-namespace --wait --timeout 5m
kubectl wait --for=condition=Established crd/rayclusters.ray.io --timeout=60s
kubectl -n kuberay-system rollout status deploy/kuberay-operator --timeout=180s

# ==== 5. namespace and the miles-data claim ========================================================
# kind's default StorageClass 'standard' (local-path) is ReadWriteOnce AND pins each volume to the node of
# its first consumer: the head (control plane) and the two workers could then never all mount it (the
# later pods would be Unschedulable with a volume node affinity conflict). So the claim is bound to a
# static hostPath volume without node affinity, declared ReadWriteMany: it mounts on every node, but each
# node sees its OWN directory -- nothing is shared between pods on different nodes. This smoke checks
# placement and the mounts, not shared storage (that is the real cluster's RWX storage class).
step "namespace ${NS} and claim miles-data"
kubectl create namespace "${NS}"
for node in "${CONTROL_PLANE}" "${WORKERS[@]}"; do
    # writable by the image's non-root 'ray' user (uid 1000)
    docker exec "${node}" sh -c 'mkdir -p /var/local/miles-data && chmod 0777 /var/local/miles-data'
done
kubectl apply -f - <<EOF
apiVersion: v1
kind: PersistentVolume
metadata:
  name: ${NS}-miles-data
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef:
    namespace: ${NS}
    name: miles-data
  hostPath:
    path: /var/local/miles-data
    type: Directory
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: miles-data
  namespace: ${NS}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: ${NS}-miles-data
  resources:
    requests:
      storage: 1Gi
EOF
kubectl -n "${NS}" wait --for=jsonpath='{.status.phase}'=Bound pvc/miles-data --timeout=60s

# ==== 6. the miles-ray smoke sequence (shared with the real_pods test tier) ========================
# preflight -> up --via kuberay --nodes 2 -> status -> submit --rehearse through k8s:// -> logs -> scale
# --nodes 1 -> scale --nodes 2 -> down -y: scripts/smoke-sequence.sh, the same script the project's own
# test suite runs on every change (tests/realpods/), so only the kind steps above are unique to this file.
step "miles-ray smoke sequence (scripts/smoke-sequence.sh)"
SMOKE_IMAGE="${RAY_IMAGE}" SMOKE_RAY_VERSION="${RAY_VERSION}" SMOKE_NAMESPACE="${NS}" SMOKE_NAME="${NAME}" \
    SMOKE_GPUS_PER_NODE="${GPUS_PER_NODE}" SMOKE_WORKER_MEMORY="${WORKER_MEMORY}" SMOKE_HEAD_MEMORY="${HEAD_MEMORY}" \
    SMOKE_HEAD_NODE="${CONTROL_PLANE}" SMOKE_GPU_NODES="${WORKERS[*]}" SMOKE_WORKDIR="${WORKDIR}/sequence" \
    SMOKE_MILES_RAY="${MILES_RAY[*]}" "$(dirname "${BASH_SOURCE[0]}")/smoke-sequence.sh" ||
    die "the smoke sequence failed (its outputs: ${WORKDIR}/sequence)"
kubectl -n "${NS}" get pvc miles-data >/dev/null || die "down deleted the claim miles-data (it must never touch storage)"
[[ -z "$(kubectl -n "${NS}" get rayclusters -o name)" ]] || die "a RayCluster is left in ${NS}"
log "ok: no RayCluster left; claim miles-data kept"
STEP=""
