#!/usr/bin/env bash
# Make local stand-ins for the base images the Dockerfile builds from, for a
# Docker engine that cannot pull images (no container registry reachable).
#
# Usage: scripts/docker-base-images.sh [--force] [IMAGE...]
#
# Images (default: builder runtime):
#   builder  $BUILDER_TAG: Debian bookworm (minbase) with gcc, libc6-dev,
#            pkg-config, ca-certificates, and this machine's active Rust
#            toolchain under /usr/local/rustup (RUSTUP_HOME) with rustup's
#            proxies in /usr/local/cargo/bin (CARGO_HOME), as the official
#            Rust images lay it out
#   runtime  $RUNTIME_TAG: a distroless-style root: only the files of
#            base-files, netbase, tzdata, libc6, libgcc-s1, libstdc++6,
#            libssl3 and ca-certificates (the CA bundle), /etc/passwd with
#            root, nobody and nonroot (65532), no shell; USER 65532
#   haproxy  $HAPROXY_TAG: Debian bookworm (minbase) with haproxy, for the
#            load balancer in tests/container.rs; not a Dockerfile base
#   systemd  $SYSTEMD_TAG: Debian bookworm (minbase) with systemd 252 as
#            PID 1, dbus and nss-systemd (as a standard install has them),
#            for tests/systemd.rs: the unit files run under a real service
#            manager; not a Dockerfile base
#   all      all of the above
#
# Each image is made with `debootstrap --variant=minbase` from the Debian
# mirror this machine's apt is configured with (or $DEBIAN_MIRROR), then
# `tar | docker import`. The certificate authorities this machine adds to
# Debian's (/usr/local/share/ca-certificates) are added to the images' trust
# store too: where HTTPS leaves through an intercepting proxy, `cargo build`
# inside `docker build` can fetch crates only with them. An image whose tag already exists is left alone: a
# real image pulled from a registry wins over a stand-in, and a stand-in made
# before is reused (--force remakes the stand-ins, never a real image).
# The bootstrapped roots and the package cache live under $WORK_DIR (default
# ${TMPDIR:-/tmp}/docker-base-images), never in the repository.
#
# Needs root (debootstrap, chroot), docker, debootstrap
# (scripts/install-test-deps.sh docker installs it) and, for the builder, a
# Rust toolchain on PATH. Prints one line per image it makes; quiet otherwise.
set -euo pipefail

# The tags must stay equal to the defaults of the Dockerfile's ARGs
# RUST_IMAGE and RUNTIME_IMAGE; the script checks that before it does anything.
BUILDER_TAG="${BUILDER_TAG:-rust:1.95-slim-bookworm}"
RUNTIME_TAG="${RUNTIME_TAG:-gcr.io/distroless/cc-debian12:nonroot}"
HAPROXY_TAG="${HAPROXY_TAG:-stand-in/haproxy:bookworm}"
SYSTEMD_TAG="${SYSTEMD_TAG:-stand-in/systemd:bookworm}"

readonly SUITE=bookworm
readonly PROG=docker-base-images
# docker import --message: how the script recognises its own stand-ins.
readonly STAND_IN_MARK="docker-base-images stand-in"

WORK_DIR="${WORK_DIR:-${TMPDIR:-/tmp}/docker-base-images}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# --- arguments ---------------------------------------------------------------

force=0
images=()
for arg in "$@"; do
    case "$arg" in
    -h | --help)
        usage
        exit 0
        ;;
    -f | --force) force=1 ;;
    all) images+=(builder runtime haproxy systemd) ;;
    builder | runtime | haproxy | systemd) images+=("$arg") ;;
    *)
        usage >&2
        die "unknown argument '$arg'"
        ;;
    esac
done
((${#images[@]})) || images=(builder runtime)

# --- checks ------------------------------------------------------------------

# The Dockerfile's ARG defaults and the tags made here must agree, or the
# stand-ins would be made under names the build never asks for.
check_dockerfile_tags() {
    local dockerfile="$REPO_ROOT/Dockerfile" want got arg
    [[ -r $dockerfile ]] || return 0
    for arg in RUST_IMAGE RUNTIME_IMAGE; do
        if [[ $arg == RUST_IMAGE ]]; then want="$BUILDER_TAG"; else want="$RUNTIME_TAG"; fi
        got="$(sed -n "s/^ARG $arg=\\(.*\\)$/\\1/p" "$dockerfile" | head -n 1)"
        [[ -n $got ]] || die "Dockerfile has no 'ARG $arg=...' default"
        [[ $got == "$want" ]] || die "Dockerfile's $arg default is '$got', this script makes '$want'"
    done
}

check_dockerfile_tags
have docker || die "docker is not installed"
docker info >/dev/null 2>&1 || die "the docker engine does not answer (docker info failed)"

# What an existing tag is: "none", "stand-in" (made by this script) or "real".
image_state() {
    local comment
    if ! comment="$(docker image inspect --format '{{.Comment}}' "$1" 2>/dev/null)"; then
        echo none
    elif [[ $comment == "$STAND_IN_MARK"* ]]; then
        echo stand-in
    else
        echo real
    fi
}

tag_of() {
    case "$1" in
    builder) echo "$BUILDER_TAG" ;;
    runtime) echo "$RUNTIME_TAG" ;;
    haproxy) echo "$HAPROXY_TAG" ;;
    systemd) echo "$SYSTEMD_TAG" ;;
    esac
}

todo=()
for image in "${images[@]}"; do
    case "$(image_state "$(tag_of "$image")")" in
    none) todo+=("$image") ;;
    stand-in) ((force)) && todo+=("$image") ;;
    real) ;; # a pulled image: never replace it
    esac
done
((${#todo[@]})) || exit 0

((EUID == 0)) || die "debootstrap needs root: run this script as root"
have debootstrap || [[ -x /usr/sbin/debootstrap ]] ||
    die "debootstrap is missing (scripts/install-test-deps.sh docker installs it)"
PATH="$PATH:/usr/sbin:/sbin"

# --- the Debian mirror -------------------------------------------------------

# The first mirror apt is configured with for $SUITE itself (not -updates or
# -security), from deb822 .sources files or one-line .list files.
debian_mirror() {
    if [[ -n ${DEBIAN_MIRROR:-} ]]; then
        printf '%s\n' "${DEBIAN_MIRROR%/}"
        return
    fi
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        uri="$(awk -v suite="$SUITE" '
            BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    line = $i
                    if (line ~ /^[ \t]*#/) continue
                    key = tolower(line); sub(/:.*/, "", key)
                    val = line; sub(/^[^:]*:[ \t]*/, "", val)
                    if (key == "types") types = val
                    else if (key == "uris") uris = val
                    else if (key == "suites") suites = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                if (enabled == "no" || (" " types " ") !~ / deb /) next
                n = split(suites, s, /[ \t]+/)
                for (j = 1; j <= n; j++) if (s[j] == suite) {
                    split(uris, u, /[ \t]+/); print u[1]; exit
                }
            }' "$f")"
        if [[ -n $uri ]]; then
            printf '%s\n' "${uri%/}"
            return
        fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        uri="$(awk -v suite="$SUITE" '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite) { print $i; exit }
            }' "$f")"
        if [[ -n $uri ]]; then
            printf '%s\n' "${uri%/}"
            return
        fi
    done
    return 1
}

MIRROR="$(debian_mirror)" ||
    die "no '$SUITE' mirror in /etc/apt/sources.list*: set DEBIAN_MIRROR"

# --- helpers -----------------------------------------------------------------

mkdir -p "$WORK_DIR/cache"
# One run at a time: a second waits, then finds the images made.
exec 9>"$WORK_DIR/lock"
flock 9
log="$(mktemp "$WORK_DIR/log.XXXXXX")"
trap 'rm -f "$log"' EXIT

# Run a command, keeping its output in $log; show the tail of it on failure.
quietly() {
    if ! "$@" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "failed: $*"
    fi
}

# The certificate authorities this machine trusts on top of Debian's
# (/usr/local/share/ca-certificates): where outgoing HTTPS goes through an
# intercepting proxy, `cargo build` inside the builder needs them as much as
# cargo on the machine does.
readonly LOCAL_CA_DIR=/usr/local/share/ca-certificates
local_cas_digest() {
    if [[ -d $LOCAL_CA_DIR ]]; then
        find "$LOCAL_CA_DIR" -type f -name '*.crt' -print0 | sort -z | xargs -0r cat | md5sum | cut -d' ' -f1
    fi
}

# bootstrap NAME PACKAGES: a minbase root with PACKAGES added, in
# $WORK_DIR/NAME, made once and reused while its package list is the same.
bootstrap() {
    local name="$1" include="$2" root="$WORK_DIR/$1"
    local stamp="$root.done" key
    key="$SUITE $MIRROR $include $(local_cas_digest)"
    if [[ -f $stamp && $(cat "$stamp") == "$key" && -d $root ]]; then
        return 0
    fi
    rm -rf "$root" "$stamp"
    mkdir -p "$root"
    quietly debootstrap --variant=minbase --include="$include" \
        --cache-dir="$WORK_DIR/cache" "$SUITE" "$root" "$MIRROR"
    if [[ -n $(local_cas_digest) ]]; then
        cp -a "$LOCAL_CA_DIR/." "$root$LOCAL_CA_DIR/"
        quietly chroot "$root" update-ca-certificates
    fi
    # What apt leaves behind is no part of an image.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/var/log/* "$root"/tmp/* "$root"/root/.bash_history
    printf '%s\n' "$key" >"$stamp"
}

# import ROOT TAG [--change ...]: the folder's contents as a one-layer image.
import_root() {
    local root="$1" tag="$2"
    shift 2
    # Remove a previous stand-in of the tag first so that it leaves no
    # dangling image behind (only stand-ins reach this point).
    docker image rm "$tag" >/dev/null 2>&1 || true
    tar --numeric-owner --xattrs -C "$root" -cf - . |
        docker import --message "$STAND_IN_MARK, debootstrap $SUITE, $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
            "$@" - "$tag" >/dev/null
}

# The files one package installed, as paths relative to the root.
package_files() {
    local root="$1" pkg="$2" list
    for list in "$root/var/lib/dpkg/info/$pkg.list" "$root"/var/lib/dpkg/info/"$pkg":*.list; do
        if [[ -f $list ]]; then
            sed -e 's|^/||' -e '/^\.\{0,1\}$/d' "$list"
            return 0
        fi
    done
    die "package $pkg is not installed in $root"
}

# --- builder -----------------------------------------------------------------

make_builder() {
    have rustc || die "no rustc on PATH: the builder stand-in carries this machine's toolchain"
    local version host sysroot name root="$WORK_DIR/builder-image"
    version="$(rustc --version | awk '{print $2}')"
    host="$(rustc -vV | sed -n 's/^host: //p')"
    sysroot="$(rustc --print sysroot)"
    name="$version-$host"
    case "$BUILDER_TAG" in
    *:"${version%.*}"-* | *:"$version"-*) ;;
    *) say "warning: $BUILDER_TAG will hold Rust $version, the toolchain of this machine" ;;
    esac

    bootstrap builder ca-certificates,gcc,libc6-dev,pkg-config
    rm -rf "$root"
    cp -a "$WORK_DIR/builder" "$root"

    # The toolchain as rustup installs it, without its HTML documentation.
    local rustup_home="$root/usr/local/rustup" cargo_home="$root/usr/local/cargo"
    mkdir -p "$rustup_home/toolchains/$name" "$cargo_home/bin"
    tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$rustup_home/toolchains/$name" -xf -
    local rustup tool
    rustup="$(command -v rustup || true)"
    if [[ -n $rustup ]]; then
        cp "$(readlink -f "$rustup")" "$cargo_home/bin/rustup"
        printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\nauto_self_update = "disable"\n' \
            "$name" >"$rustup_home/settings.toml"
        for tool in cargo cargo-clippy cargo-fmt clippy-driver rust-gdb rust-gdbgui rust-lldb rustc rustdoc rustfmt; do
            ln -f "$cargo_home/bin/rustup" "$cargo_home/bin/$tool"
        done
    else
        for tool in "$rustup_home/toolchains/$name"/bin/*; do
            ln -s "/usr/local/rustup/toolchains/$name/bin/${tool##*/}" "$cargo_home/bin/${tool##*/}"
        done
    fi
    chmod -R a+w "$rustup_home" "$cargo_home"

    import_root "$root" "$BUILDER_TAG" \
        --change "ENV RUSTUP_HOME=/usr/local/rustup" \
        --change "ENV CARGO_HOME=/usr/local/cargo" \
        --change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV RUST_VERSION=$version" \
        --change "CMD [\"bash\"]"
    rm -rf "$root"
    say "made $BUILDER_TAG (Rust $version, stand-in)"
}

# --- runtime -----------------------------------------------------------------

make_runtime() {
    local src="$WORK_DIR/slim" root="$WORK_DIR/runtime-image" pkg link
    bootstrap slim ca-certificates,haproxy,libssl3,netbase,tzdata
    rm -rf "$root"
    mkdir -p "$root"
    # Merged /usr: keep /bin, /lib, /lib64, /sbin the symlinks they are.
    for link in "$src"/*; do
        if [[ -L $link ]]; then
            cp -a "$link" "$root/"
            mkdir -p "$root/$(readlink "$link")"
        fi
    done
    {
        for pkg in base-files netbase tzdata libc6 libgcc-s1 libstdc++6 libssl3; do
            package_files "$src" "$pkg"
        done
        # The CA bundle is made by update-ca-certificates, not shipped.
        printf '%s\n' etc/ssl etc/ssl/certs etc/ssl/certs/ca-certificates.crt
    } | sort -u | while IFS= read -r path; do
        # dpkg lists some files (diversions, conffiles removed) that are gone.
        [[ -e $src/$path || -L $src/$path ]] && printf '%s\n' "$path"
    done >"$WORK_DIR/runtime.files"
    tar -C "$src" --no-recursion -cf - -T "$WORK_DIR/runtime.files" |
        tar -C "$root" --keep-directory-symlink -xf -
    # Documentation and the like are not in a distroless image either.
    rm -rf "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info \
        "$root"/usr/share/lintian "$root"/usr/share/locale

    install -d -m 0755 "$root/etc" "$root/var" "$root/run"
    install -d -m 1777 "$root/tmp"
    install -d -m 0700 "$root/root"
    install -d -m 0700 -o 65532 -g 65532 "$root/home/nonroot"
    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
    printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
    [[ ! -e $root/bin/sh && ! -e $root/usr/bin/sh ]] || die "the runtime stand-in has a shell"

    import_root "$root" "$RUNTIME_TAG" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" \
        --change "USER 65532" \
        --change "WORKDIR /home/nonroot"
    rm -rf "$root"
    say "made $RUNTIME_TAG (distroless-style, stand-in)"
}

# --- haproxy -----------------------------------------------------------------

make_haproxy() {
    local src="$WORK_DIR/slim" root="$WORK_DIR/haproxy-image"
    bootstrap slim ca-certificates,haproxy,libssl3,netbase,tzdata
    rm -rf "$root"
    cp -a "$src" "$root"
    install -d -m 0755 "$root/usr/local/etc/haproxy"
    # As the official haproxy image: the configuration is mounted here.
    import_root "$root" "$HAPROXY_TAG" \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENTRYPOINT [\"/usr/sbin/haproxy\"]" \
        --change "CMD [\"-W\", \"-db\", \"-f\", \"/usr/local/etc/haproxy/haproxy.cfg\"]"
    rm -rf "$root"
    say "made $HAPROXY_TAG (haproxy $(chroot "$src" haproxy -v 2>/dev/null | awk 'NR == 1 {print $3}'), stand-in)"
}

# --- systemd -----------------------------------------------------------------

make_systemd() {
    local root="$WORK_DIR/systemd-image" unit
    bootstrap systemd ca-certificates,dbus,libnss-systemd,systemd,systemd-sysv
    rm -rf "$root"
    cp -a "$WORK_DIR/systemd" "$root"
    # Nothing in a container for these to do; left on, they fail and clutter
    # the journal (no hardware, no consoles, no kernel modules to load).
    for unit in systemd-udevd.service systemd-udev-trigger.service getty.target \
        systemd-modules-load.service systemd-remount-fs.service console-getty.service; do
        ln -sf /dev/null "$root/etc/systemd/system/$unit"
    done
    # Run as `docker run --cap-add SYS_ADMIN --cgroupns=host
    # -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock
    # --stop-signal SIGRTMIN+3 IMAGE`: systemd as PID 1, stopped by its halt
    # signal (`docker import` cannot set STOPSIGNAL).
    import_root "$root" "$SYSTEMD_TAG" \
        --change "ENV container=docker" \
        --change "CMD [\"/lib/systemd/systemd\"]"
    rm -rf "$root"
    say "made $SYSTEMD_TAG (systemd $(chroot "$WORK_DIR/systemd" systemctl --version 2>/dev/null | awk 'NR == 1 {print $2}'), stand-in)"
}

for image in "${todo[@]}"; do
    # Another run may have made it while this one waited for the lock.
    if ((!force)) && [[ $(image_state "$(tag_of "$image")") != none ]]; then
        continue
    fi
    "make_$image"
done
