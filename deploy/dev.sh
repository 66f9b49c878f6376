#!/usr/bin/env bash
# leasehold's two developer commands.
#
#   ./deploy/dev.sh demo   install what is missing, then the demo (which starts a throwaway etcd)
#   ./deploy/dev.sh test   install what is missing, then format check, clippy, every test
#                          (unit and integration, etcd containers included) and the docs
#
# What it installs when missing: protobuf-compiler (etcd-client's build and the sidecar's
# proto need protoc) and docker-compose (for the deployment drill, cli/tests/deploy_drill.rs),
# system-wide with apt; the etcd 3.5.16 and 3.4.23 binaries (Debian packages, unpacked into
# ~/.cache/leasehold by deploy/fetch-etcd.sh, not installed); and, for the sidecar's Python
# client test, a virtual environment with grpcio (tests/python/requirements.txt) in
# ~/.cache/leasehold/venv. The tests need a running Docker engine and fail,
# loudly, without one.
set -euo pipefail

cd "$(dirname "$0")/.."
here=$(pwd)

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
fail() { printf 'dev.sh: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else fail "need root (or sudo) to run: $*"
  fi
}

ensure_toolchain() {
  command -v cargo >/dev/null || fail "needs a Rust toolchain (cargo) on PATH"
}

ensure_protoc() {
  command -v protoc >/dev/null && return
  say "installing protobuf-compiler (etcd-client's build needs protoc)"
  command -v apt-get >/dev/null || fail "protoc is missing: install protobuf-compiler"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null
}

etcd_binary() {
  bash "$here/deploy/fetch-etcd.sh" "$1"
}

ensure_docker() {
  if command -v docker >/dev/null; then
    docker info >/dev/null 2>&1 ||
      fail "Docker is not reachable (docker info failed): the integration tests run etcd in containers"
  elif [ ! -S "${DOCKER_HOST#unix://}" ] && [ ! -S /var/run/docker.sock ]; then
    fail "no Docker socket found: the integration tests run etcd in containers"
  fi
}

# The deployment drill (deploy/drill.sh, run by cli/tests/deploy_drill.rs) needs docker-compose or
# the `docker compose` plugin.
ensure_compose() {
  command -v docker-compose >/dev/null && return
  docker compose version >/dev/null 2>&1 && return
  say "installing docker-compose (the deployment drill runs deploy/compose.yml)"
  command -v apt-get >/dev/null ||
    fail "neither docker-compose nor \`docker compose\` is available: the deployment drill needs one"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
  command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 ||
    fail "docker-compose is still missing after apt-get install: the deployment drill needs it"
}

# The Python client test of `leasehold serve` (cli/tests/sidecar_python.rs) runs grpcio from a
# virtual environment of its own, made here when missing or out of date.
venv="${HOME}/.cache/leasehold/venv"
ensure_python_venv() {
  local requirements="$here/tests/python/requirements.txt"
  if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements.txt"; then
    return
  fi
  command -v python3 >/dev/null || fail "python3 is missing: the sidecar's Python client test needs it"
  say "a Python virtual environment with grpcio for the sidecar's client test ($venv)"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    command -v apt-get >/dev/null || fail "python3 cannot make a virtual environment: install python3-venv"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$venv/requirements.txt"
}

cmd_demo() {
  ensure_toolchain
  ensure_protoc
  local etcd
  etcd=$(etcd_binary 3.5.16)
  say "building leasehold"
  cargo build --quiet --bin leasehold
  # The demo starts its own throwaway etcd from this binary (data in a temporary directory,
  # removed on exit, also on Ctrl-C).
  say "leasehold demo"
  LEASEHOLD_ETCD_BIN="$etcd" ./target/debug/leasehold demo
}

# A new user's first build resolves the library's dependencies to the newest versions its
# requirements allow, not to Cargo.lock's: a project of one line that depends on it by path, with
# its harness and sidecar, checked with warnings denied (dependencies' own lints stay capped).
check_fresh_resolution() {
  local fresh
  fresh=$(mktemp -d)
  mkdir "$fresh/src"
  echo 'fn main() {}' >"$fresh/src/main.rs"
  cat >"$fresh/Cargo.toml" <<EOF
[package]
name = "leasehold-user"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
leasehold = { path = "$here", features = ["grpc", "testing"] }

[workspace]
EOF
  RUSTFLAGS="-D warnings" CARGO_TARGET_DIR="$here/target/fresh-resolution" \
    cargo check --quiet --manifest-path "$fresh/Cargo.toml" || { rm -rf "$fresh"; return 1; }
  rm -rf "$fresh"
}

# The Python package (python/), as a user gets it: built with maturin and installed into a fresh
# virtual environment (the `leasehold` binary on its PATH), then its checks against that install.
# The binary is built with the dev profile, reusing this run's build; users get a release one.
check_python_package() {
  local venv="$here/target/python-venv" etcd
  etcd=$(etcd_binary 3.5.16)
  rm -rf "$venv"
  python3 -m venv "$venv"
  say "the Python package: pip install ./python[dev] into a fresh virtual environment"
  MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/pip" install --quiet --disable-pip-version-check "./python[dev]"
  [ -x "$venv/bin/leasehold" ] || fail "the package did not install the leasehold binary"
  say "the Python package: its stubs match the proto, mypy --strict"
  (cd python && "$venv/bin/python" generate.py --check && "$venv/bin/mypy")
  say "the Python package: pytest against etcd and the installed leasehold serve"
  # pytest, not python -m pytest: the tests import the installed package, not python/'s source.
  (cd python && PATH="$venv/bin:$PATH" LEASEHOLD_ETCD_BIN="$etcd" \
    LEASEHOLD_ETCD_IMAGE=leasehold-etcd:3.5.16 timeout --kill-after=30 15m "$venv/bin/pytest" -q)
  say "the Python package's benchmark: appends/s against raw stub calls"
  PATH="$venv/bin:$PATH" LEASEHOLD_ETCD_BIN="$etcd" timeout 5m \
    "$venv/bin/python" python/benches/appends.py --rounds 5
}

cmd_test() {
  ensure_toolchain
  ensure_protoc
  say "etcd binaries for the test images"
  etcd_binary 3.5.16 >/dev/null
  etcd_binary 3.4.23 >/dev/null
  ensure_docker
  ensure_compose
  ensure_python_venv

  say "cargo fmt --check"
  cargo fmt --all -- --check
  say "cargo clippy"
  cargo clippy --all-targets --all-features -- -D warnings
  # The library and the tool as users build them: the library with no feature, with the
  # sidecar's, and the tool, each without the test harness.
  cargo clippy -p leasehold --lib -- -D warnings
  cargo clippy -p leasehold --lib --features grpc -- -D warnings
  cargo clippy -p leasehold-cli --bins -- -D warnings
  say "the library as a new user builds it: dependencies resolved afresh, warnings denied"
  check_fresh_resolution
  say "minimum supported Rust version"
  bash deploy/msrv.sh
  say "cargo test (unit and integration; etcd in containers)"
  # Every harness operation is bounded; this bounds the whole run should anything still hang.
  timeout --signal=INT --kill-after=60 45m cargo test --all-features
  say "cargo test: etcd 3.4.23 (Debian 12), the compatibility target"
  # Every behaviour test of the library (lease, journal, host, rig, liveness, security), with
  # their proxy faults (blackholes, dropped replies, resets, a killed member). Not on 3.4: the
  # cluster fault tests and campaign (3-member clusters, leader kills, pauses), the scale and
  # metrics tests, the CLI and harness tests.
  local compat=(harness_single_member harness_namespaces
    lease_epochs lease_release lease_watch_loss lease_standby lease_store_close lease_one_node_lease
    lease_watch_resume lease_no_zombies lease_acquire_unknown lease_acquire_moving lease_shared_writes
    journal_open journal_limits journal_replay journal_retention journal_fencing journal_group_commit
    journal_shared_sessions journal_handover journal_unknown_outcome journal_owner_compare
    journal_idempotency
    host_sessions host_remove host_registry host_registry_finish host_move host_sets host_load
    rig_gc rig_shutdown
    liveness_balance liveness_blip liveness_bounded_tasks liveness_host_recovers liveness_leader_kill
    liveness_resolve_on_loss liveness_shutdown_order liveness_workspace_root
    security_auth security_tls cli_admin sidecar sidecar_writes)
  LEASEHOLD_ETCD_IMAGE=leasehold-etcd:3.4.23 timeout --signal=INT --kill-after=60 15m \
    cargo test --all-features "${compat[@]/#/--test=}"
  say "cargo doc"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --quiet
  check_python_package

  if command -v docker >/dev/null; then
    local leftovers
    leftovers=$(docker ps -aq --filter label=org.leasehold.testing | wc -l)
    [ "$leftovers" = 0 ] || say "warning: $leftovers test containers were left behind (label org.leasehold.testing)"
  fi
  say "all checks passed"
}

case "${1:-}" in
  demo) cmd_demo ;;
  test) cmd_test ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
