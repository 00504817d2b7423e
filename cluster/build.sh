#!/usr/bin/env bash
# Build the fake-GPU Kubernetes control plane from published Go modules into a versioned cache.
#
#   cluster/build.sh            build every missing component (warm run: no build at all)
#   cluster/build.sh --check    exit 0 if every component is cached, 1 otherwise (builds nothing)
#   cluster/build.sh --list     print "<component> <path>" for every component
#   cluster/build.sh NAME...    build only these components
#   cluster/build.sh real-nodes what real nodes need (cluster/realnodes.py): node-runtime kubelet
#                               pause-image ray-image (also accepted by --check)
#   cluster/build.sh kueue      Kueue's manager, CRDs and webhook manifests (cluster/kueue.py; optional)
#
# Cache: ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/bin/<component>-<version>
#        ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/crds/kuberay-<version>/*.yaml
#        ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/kwok-stages-<version>.yaml (kwok's default stages)
#        ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/images/{ray,pause}-<version>-<input hash>.tar
#        ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/kueue-<version>/{crds/*.yaml,webhooks.yaml,SOURCE}
# node-runtime is not cached but installed: Debian's containerd, runc, containernetworking-plugins,
# iptables and mmdebstrap at the pinned versions, with apt-get, when missing.
# Versions: cluster/versions.env (the only place they are pinned).
# Exit status 3: no Go toolchain found.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/versions.env disable=SC1091
source "${HERE}/versions.env"

CACHE="${MILESRAY_TEST_CACHE:-${HOME}/.cache/miles-ray}"
BIN="${CACHE}/bin"
SRC="${CACHE}/src"
CRDS="${CACHE}/crds/kuberay-${KUBERAY_VERSION}"
KWOK_STAGES="${CACHE}/kwok-stages-${KWOK_VERSION}.yaml"
KUEUE_ASSETS="${CACHE}/kueue-${KUEUE_VERSION}"

ALL_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kuberay-operator)
# kubectl is optional (a system kubectl is fine); build it with: cluster/build.sh kubectl
# kueue is optional too (only tests/e2e/test_queues.py runs it): cluster/build.sh kueue
OPTIONAL_COMPONENTS=(kubectl kueue)
# Real nodes (cluster/realnodes.py), in build order: `cluster/build.sh real-nodes`.
REAL_NODE_COMPONENTS=(node-runtime kubelet pause-image ray-image)
PYTHON="${PYTHON:-python3}"
IMAGE_PY="${HERE}/image/build_image.py"
# package=version pairs that node-runtime installs
DEB_PINS=(
    "containerd=${CONTAINERD_DEB_VERSION}"
    "runc=${RUNC_DEB_VERSION}"
    "containernetworking-plugins=${CNI_PLUGINS_DEB_VERSION}"
    "iptables=${IPTABLES_DEB_VERSION}"
    "mmdebstrap=${MMDEBSTRAP_DEB_VERSION}"
)

version_of() {
    case "$1" in
        etcd) echo "${ETCD_VERSION}" ;;
        kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet) echo "${KUBERNETES_VERSION}" ;;
        node-runtime) echo "${CONTAINERD_DEB_VERSION}" ;;
        pause-image) echo "${PAUSE_VERSION}" ;;
        ray-image) sed -n 's/^ray==//p' "${HERE}/../constraints.txt" ;;
        kwok) echo "${KWOK_VERSION}" ;;
        kuberay-operator) echo "${KUBERAY_VERSION}" ;;
        kueue) echo "${KUEUE_VERSION}" ;;
        *)
            echo "unknown component: $1" >&2
            return 1
            ;;
    esac
}

path_of() {
    local v
    case "$1" in
        node-runtime) echo "/usr/bin/containerd" ;;
        pause-image) "${PYTHON}" "${IMAGE_PY}" path pause --cache "${CACHE}" | cut -d' ' -f1 ;;
        ray-image) "${PYTHON}" "${IMAGE_PY}" path ray --cache "${CACHE}" | cut -d' ' -f1 ;;
        *)
            v="$(version_of "$1")"
            echo "${BIN}/$1-${v}"
            ;;
    esac
}

deb_installed() { # package=version
    [[ "$(dpkg-query -W -f='${Status} ${Version}' "${1%%=*}" 2>/dev/null)" == "install ok installed ${1#*=}" ]]
}

is_cached() {
    local p
    case "$1" in
        node-runtime)
            for p in "${DEB_PINS[@]}"; do
                deb_installed "${p}" || return 1
            done
            ;;
        pause-image | ray-image) [[ -s "$(path_of "$1")" ]] ;;
        kueue) [[ -x "$(path_of "$1")" && -s "${KUEUE_ASSETS}/webhooks.yaml" && -s "${KUEUE_ASSETS}/SOURCE" ]] ;;
        *) [[ -x "$(path_of "$1")" ]] ;;
    esac
}

crds_cached() {
    [[ -s "${CRDS}/ray.io_rayclusters.yaml" && -s "${KWOK_STAGES}" ]]
}

mode=build
wanted=()
for arg in "$@"; do
    case "${arg}" in
        --check) mode=check ;;
        --list) mode=list ;;
        -h | --help)
            sed -n '2,13p' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        real-nodes) wanted+=("${REAL_NODE_COMPONENTS[@]}") ;;
        *) wanted+=("${arg}") ;;
    esac
done
if [[ ${#wanted[@]} -eq 0 ]]; then
    wanted=("${ALL_COMPONENTS[@]}")
fi
for c in "${wanted[@]}"; do
    version_of "${c}" >/dev/null
done

if [[ "${mode}" == list ]]; then
    for c in "${ALL_COMPONENTS[@]}" "${OPTIONAL_COMPONENTS[@]}" "${REAL_NODE_COMPONENTS[@]}"; do
        echo "${c} $(path_of "${c}")"
    done
    echo "crds ${CRDS}"
    echo "kwok-stages ${KWOK_STAGES}"
    echo "kueue-assets ${KUEUE_ASSETS}"
    exit 0
fi

if [[ "${mode}" == check ]]; then
    missing=0
    for c in "${wanted[@]}"; do
        if is_cached "${c}"; then
            echo "cached  ${c} $(path_of "${c}")"
        else
            echo "missing ${c} $(path_of "${c}")"
            missing=1
        fi
    done
    if crds_cached; then echo "cached  crds ${CRDS} ${KWOK_STAGES}"; else
        echo "missing crds ${CRDS} ${KWOK_STAGES}"
        missing=1
    fi
    exit "${missing}"
fi

# ---------------------------------------------------------------------------------------------
# Build mode

# Go is needed only when something is missing: a warm run works without it.
require_go() {
    if [[ -n "${GO_CHECKED:-}" ]]; then return 0; fi
    GO="${GO:-$(command -v go || true)}"
    if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then
        GO=/usr/local/go/bin/go
    fi
    if [[ -z "${GO}" || ! -x "${GO}" ]]; then
        echo "build.sh: no Go toolchain found (set GO=/path/to/go or put go on PATH)" >&2
        exit 3
    fi
    GO_CHECKED=1
}

mkdir -p "${BIN}" "${SRC}" "$(dirname "${CRDS}")"
# One build at a time per cache (pytest sessions and manual runs may race).
exec 9>"${CACHE}/.build.lock"
flock 9

# 2 cores, 24 GiB: compile at most 2 packages at once, build one binary at a time.
export GOFLAGS="-p=2 -mod=mod -trimpath -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

log() { printf '[build.sh] %s\n' "$*" >&2; }

# A module of our own that requires k8s.io/kubernetes and pins every staging module by `replace`.
prepare_kubernetes_module() {
    local dir="${SRC}/kubernetes-${KUBERNETES_VERSION}"
    if [[ -s "${dir}/go.mod" ]] && grep -q "k8s.io/kubernetes ${KUBERNETES_VERSION}" "${dir}/go.mod"; then
        echo "${dir}"
        return 0
    fi
    mkdir -p "${dir}"
    local upstream_mod
    upstream_mod="$(mktemp)"
    (cd "${dir}" && "${GO}" mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" >"${upstream_mod}.json")
    local gomod_path
    gomod_path="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' "${upstream_mod}.json")"
    cp "${gomod_path}" "${upstream_mod}"
    {
        echo "module miles-ray.local/build/kubernetes"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
        echo
        echo "replace ("
        # Every staging module that k8s.io/kubernetes replaces with ./staging/src/... AND requires.
        local m
        sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "${upstream_mod}" |
            while read -r m; do
                if grep -Eq "^[[:space:]]*${m} v0\.0\.0" "${upstream_mod}"; then
                    echo "	${m} => ${m} ${KUBERNETES_STAGING_VERSION}"
                fi
            done
        echo ")"
    } >"${dir}/go.mod.new"
    mv "${dir}/go.mod.new" "${dir}/go.mod"
    rm -f "${upstream_mod}" "${upstream_mod}.json"
    echo "${dir}"
}

prepare_etcd_module() {
    local dir="${SRC}/etcd-${ETCD_VERSION}"
    mkdir -p "${dir}"
    if ! grep -qs "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" "${dir}/go.mod"; then
        printf 'module miles-ray.local/build/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
            "${ETCD_VERSION}" >"${dir}/go.mod"
    fi
    echo "${dir}"
}

k8s_ldflags() {
    local major minor pkg flags="-s -w"
    major="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f1)"
    minor="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f2)"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X ${pkg}.gitVersion=${KUBERNETES_VERSION}"
        flags+=" -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
        flags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
    done
    echo "${flags}"
}

build_component() {
    local c="$1" out tmp dir gobin
    out="$(path_of "${c}")"
    tmp="${out}.tmp.$$"
    case "${c}" in
        kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet)
            dir="$(prepare_kubernetes_module)"
            (cd "${dir}" && "${GO}" build -ldflags "$(k8s_ldflags)" -o "${tmp}" "k8s.io/kubernetes/cmd/${c}")
            ;;
        etcd)
            dir="$(prepare_etcd_module)"
            (cd "${dir}" && "${GO}" build -ldflags "-s -w" -o "${tmp}" go.etcd.io/etcd/server/v3)
            ;;
        kwok)
            gobin="$(mktemp -d)"
            GOBIN="${gobin}" GOFLAGS="-p=2 -trimpath -buildvcs=false" \
                "${GO}" install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}" \
                "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
            mv "${gobin}/kwok" "${tmp}"
            rmdir "${gobin}"
            ;;
        kuberay-operator)
            gobin="$(mktemp -d)"
            GOBIN="${gobin}" GOFLAGS="-p=2 -trimpath -buildvcs=false" \
                "${GO}" install -ldflags "-s -w" "github.com/ray-project/kuberay/ray-operator@${KUBERAY_VERSION}"
            mv "${gobin}/ray-operator" "${tmp}"
            rmdir "${gobin}"
            ;;
        kueue)
            gobin="$(mktemp -d)"
            GOBIN="${gobin}" GOFLAGS="-p=2 -trimpath -buildvcs=false" \
                "${GO}" install -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" \
                "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}"
            mv "${gobin}/kueue" "${tmp}"
            rmdir "${gobin}"
            copy_kueue_assets
            ;;
    esac
    chmod 0755 "${tmp}"
    mv -f "${tmp}" "${out}"
}

# Debian packages of the real nodes' runtime (no binary cache: apt installs them system-wide;
# policy-rc.d or the absence of an init system keeps the packaged containerd service from starting).
install_node_runtime() {
    local missing=() p
    for p in "${DEB_PINS[@]}"; do
        deb_installed "${p}" || missing+=("${p}")
    done
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build_image() {
    case "$1" in
        pause-image)
            "${PYTHON}" "${IMAGE_PY}" pause --cache "${CACHE}" \
                --pause-c "$(module_dir "k8s.io/kubernetes@${KUBERNETES_VERSION}")/build/pause/linux/pause.c"
            ;;
        ray-image)
            # Debian's mmdebstrap and a Python with pip (PYTHON) are needed: node-runtime first.
            "${PYTHON}" "${IMAGE_PY}" ray --cache "${CACHE}" --python "${PYTHON}"
            ;;
    esac
}

module_dir() {
    (cd "${SRC}" && "${GO}" mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

# kwok's own default stages (what kwokctl configures): node init + lease heartbeat, pod ready/complete/delete.
copy_kwok_stages() {
    local dir f first=1
    dir="$(module_dir "sigs.k8s.io/kwok@${KWOK_VERSION}")/kustomize/stage"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        if [[ ${first} -eq 0 ]]; then echo "---"; fi
        first=0
        cat "${dir}/${f}"
    done >"${KWOK_STAGES}.tmp.$$"
    mv -f "${KWOK_STAGES}.tmp.$$" "${KWOK_STAGES}"
}

copy_crds() {
    local dir
    dir="$(module_dir "github.com/ray-project/kuberay/ray-operator@${KUBERAY_VERSION}")"
    mkdir -p "${CRDS}.tmp.$$"
    cp "${dir}"/config/crd/bases/*.yaml "${CRDS}.tmp.$$/"
    chmod 0644 "${CRDS}.tmp.$$"/*.yaml
    rm -rf "${CRDS}"
    mv "${CRDS}.tmp.$$" "${CRDS}"
}

# Kueue's CRDs and webhook manifests from the same module zip, with the module's checksum (go.sum's h1:).
copy_kueue_assets() {
    local dir sum tmp="${KUEUE_ASSETS}.tmp.$$"
    dir="$(module_dir "sigs.k8s.io/kueue@${KUEUE_VERSION}")"
    sum="$( (cd "${SRC}" && "${GO}" mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}") |
        sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')"
    mkdir -p "${tmp}/crds"
    cp "${dir}"/config/components/crd/bases/*.yaml "${tmp}/crds/"
    cp "${dir}/config/components/webhook/manifests.yaml" "${tmp}/webhooks.yaml"
    chmod 0644 "${tmp}"/crds/*.yaml "${tmp}/webhooks.yaml"
    printf 'MODULE=sigs.k8s.io/kueue\nVERSION=%s\nMODULE_SUM=%s\nCRDS=config/components/crd/bases/*.yaml\nWEBHOOKS=config/components/webhook/manifests.yaml\n' \
        "${KUEUE_VERSION}" "${sum}" >"${tmp}/SOURCE"
    rm -rf "${KUEUE_ASSETS}"
    mv "${tmp}" "${KUEUE_ASSETS}"
}

total_start=${SECONDS}
for c in "${wanted[@]}"; do
    out="$(path_of "${c}")"
    if is_cached "${c}"; then
        printf '%-26s %-10s cached  %s\n' "${c}" "$(version_of "${c}")" "${out}"
        continue
    fi
    log "building ${c} $(version_of "${c}") ..."
    start=${SECONDS}
    case "${c}" in
        node-runtime) install_node_runtime ;;
        ray-image) build_image "${c}" ;;
        pause-image)
            require_go
            build_image "${c}"
            ;;
        *)
            require_go
            build_component "${c}"
            ;;
    esac
    out="$(path_of "${c}")"
    printf '%-26s %-10s built   %4ds  %s\n' "${c}" "$(version_of "${c}")" "$((SECONDS - start))" "${out}"
    # Cold build times, for benchmarks/bench_control_plane.py.
    printf '%s\t%s\t%ss\t%s\n' "${c}" "$(version_of "${c}")" "$((SECONDS - start))" "$(date -u +%FT%TZ)" \
        >>"${CACHE}/build-times.tsv"
done
if crds_cached; then
    printf '%-26s %-10s cached  %s\n' "kuberay-crds" "${KUBERAY_VERSION}" "${CRDS}"
else
    require_go
    start=${SECONDS}
    copy_crds
    copy_kwok_stages
    printf '%-26s %-10s copied  %4ds  %s\n' "kuberay-crds" "${KUBERAY_VERSION}" "$((SECONDS - start))" "${CRDS}"
    printf '%-26s %-10s copied  %4ds  %s\n' "kwok-stages" "${KWOK_VERSION}" "$((SECONDS - start))" "${KWOK_STAGES}"
fi
printf '%-26s %-10s         %4ds\n' "total" "" "$((SECONDS - total_start))"
