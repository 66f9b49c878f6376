#!/usr/bin/env bash
# Builds the images deploy/compose.yml runs, locally, pulling nothing:
#
#   leasehold-node:dev     deploy/Dockerfile: FROM scratch, /usr/local/bin/leasehold and the
#                          shared libraries `ldd` lists for it
#   leasehold-etcd:3.5.16  FROM scratch, /usr/local/bin/etcd and its libraries: the image the
#                          test harness builds, made the same way (built only when missing)
#
#   deploy/images.sh
#
# Idempotent: the node image carries a label with the hash of its files and is rebuilt only
# when they change; the etcd image is left alone when it exists. Each image goes through
# `docker build` with the legacy builder; where that fails, the same rootfs is imported as a
# tarball (`docker import --change 'ENTRYPOINT [...]'`), which needs no builder at all.
#
# Environment:
#   LEASEHOLD_BIN=path            use this leasehold binary instead of running cargo (the
#                                 drill test hands over the one `cargo test` built)
#   LEASEHOLD_PROFILE=release     build the binary with `cargo build --release` instead
#   LEASEHOLD_IMAGE_BUILD=import  skip the builder, always import
#
# Why debug by default: `./deploy/dev.sh test` has already compiled the debug binary, so the
# node image costs no compilation at all; a release build compiles every dependency a second
# time, minutes on a 2-core machine. leasehold spends its time waiting on etcd round trips, so
# a debug build fails over just as fast in a drill. Use LEASEHOLD_PROFILE=release for images
# you ship.
#
# Prints progress on stderr; needs docker, ldd and sha256sum (strip is used when present).
set -euo pipefail

cd "$(dirname "$0")/.."
here=$(pwd)

NODE_IMAGE=leasehold-node:dev
ETCD_VERSION=3.5.16
ETCD_IMAGE=leasehold-etcd:$ETCD_VERSION
LABEL=org.leasehold.content

say() { printf 'images: %s\n' "$*" >&2; }
fail() { printf 'images: %s\n' "$*" >&2; exit 1; }

for tool in docker ldd sha256sum tar; do
  command -v "$tool" >/dev/null || fail "needs $tool on PATH"
done
docker info >/dev/null 2>&1 || fail "Docker is not reachable (docker info failed)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# stage BINARY TARGET ROOTFS: copies BINARY to ROOTFS/TARGET and every library `ldd` lists for
# it to ROOTFS/<the path ldd lists> (links resolved to the files they name).
stage() {
  local binary=$1 target=$2 rootfs=$3 listed library
  listed=$(ldd "$binary") || fail "ldd $binary failed"
  mkdir -p "$rootfs$(dirname "$target")"
  cp -L "$binary" "$rootfs$target"
  # `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, `/lib64/ld-linux-x86-64.so.2 (0x…)`;
  # linux-vdso.so.1 has no path: the kernel provides it.
  while read -r library; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
  done < <(awk '{ p = ($2 == "=>") ? $3 : $1; if (p ~ /^\//) print p }' <<<"$listed")
  [ -n "$(find "$rootfs" -name 'libc.so*' -print -quit)" ] ||
    fail "ldd listed no libc for $binary: is it dynamically linked? ($listed)"
}

# make_image IMAGE CONTEXT ENTRYPOINT USER LABEL: builds CONTEXT (a Dockerfile and rootfs/) as IMAGE,
# or imports CONTEXT/rootfs with the same entry point, user and label.
make_image() {
  local image=$1 context=$2 entrypoint=$3 user=$4 label=$5
  if [ "${LEASEHOLD_IMAGE_BUILD:-}" != import ]; then
    say "building $image (docker build, legacy builder)"
    if DOCKER_BUILDKIT=0 docker build --label "$label" -t "$image" "$context" >&2; then
      return
    fi
    say "docker build failed; importing a rootfs tarball instead"
  fi
  say "importing $image from a rootfs tarball"
  local changes=(--change "ENTRYPOINT [\"$entrypoint\"]" --change "LABEL $label")
  [ -n "$user" ] && changes+=(--change "USER $user")
  tar -C "$context/rootfs" -c . | docker import "${changes[@]}" - "$image" >/dev/null ||
    fail "docker import of $image failed"
}

# --- leasehold-node:dev -------------------------------------------------------------------
bin=${LEASEHOLD_BIN:-}
if [ -z "$bin" ]; then
  command -v cargo >/dev/null || fail "needs cargo to build leasehold (or set LEASEHOLD_BIN)"
  if [ "${LEASEHOLD_PROFILE:-debug}" = release ]; then
    say "cargo build --release --bin leasehold"
    cargo build --quiet --release --bin leasehold >&2
    bin=$here/target/release/leasehold
  else
    say "cargo build --bin leasehold"
    cargo build --quiet --bin leasehold >&2
    bin=$here/target/debug/leasehold
  fi
fi
[ -x "$bin" ] || fail "no leasehold binary at $bin"

node=$work/node
stage "$bin" /usr/local/bin/leasehold "$node/rootfs"
# Debug info is most of a debug binary's size; symbols (and so backtraces) stay.
if command -v strip >/dev/null; then
  strip --strip-debug "$node/rootfs/usr/local/bin/leasehold"
fi
cp deploy/Dockerfile "$node/Dockerfile"
content=$(cd "$node" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
have=$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$NODE_IMAGE" 2>/dev/null || true)
if [ "$have" = "$content" ]; then
  say "$NODE_IMAGE is up to date ($LABEL=$content)"
else
  make_image "$NODE_IMAGE" "$node" /usr/local/bin/leasehold 65534:65534 "$LABEL=$content"
  say "$NODE_IMAGE built from $bin ($LABEL=$content)"
fi

# --- leasehold-etcd:3.5.16 ----------------------------------------------------------------
if docker image inspect "$ETCD_IMAGE" >/dev/null 2>&1; then
  say "$ETCD_IMAGE exists"
else
  etcd=$(bash deploy/fetch-etcd.sh "$ETCD_VERSION")
  stage "$etcd" /usr/local/bin/etcd "$work/etcd/rootfs"
  printf 'FROM scratch\nCOPY rootfs/ /\nENTRYPOINT ["/usr/local/bin/etcd"]\n' >"$work/etcd/Dockerfile"
  make_image "$ETCD_IMAGE" "$work/etcd" /usr/local/bin/etcd "" "$LABEL=etcd-$ETCD_VERSION"
  say "$ETCD_IMAGE built from $etcd"
fi
