#!/usr/bin/env bash
# `make image`: build nodeagent's image from the Dockerfile with no registry in reach, then run it.
#
# No base image can be pulled, so the base is built here from Debian packages (mmdebstrap:
# bookworm minbase + python3 + python3-venv) and committed into buildah's storage. Pip inside a
# build step cannot be trusted to reach PyPI either (network and TLS differ from the host's), so
# every wheel the build needs is put into image/wheelhouse/ first, by the host's pip (PyPI or its
# cache), and the build runs with PIP_NO_INDEX=true. Then the image is smoke-run: the CLI and the
# agent on the emulator (image/smoke.sh), and the size nodeagent adds over the base is printed.
#
# Needs root (mmdebstrap --mode=root, buildah) and the Debian packages buildah and mmdebstrap
# (installed here with apt-get when missing). Settings (environment):
#   PYTHON        host python whose pip fills the wheelhouse and which must be the base's Python
#                 version (default .venv/bin/python; the Makefile passes its own)
#   HADOLINT      hadolint binary (default .venv/bin/hadolint, from the test extras)
#   IMAGE         tag to build (default localhost/nodeagent:<version>)
#   SUITE         Debian suite of the base (default bookworm: Python 3.11)
#   REBUILD_BASE  1: rebuild the base even when buildah's storage has it
#   CLEANUP       1: remove the image and the base from buildah's storage at the end (CI)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
HADOLINT=${HADOLINT:-.venv/bin/hadolint}
SUITE=${SUITE:-bookworm}
BASE_IMAGE=localhost/nodeagent-base:$SUITE
REBUILD_BASE=${REBUILD_BASE:-0}
CLEANUP=${CLEANUP:-0}
WHEELHOUSE=image/wheelhouse
buildah() { command buildah --storage-driver vfs "$@"; }

fail() { echo "make image: $*" >&2; exit 2; }
started=$(date +%s)
phase_start=$started
phase() { # phase NAME: prints how long the phase that just ended took
    local now; now=$(date +%s)
    printf 'image: %-10s %4d s\n' "$1" $((now - phase_start))
    timings+=("$(printf '%-10s %4d s' "$1" $((now - phase_start)))")
    phase_start=$now
}
timings=()

# --- tools -----------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || fail "needs root (mmdebstrap --mode=root and buildah build the base and the image); without root, build with a container engine: docker build ."
[ -x "$PYTHON" ] || fail "no $PYTHON: run make image (it creates .venv), or set PYTHON"
[ -x "$HADOLINT" ] || fail "no $HADOLINT: install the test extras (pip install -e '.[test]'), or set HADOLINT"
missing=()
for tool in buildah mmdebstrap; do type -P "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || fail "needs the Debian packages ${missing[*]} and there is no apt-get to install them"
    echo "image: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
        fail "apt-get could not install ${missing[*]}"
fi
phase tools

"$HADOLINT" Dockerfile
phase hadolint

# --- the base --------------------------------------------------------------------------------
if [ "$REBUILD_BASE" = 1 ] || ! buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    tmp=$(mktemp -d /var/tmp/nodeagent-base.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    echo "image: mmdebstrap $SUITE (minbase, python3, python3-venv) -> $BASE_IMAGE"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv --mode=root \
        "$SUITE" "$tmp/rootfs.tar"
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
    buildah config --label "org.opencontainers.image.description=Debian $SUITE minbase with python3 and python3-venv (mmdebstrap)" \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 "$ctr"
    buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
else
    echo "image: $BASE_IMAGE is in buildah's storage (REBUILD_BASE=1 rebuilds it)"
fi
phase base

# The wheelhouse holds wheels for the base's Python: the host's must be the same version.
ctr=$(buildah from --pull=never "$BASE_IMAGE")
base_python=$(buildah run --isolation chroot "$ctr" -- python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
buildah rm "$ctr" >/dev/null
host_python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$base_python" = "$host_python" ] ||
    fail "the base $BASE_IMAGE has Python $base_python but $PYTHON is $host_python; its wheels would not fit: set PYTHON to a python$base_python"

# --- the wheelhouse: nodeagent's runtime dependencies and its build requirements --------------
toml='import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))'
version=$("$PYTHON" -c "$toml; print(d['project']['version'])")
mapfile -t requirements < <("$PYTHON" -c "$toml; print(*d['project']['dependencies'], *d['build-system']['requires'], sep='\n')")
rm -f "$WHEELHOUSE"/*.whl
log=$(mktemp)
"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELHOUSE" \
    "${requirements[@]}" >"$log" 2>&1 ||
    { cat "$log" >&2; rm -f "$log"; fail "pip could not fill the wheelhouse (its log is above)"; }
rm -f "$log"
echo "image: wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
phase wheelhouse

# --- the image -------------------------------------------------------------------------------
IMAGE=${IMAGE:-localhost/nodeagent:$version}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || revision="$revision-dirty"
log=$(mktemp)
previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || :)
buildah bud --isolation chroot --pull=never --layers=false --force-rm \
    --build-arg "BASE=$BASE_IMAGE" --build-arg PIP_NO_INDEX=true \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --tag "$IMAGE" --file Dockerfile . >"$log" 2>&1 ||
    { cat "$log" >&2; rm -f "$log"; fail "buildah could not build the image (its log is above)"; }
grep '^slim:' "$log" || :
rm -f "$log"
# The image this tag named before, now untagged: removed, so that rebuilds do not fill the disk.
if [ -n "$previous" ] && [ "$previous" != "$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE")" ]; then
    buildah rmi "$previous" >/dev/null 2>&1 || :
fi
phase build

# --- smoke run -------------------------------------------------------------------------------
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctr=$(buildah from --pull=never "$IMAGE")
trap 'buildah rm "$ctr" >/dev/null' EXIT
buildah copy --quiet --chmod 0755 "$ctr" image/smoke.sh /tmp/smoke.sh >/dev/null
buildah run --isolation chroot "$ctr" -- /tmp/smoke.sh "$port"
phase smoke

# --- what nodeagent adds over the base ---------------------------------------------------------
echo "image: largest in /opt/nodeagent (KiB on disk):"
buildah run --isolation chroot "$ctr" -- sh -c \
    'du -sk /opt/nodeagent/lib/python3*/site-packages/* | sort -n | tail -6'
buildah rm "$ctr" >/dev/null
trap - EXIT
# The layers the image has beyond the base's: as stored (uncompressed tars, what `docker images`
# adds up) and gzipped as a registry holds them (what a pull transfers).
oci=$(mktemp -d /var/tmp/nodeagent-oci.XXXXXX)
trap 'rm -rf "$oci"' EXIT
buildah push --quiet "$IMAGE" "oci:$oci" >/dev/null
for name in "$BASE_IMAGE" "$IMAGE"; do
    buildah inspect --type image --format '{{.Manifest}}' "$name"
    echo
done >"$oci/manifests.json"
read -r raw_bytes gzip_bytes < <("$PYTHON" image/layers.py "$oci/manifests.json" "$oci")
rm -rf "$oci"
trap - EXIT
phase size
if [ "$CLEANUP" = 1 ]; then
    buildah rmi "$IMAGE" "$BASE_IMAGE" >/dev/null ||
        echo "image: warning: could not remove $IMAGE and $BASE_IMAGE from buildah's storage" >&2
fi

echo
echo "image: $IMAGE built and smoke-run in $(($(date +%s) - started)) s"
printf '  %s\n' "${timings[@]}"
awk -v r="$raw_bytes" -v g="$gzip_bytes" 'BEGIN {
    printf "  nodeagent adds %.1f MB over the base (%.1f MB gzipped; target <= 80 MB)\n", r / 1e6, g / 1e6 }'
