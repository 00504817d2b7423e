#!/usr/bin/env bash
# The miles-ray smoke sequence: every user-facing step against a Kubernetes cluster that already runs the
# KubeRay operator, has exactly 2 GPU nodes (fake or real nvidia.com/gpu) and, in SMOKE_NAMESPACE, a bound
# ReadWriteMany claim named miles-data. One script for everyone who runs it:
#   - scripts/kind-smoke.sh (users' CI: a kind cluster with fake GPU nodes) creates that cluster, then runs this;
#   - the real_pods test tier (tests/realpods/) runs it on real kubelets + containerd in a private network
#     namespace, so what users run in their CI is exercised on every test run here.
#
#   KUBECONFIG=... SMOKE_IMAGE=repo:tag@sha256:... scripts/smoke-sequence.sh
#   scripts/smoke-sequence.sh --print-config     the miles-ray.yaml it would use (from the same environment)
#
# Steps (each exit code and the key JSON fields asserted, with jq):
#   preflight (up --dry-run: too many nodes refused; server dry run) -> up --via kuberay --nodes 2 (returns when
#   both GPU workers are ALIVE in Ray) -> status (pods and Ray's view) -> submit --rehearse through the k8s://
#   port-forward, followed to SUCCEEDED -> logs -> re-submit is idempotent -> scale --nodes 1 -> scale --nodes 2
#   (returns when Ray sees the worker again) -> down -y.
#
# Environment:
#   KUBECONFIG              the cluster (required)
#   SMOKE_IMAGE             the Ray image, pinned repo[:tag]@sha256:<digest> (required)
#   SMOKE_RAY_VERSION       Ray inside the image (default 2.60.0, as constraints.txt)
#   SMOKE_NAMESPACE         namespace with the claim miles-data (default miles-smoke)
#   SMOKE_NAME              the RayCluster (default smoke)
#   SMOKE_GPUS_PER_NODE     GPUs per GPU node = per worker (default 2)
#   SMOKE_WORKER_MEMORY     memory per GPU worker pod (default 4Gi); SMOKE_HEAD_MEMORY (default 3Gi)
#   SMOKE_CPU_REQUEST       Kubernetes CPU request of a worker pod when nodes have fewer CPUs than
#                           GPUs + 1 (cpu_request_per_node; default: none, request = limit)
#   SMOKE_HEAD_NODE         if set, the node the head pod must run on
#   SMOKE_GPU_NODES         if set, the nodes the 2 worker pods must run on (space-separated, any order)
#   SMOKE_MILES_RAY         the miles-ray command (default: miles-ray)
#   SMOKE_WORKDIR           where config, run records and every step's output go (default: a temp dir)
#   SMOKE_UP_TIMEOUT        seconds for up/scale to finish (default 900)
set -euo pipefail

RAY_VERSION="${SMOKE_RAY_VERSION:-2.60.0}"
NS="${SMOKE_NAMESPACE:-miles-smoke}"
NAME="${SMOKE_NAME:-smoke}"
GPUS="${SMOKE_GPUS_PER_NODE:-2}"
CPUS=$((GPUS + 1))
UP_TIMEOUT="${SMOKE_UP_TIMEOUT:-900}"
RUN="smoke-rehearsal"
ADDRESS="k8s://${NS}/${NAME}"
read -r -a MILES_RAY <<<"${SMOKE_MILES_RAY:-miles-ray}"
STEP=""

log() { printf '%s smoke: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    local where=""
    if [[ -n "${STEP}" ]]; then where=" in step '${STEP}'"; fi
    log "FAILED${where}: $*"
    log "outputs of every step: ${WORKDIR:-none yet}"
    exit 1
}
step() {
    STEP="$1"
    log "== ${STEP}"
}
mr() { "${MILES_RAY[@]}" "$@"; }

# expect RC OUT CMD...: run CMD, stdout to OUT (stderr to OUT.err and the terminal); fail unless it exits RC.
expect() {
    local want="$1" out="$2" rc=0
    shift 2
    log "\$ $*"
    "$@" >"${out}" 2> >(tee "${out}.err" >&2) || rc=$?
    if [[ "${rc}" -ne "${want}" ]]; then
        die "exit code ${rc}, expected ${want}: $* ($(tail -n 3 "${out}.err" 2>/dev/null | tr '\n' ' '))"
    fi
}

# check FILE JQ_EXPR WHAT: assert a JSON field with jq -e.
check() {
    local file="$1" expr="$2" what="$3"
    if ! jq -e "${expr}" "${file}" >/dev/null; then
        log "assertion failed: ${what}: jq '${expr}' on ${file}:"
        head -c 4000 "${file}" >&2 || true
        die "${what}"
    fi
    log "ok: ${what}"
}

# The miles-ray.yaml of the sequence, on stdout.
write_config() {
    echo "# written by scripts/smoke-sequence.sh"
    echo "name: ${NAME}"
    echo "namespace: ${NS}"
    echo "gpus_per_node: ${GPUS}"
    echo "cpus_per_node: ${CPUS}"
    if [[ -n "${SMOKE_CPU_REQUEST:-}" ]]; then echo "cpu_request_per_node: \"${SMOKE_CPU_REQUEST}\""; fi
    echo "memory_per_node: ${SMOKE_WORKER_MEMORY:-4Gi}"
    echo "head_cpus: 1"
    echo "head_memory: ${SMOKE_HEAD_MEMORY:-3Gi}"
    echo "volume_claim: miles-data"
}

if [[ "${1:-}" == "--print-config" ]]; then
    write_config
    exit 0
fi
: "${KUBECONFIG:?KUBECONFIG must point at the cluster to test}"
: "${SMOKE_IMAGE:?SMOKE_IMAGE must be the Ray image pinned by digest (repo:tag@sha256:...)}"
command -v jq >/dev/null 2>&1 || die "jq is not on PATH"
WORKDIR="${SMOKE_WORKDIR:-$(mktemp -d "${TMPDIR:-/tmp}/miles-smoke.XXXXXX")}"
mkdir -p "${WORKDIR}"
export KUBECONFIG
export MILES_RAY_CONFIG="${WORKDIR}/miles-ray.yaml"
export MILES_RAY_STATE_DIR="${WORKDIR}/state"
# The head in the pod runs without Ray token auth: say so for the client too.
export RAY_AUTH_MODE=disabled
export RAY_USAGE_STATS_ENABLED=0
write_config >"${MILES_RAY_CONFIG}"

UP=(up --via kuberay --image "${SMOKE_IMAGE}" --ray-version "${RAY_VERSION}")

# ==== preflight ====================================================================================
step "preflight (up --dry-run server: a client dry run contacts nothing)"
expect 1 "${WORKDIR}/preflight-too-many.json" mr "${UP[@]}" --nodes 4 --dry-run server -o json
grep -q "not enough GPU nodes" "${WORKDIR}/preflight-too-many.json.err" ||
    die "up --nodes 4 was refused, but not for want of GPU nodes: $(cat "${WORKDIR}/preflight-too-many.json.err")"
log "ok: the preflight refuses 4 GPU nodes on a cluster with 2, nothing created"
expect 0 "${WORKDIR}/dry-run.json" mr "${UP[@]}" --nodes 2 --dry-run server -o json
check "${WORKDIR}/dry-run.json" '.dry_run == "server" and .created == false' "server dry run, nothing created"
check "${WORKDIR}/dry-run.json" '.preflight.gpu_nodes >= 2 and .preflight.gpu_nodes_fitting >= 2' "the preflight sees >= 2 fitting GPU nodes"

# ==== up ===========================================================================================
step "up --via kuberay --nodes 2"
expect 0 "${WORKDIR}/up.json" mr "${UP[@]}" --nodes 2 --timeout "${UP_TIMEOUT}" -o json
check "${WORKDIR}/up.json" ".created == true and .via == \"kuberay\" and .name == \"${NAME}\"" "RayCluster created (KubeRay)"
check "${WORKDIR}/up.json" '.status.desired_workers == 2 and .status.ready_workers == 2' "2 of 2 GPU workers ready"
check "${WORKDIR}/up.json" ".status.gpus_per_worker == ${GPUS} and .status.desired_gpus == $((2 * GPUS))" "KubeRay counts the GPUs"
check "${WORKDIR}/up.json" ".status.ray.gpu_node_count == 2 and .status.ray.gpus_per_node == [${GPUS}]" "Ray sees 2 worker nodes of ${GPUS} GPUs"
check "${WORKDIR}/up.json" '.status.ray.head.gpus == 0 and .status.ray.head.cpus == 0' "the Ray head advertises no GPU and no CPU"

# ==== status =======================================================================================
step "status (pods and Ray)"
expect 0 "${WORKDIR}/status-up.json" mr status --backend kubernetes --ray -o json
check "${WORKDIR}/status-up.json" '[.pods[] | select(.role == "worker")] | length == 2' "2 worker pods"
check "${WORKDIR}/status-up.json" '[.pods[] | select(.role == "worker") | .node] | unique | length == 2' "the workers run on 2 different nodes"
check "${WORKDIR}/status-up.json" ".ray_nodes_alive == 3 and .ray_gpus == $((2 * GPUS))" "Ray: head + 2 workers alive, $((2 * GPUS)) GPUs"
if [[ -n "${SMOKE_HEAD_NODE:-}" ]]; then
    check "${WORKDIR}/status-up.json" "[.pods[] | select(.role == \"head\") | .node] == [\"${SMOKE_HEAD_NODE}\"]" "the head runs on ${SMOKE_HEAD_NODE}"
fi
if [[ -n "${SMOKE_GPU_NODES:-}" ]]; then
    read -r -a gpu_nodes <<<"${SMOKE_GPU_NODES}"
    want="$(printf '%s\n' "${gpu_nodes[@]}" | sort | jq -R . | jq -sc .)"
    check "${WORKDIR}/status-up.json" "[.pods[] | select(.role == \"worker\") | .node] | sort == ${want}" "the workers run on ${SMOKE_GPU_NODES}"
fi

# ==== rehearsal ====================================================================================
step "submit --rehearse --nodes 2 --follow (through ${ADDRESS})"
expect 0 "${WORKDIR}/rehearsal.log" mr submit --rehearse --nodes 2 --address "${ADDRESS}" --run "${RUN}" \
    --image "${SMOKE_IMAGE}" --ray-version "${RAY_VERSION}" --timeout 600 --follow
grep '^REHEARSAL_RESULT ' "${WORKDIR}/rehearsal.log" | tail -n 1 | cut -d' ' -f2- >"${WORKDIR}/rehearsal-result.json" || true
[[ -s "${WORKDIR}/rehearsal-result.json" ]] || die "no REHEARSAL_RESULT line in the job's logs"
check "${WORKDIR}/rehearsal-result.json" '.ok == true and .errors == []' "the rehearsal passed every placement check"
check "${WORKDIR}/rehearsal-result.json" \
    "(.nodes | length) == 2 and all(.nodes[]; .bundles == ${GPUS} and .gpus == ${GPUS})" \
    "${GPUS} GPU bundles on each of the 2 Ray worker nodes"
expect 0 "${WORKDIR}/run-status.json" mr status "${RUN}" -o json
check "${WORKDIR}/run-status.json" '.status == "SUCCEEDED" and .mode == "rehearse"' "the run's job SUCCEEDED"
expect 0 "${WORKDIR}/run-logs.txt" mr logs "${RUN}"
grep -q '^REHEARSAL_RESULT ' "${WORKDIR}/run-logs.txt" || die "logs ${RUN} does not show the job's output"
log "ok: logs ${RUN} reads the job's output through ${ADDRESS}"
expect 0 "${WORKDIR}/resubmit.json" mr submit --rehearse --nodes 2 --address "${ADDRESS}" --run "${RUN}" \
    --image "${SMOKE_IMAGE}" --ray-version "${RAY_VERSION}" --no-follow -o json
check "${WORKDIR}/resubmit.json" '.created == false and .status == "SUCCEEDED"' "re-submit returns the same job"

# ==== scale ========================================================================================
step "scale --nodes 1"
expect 0 "${WORKDIR}/scale-1.json" mr scale --nodes 1 --backend kubernetes --timeout "${UP_TIMEOUT}" -o json
check "${WORKDIR}/scale-1.json" '.from == 2 and .to == 1 and .desired_workers == 1 and .ready_workers == 1' "scaled from 2 to 1, ready"
check "${WORKDIR}/scale-1.json" '.recommended_split.feasible == true' "the split for 1 node is feasible"
ok=0
for _ in $(seq 1 60); do # Ray marks the removed worker DEAD a moment after its pod is gone
    expect 0 "${WORKDIR}/status-1.json" mr status --backend kubernetes --ray -o json
    if jq -e '.ray_nodes_alive == 2' "${WORKDIR}/status-1.json" >/dev/null; then ok=1; break; fi
    sleep 2
done
[[ "${ok}" -eq 1 ]] || die "Ray still counts the removed worker after 120 s"
check "${WORKDIR}/status-1.json" ".ready_workers == 1 and .ray_gpus == ${GPUS}" "1 worker ready, ${GPUS} GPUs in Ray"

step "scale --nodes 2"
expect 0 "${WORKDIR}/scale-2.json" mr scale --nodes 2 --backend kubernetes --timeout "${UP_TIMEOUT}" -o json
check "${WORKDIR}/scale-2.json" '.from == 1 and .to == 2 and .ready_workers == 2' "scaled back to 2, ready"
expect 0 "${WORKDIR}/status-2.json" mr status --backend kubernetes --ray -o json
check "${WORKDIR}/status-2.json" ".ray_nodes_alive == 3 and .ray_gpus == $((2 * GPUS))" "Ray sees the new worker: $((2 * GPUS)) GPUs"

# ==== down =========================================================================================
step "down -y"
expect 0 "${WORKDIR}/down.json" mr down -y --backend kubernetes -o json
check "${WORKDIR}/down.json" '.deleted == true and (has("pods_remaining") | not)' "RayCluster deleted and its pods gone"
STEP=""
log "PASSED"
