#!/usr/bin/env bash
# Mutation testing of leasehold's fencing and lease code, with cargo-mutants. On demand: it
# takes an hour or more on 2 cores, so CI does not run it.
#
#   ./deploy/mutants.sh            both stages, then the summary
#   ./deploy/mutants.sh 1          stage 1 only;  ./deploy/mutants.sh 2: stage 2 only, after a 1
#   ./deploy/mutants.sh --list     the mutants it would try, and how many
#
# What it mutates: the transaction builders (acquire, fence, append, guarded deletes,
# `Ownership::guard`), the write path's decision table, validity, the registry's verdict, the
# owner-watch snapshot, and record decoding.
#
# Two stages, so that most mutants cost one unit-test run:
#   1. every mutant against the unit tests (`--lib`: paused tokio time, no etcd);
#   2. the mutants stage 1 missed, against the integration tests that aim at this code (real
#      etcd in containers, so Docker and the etcd image are needed, as for `dev.sh test`).
# It ends with cargo-mutants' own summary line of stage 2 and the totals over both stages:
# caught, missed, unviable and timeouts. A missed mutant is a behaviour no test checks.
#
# Results: mutants.out/ (stage 2; stage 1 is in mutants.out.old/ as cargo-mutants keeps it).
set -euo pipefail

cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

command -v cargo-mutants >/dev/null || {
  say "installing cargo-mutants"
  cargo install --locked cargo-mutants
}

# The code under test, as regexes over the names `cargo mutants --list` prints.
targets=(
  # the append transaction and how its outcome is read; the fence at open
  'src/journal/cas\.rs'
  'src/journal/fence\.rs'
  # acquire: its transaction, its settling, and handing out
  'src/store/acquire\.rs'
  # guarded deletes (release, orphans, GC)
  'src/store/cleanup\.rs:.*(Delete::|perform)'
  'src/lease/ownership\.rs:.*Ownership::(guard|check|is_valid)'
  # the write path's decision table and how it settles
  'src/write\.rs:.*(\bnext\b|Attempt::of|read_once| in send\b)'
  'src/lease/validity\.rs'
  'src/store/registry\.rs:.*(verdict|Registry::observe|Registry::end_acquire)'
  'src/store/owner_watch\.rs:.*(Snapshot::|read_snapshot|put_event|session_of|reconcile)'
  # record decoding
  'src/journal/record\.rs:.*(decode_record|decode_tip|seq_of_key|Reader|:2[67]:)'
)
# The integration tests that aim at that code.
integration=(
  journal_owner_compare journal_fencing journal_open journal_unknown_outcome journal_handover
  journal_limits journal_replay lease_epochs lease_release lease_watch_loss lease_standby
  lease_no_zombies lease_partition_expiry lease_watch_resume lease_acquire_unknown rig_gc
  liveness_resolve_on_loss
)

files=(src/journal/{cas,fence,record}.rs src/store/{acquire,cleanup,registry,owner_watch}.rs
  src/lease/{ownership,validity}.rs src/write.rs)

# (-F alone lets struct-field deletions elsewhere through; --file keeps to the files above.)
args=(--no-shuffle --all-features)
for file in "${files[@]}"; do args+=(-f "$file"); done
for target in "${targets[@]}"; do args+=(-F "$target"); done

if [ "${1:-}" = --list ]; then
  cargo mutants "${args[@]}" --list
  say "$(cargo mutants "${args[@]}" --list | wc -l) mutants"
  exit 0
fi

stage=${1:-all}
if [ "$stage" != 2 ]; then
  say "stage 1: every mutant against the unit tests"
  cargo mutants "${args[@]}" --minimum-test-timeout 60 -C --lib || true
  wc -l <mutants.out/caught.txt >mutants.out/stage1-caught
  [ "$stage" = 1 ] && exit 0
fi
stage1=$(cat mutants.out/stage1-caught 2>/dev/null || cat mutants.out.old/stage1-caught)
bash deploy/fetch-etcd.sh 3.5.16 >/dev/null

say "stage 2: what stage 1 missed, against the integration tests"
# (-C: for the build as well as the test run, so that only these test binaries are built.)
tests=(-C --lib)
for test in "${integration[@]}"; do tests+=(-C --test -C "$test"); done
status=0
cargo mutants "${args[@]}" --iterate --minimum-test-timeout 120 "${tests[@]}" || status=$?

say "summary"
for kind in caught missed unviable timeout; do
  printf '%-9s %s\n' "$kind" "$(wc -l <"mutants.out/$kind.txt")"
done
printf 'caught by unit tests alone in stage 1: %s\n' "$stage1"
if [ -s mutants.out/missed.txt ]; then
  say "missed mutants (behaviour no test checks)"
  cat mutants.out/missed.txt
fi
exit "$status"
