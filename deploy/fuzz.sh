#!/usr/bin/env bash
# Fuzzes record decoding (fuzz/fuzz_targets/decode_record.rs) with cargo-fuzz, for a bounded
# time. On demand: CI does not run it.
#
#   ./deploy/fuzz.sh            60 seconds
#   ./deploy/fuzz.sh 300        as many seconds as given
#
# It installs cargo-fuzz if it is missing, and needs only a stable toolchain: with
# `--sanitizer none` cargo-fuzz passes rustc stable flags alone (coverage instrumentation); its
# default, AddressSanitizer, would need the nightly-only -Zsanitizer. Decoding is safe Rust, so
# a sanitizer would find nothing that a panic does not show.
#
# The committed seeds (fuzz/corpus/decode_record) are read, never written: what the run finds
# goes to fuzz/target/corpus/decode_record and is kept for the next run. A crash is written to
# fuzz/artifacts/decode_record/ and fails the script; reproduce it with
#   cargo fuzz run --sanitizer none --debug-assertions decode_record <that file>
set -euo pipefail

cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: $0 [seconds]" >&2; exit 2; }

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

found=fuzz/target/corpus/decode_record
mkdir -p "$found"
cargo fuzz run --sanitizer none --debug-assertions decode_record "$found" fuzz/corpus/decode_record -- \
  -max_total_time="$seconds" -print_final_stats=1
echo "corpus: $(find "$found" -type f | wc -l) inputs found so far in $found," \
  "$(find fuzz/corpus/decode_record -type f | wc -l) seeds"
