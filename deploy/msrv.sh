#!/usr/bin/env bash
# The minimum supported Rust version (`rust-version` in Cargo.toml), checked as far as the
# toolchains at hand allow:
#
# 1. no package in the resolved dependency graph declares a newer `rust-version` (cargo's
#    resolver picks versions that fit it; this keeps a hand-edited Cargo.lock honest);
# 2. clippy's `incompatible_msrv` lint (on in every clippy run of deploy/dev.sh) refuses std
#    APIs newer than it;
# 3. when that exact toolchain is installed (`rustup toolchain install 1.88`), the crate is
#    compiled with it.
set -euo pipefail
cd "$(dirname "$0")/.."

metadata=$(mktemp)
trap 'rm -f "$metadata"' EXIT
cargo metadata --format-version 1 --locked >"$metadata"
python3 - "$metadata" <<'PY'
import json, sys

def version(text):
    return (tuple(int(part) for part in text.split(".")[:3] if part.isdigit()) + (0, 0, 0))[:3]

with open(sys.argv[1]) as f:
    metadata = json.load(f)
ours = next(p for p in metadata["packages"] if p["name"] == "leasehold")
msrv = ours["rust_version"]
newer = [
    f'{p["name"]} {p["version"]} needs Rust {p["rust_version"]}'
    for p in metadata["packages"]
    if p.get("rust_version") and version(p["rust_version"]) > version(msrv)
]
if newer:
    sys.exit(f"msrv: leasehold declares Rust {msrv}, but:\n  " + "\n  ".join(newer))
count = len(metadata["packages"])
print(f"msrv: none of {count} packages needs a Rust newer than {msrv}")
PY

msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
if command -v rustup >/dev/null && rustup toolchain list | grep -q "^${msrv}"; then
  cargo "+${msrv}" check --all-features --all-targets
else
  echo "msrv: Rust ${msrv} itself is not installed; its std APIs are checked by clippy's incompatible_msrv"
fi
