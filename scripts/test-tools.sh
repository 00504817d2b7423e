#!/usr/bin/env bash
# Install the tools the tests run, once:
#   - ShellCheck (the lint tests) and jq (the smoke sequence) from Debian's packages, unless on PATH;
#   - actionlint built from its Go module into the versioned cache
#     ${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}/bin/actionlint-<version>, unless it is there.
# Quiet and quick when both are present (nothing is downloaded or built). A tool that cannot be had is named
# on stderr; the exit status is then 1 under MILESRAY_TEST_STRICT=1 (the lint tests would fail anyway), else 0
# (the lint tests skip, saying why).
set -euo pipefail

ACTIONLINT_MODULE=github.com/rhysd/actionlint/cmd/actionlint
ACTIONLINT_VERSION=v1.7.12

CACHE="${MILESRAY_TEST_CACHE:-${HOME}/.cache/miles-ray}"
BIN="${CACHE}/bin"
ACTIONLINT="${BIN}/actionlint-${ACTIONLINT_VERSION}"
missing=()

log() { echo "test-tools: $*" >&2; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

# install_deb COMMAND PACKAGE: the Debian package PACKAGE, unless COMMAND is already on PATH.
install_deb() {
    local cmd="$1" pkg="$2" out
    command -v "${cmd}" >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || { log "${pkg}: not installed and no apt-get here"; return 1; }
    out="$(mktemp)"
    # the package lists may be empty (fresh image): update them once, then install
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg}" >"${out}" 2>&1; then
        as_root apt-get update -qq >>"${out}" 2>&1 || true
        if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg}" >>"${out}" 2>&1; then
            log "${pkg}: apt-get install failed: $(tail -n 1 "${out}")"
            rm -f "${out}"
            return 1
        fi
    fi
    rm -f "${out}"
    log "installed ${pkg} (Debian)"
}

find_go() {
    if [[ -n "${GO:-}" && -x "${GO}" ]]; then echo "${GO}"; return 0; fi
    if command -v go >/dev/null 2>&1; then command -v go; return 0; fi
    if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return 0; fi
    return 1
}

install_actionlint() {
    [[ -x "${ACTIONLINT}" ]] && return 0
    local go gobin out
    go="$(find_go)" || { log "actionlint: no Go toolchain to build ${ACTIONLINT_MODULE}@${ACTIONLINT_VERSION}"; return 1; }
    mkdir -p "${BIN}"
    gobin="$(mktemp -d)"
    out="$(mktemp)"
    if ! GOBIN="${gobin}" GOFLAGS="-trimpath -buildvcs=false" \
        "${go}" install -ldflags "-s -w" "${ACTIONLINT_MODULE}@${ACTIONLINT_VERSION}" >"${out}" 2>&1; then
        log "actionlint: go install ${ACTIONLINT_MODULE}@${ACTIONLINT_VERSION} failed: $(tail -n 1 "${out}")"
        rm -rf "${gobin}" "${out}"
        return 1
    fi
    mv -f "${gobin}/actionlint" "${ACTIONLINT}.tmp.$$"
    mv -f "${ACTIONLINT}.tmp.$$" "${ACTIONLINT}"
    rm -rf "${gobin}" "${out}"
    log "built actionlint ${ACTIONLINT_VERSION} into ${ACTIONLINT}"
}

install_deb shellcheck shellcheck || missing+=(shellcheck)
install_deb jq jq || missing+=(jq)  # the smoke sequence (scripts/smoke-sequence.sh) checks JSON with jq
install_actionlint || missing+=(actionlint)

if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing: ${missing[*]} (the lint tests skip, or fail under MILESRAY_TEST_STRICT=1)"
    [[ "${MILESRAY_TEST_STRICT:-}" == "1" ]] && exit 1
fi
exit 0
