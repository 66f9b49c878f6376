#!/usr/bin/env bash
# Mutation testing of leasehold's fencing and lease code, with cargo-mutants. On demand: on 2
# cores stage 1 takes some 40 minutes and stage 2 about 80 s a survivor, so CI does not run it.
#
#   ./deploy/mutants.sh            both stages, then the summary
#   ./deploy/mutants.sh 1          stage 1 only;   ./deploy/mutants.sh 2   stage 2 only (after a 1)
#   ./deploy/mutants.sh missed     stage 2 again, for what the last stage 2 missed (after adding
#                                  tests; the mutated code must not have moved since stage 1)
#   ./deploy/mutants.sh --list     the mutants it would try, and how many
#
#   MUTANTS_FILES="src/store/acquire.rs" ./deploy/mutants.sh
#                                  only those of the files below (both stages), with results
#                                  under target/mutants/only/: a file again after a new test
#
# What it mutates: the transaction builders (acquire, fence, append, guarded deletes,
# `Ownership::guard`), the write path's decision table, validity, the registry's verdict, the
# owner-watch snapshot, the keepalive driver's step machine, the backoff, and record decoding.
#
# It mutates the last commit (HEAD, or $MUTANTS_REV), in a git worktree of its own under target/mutants/tree
# (mutated in place there, with its own build directory), never your working tree.
#
# Two stages, so that most mutants cost one unit-test run:
#   1. every mutant against the unit tests (`--lib`: paused tokio time, no etcd);
#   2. each mutant stage 1 missed, against the integration tests that aim at its code (real
#      etcd in containers, so Docker and the etcd image are needed, as for `dev.sh test`).
# It ends with one summary line over both stages: caught, missed, unviable and timeouts, and
# lists what was missed. A missed mutant is a behaviour no test checks.
#
# Results: target/mutants/stage1/ and target/mutants/stage2-<group>/ (cargo-mutants' own
# mutants.out/ directories in each).
set -euo pipefail

cd "$(dirname "$0")/.."
here=$(pwd)
out=$here/target/mutants
tree=$out/tree
# (A run of some files keeps its results apart from the full run's, in a worktree of its own.)
[ -n "${MUTANTS_FILES:-}" ] && out=$out/only && tree=$out/tree

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

command -v cargo-mutants >/dev/null || {
  say "installing cargo-mutants"
  cargo install --locked cargo-mutants
}

files=(src/journal/{cas,fence,record}.rs src/journal/queue/mod.rs
  src/store/{acquire,cleanup,registry,owner_watch,renewal}.rs src/lease/{ownership,validity}.rs
  src/etcd/write.rs src/backoff.rs src/host/load.rs)
# The code under test, as regexes over the names `cargo mutants --list` prints.
targets=(
  # the append transaction and how its outcome is read; the fence at open
  'src/journal/cas\.rs'
  'src/journal/fence\.rs'
  # the store's append queue: which calls go into which transaction, what each is told
  'src/journal/queue/mod\.rs:.*(take|finish|settle|refusal|coalesce|join)'
  # acquire: its transaction, its settling, and handing out
  'src/store/acquire\.rs'
  # guarded deletes (release, orphans, GC)
  'src/store/cleanup\.rs:.*(Delete::|perform)'
  'src/lease/ownership\.rs:.*Ownership::(guard|check|is_valid)'
  # the write path's decision table and how it settles
  'src/etcd/write\.rs:.*(\bnext\b|Attempt::of|read_once|read_attempts|read_again| in send\b|Pacing.*::resend|Sending.*::(new|failed))'
  'src/lease/validity\.rs'
  'src/store/registry\.rs:.*(verdict|Registry::observe|Registry::end_acquire)'
  'src/store/owner_watch\.rs:.*(Snapshot::|read_snapshot|put_event|session_of|reconcile)'
  # the keepalive driver's step machine (hedging, re-opens, renewal anchoring, loss verdicts)
  'src/store/renewal\.rs'
  # the pauses between retries
  'src/backoff\.rs'
  # record decoding
  'src/journal/record\.rs:.*(decode_record|decode_tip|seq_of_key|Reader|:2[67]:)'
  # the balance by load: the smoothing, the targets, the plan, the shed order
  'src/host/load\.rs'
)
if [ -n "${MUTANTS_FILES:-}" ]; then
  read -r -a only <<<"$MUTANTS_FILES"
  keep() { local item=$1 file; for file in "${only[@]}"; do [[ $item == "$file"* ]] && return 0; done; return 1; }
  kept=(); for file in "${files[@]}"; do keep "$file" && kept+=("$file"); done
  [ ${#kept[@]} -gt 0 ] || { say "MUTANTS_FILES names none of: ${files[*]}"; exit 2; }
  files=("${kept[@]}")
  kept=(); for target in "${targets[@]}"; do keep "${target//\\/}" && kept+=("$target"); done
  targets=("${kept[@]}")
fi
# Stage 2's groups: a file pattern, and the integration tests that aim at that code.
groups=(
  "journal|src/journal/|journal_owner_compare journal_fencing journal_group_commit journal_shared_sessions journal_open journal_unknown_outcome journal_handover journal_limits journal_replay liveness_resolve_on_loss"
  "acquire|src/store/acquire|lease_acquire_moving lease_acquire_unknown lease_epochs lease_standby lease_release lease_keepalive journal_nospace security_auth host_move host_registry_finish"
  "cleanup|src/store/cleanup|lease_release lease_acquire_unknown rig_gc rig_shutdown"
  "ownership|src/lease/ownership|journal_owner_compare rig_gc journal_fencing"
  "write|src/etcd/write|journal_unknown_outcome liveness_resolve_on_loss lease_acquire_unknown rig_gc write_failover security_auth"
  "validity|src/lease/validity|lease_keepalive lease_partition_expiry lease_no_zombies"
  "registry|src/store/registry|lease_watch_loss lease_acquire_unknown lease_epochs lease_standby lease_watch_resume"
  "watch|src/store/owner_watch|lease_watch_resume lease_watch_loss lease_standby lease_acquire_unknown"
  "renewal|src/store/renewal|lease_keepalive lease_partition_expiry lease_cluster_faults liveness_blip liveness_leader_kill"
  "backoff|src/backoff|write_failover lease_watch_loss liveness_host_recovers"
  "load|src/host/load|host_load"
)

args=(--no-shuffle)
# Stage 1 builds the library's unit tests alone (the mutated code needs no `grpc`); stage 2
# every feature, and the whole workspace (a group's tests may be the tool's, cli/tests/, which
# run the binary).
unit=(--features testing --test-package leasehold)
integration=(--all-features --test-workspace=true)
# No debug info: each mutant's build and link is the most of what it costs.
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0
# (-F alone lets struct-field deletions elsewhere through; --file keeps to the files above.)
for file in "${files[@]}"; do args+=(-f "$file"); done

if [ "${1:-}" = --list ]; then
  for target in "${targets[@]}"; do args+=(-F "$target"); done
  cargo mutants "${args[@]}" "${unit[@]}" --list
  say "$(cargo mutants "${args[@]}" "${unit[@]}" --list | wc -l) mutants"
  exit 0
fi

# The worktree: HEAD (or $MUTANTS_REV), checked out afresh; its build directory is kept.
rev=$(git rev-parse "${MUTANTS_REV:-HEAD}")
if [ ! -e "$tree/.git" ]; then
  rm -rf "$tree"
  git worktree prune
  git worktree add --detach "$tree" "$rev" >/dev/null
fi
git -C "$tree" checkout --quiet --detach --force "$rev"
say "mutating $(git -C "$tree" log --oneline -1)"
cd "$tree"
inplace=(--in-place)

stage=${1:-all}
if [ "$stage" = all ] || [ "$stage" = 1 ]; then
  say "stage 1: every mutant against the unit tests"
  stage1=("${args[@]}" "${unit[@]}")
  for target in "${targets[@]}"; do stage1+=(-F "$target"); done
  rm -rf "$out/stage1"
  # (-C: for the build as well as the test run, so that only the unit tests are built.)
  cargo mutants "${stage1[@]}" "${inplace[@]}" -o "$out/stage1" --minimum-test-timeout 60 \
    -C --lib || true
  [ "$stage" = 1 ] && exit 0
fi

bash "$here/deploy/fetch-etcd.sh" 3.5.16 >/dev/null
first=$out/stage1/mutants.out
# What stage 2 tries: stage 1's survivors, or with `missed` the last stage 2's.
survivors=$out/survivors.txt
if [ "$stage" = missed ]; then
  cat "$out"/stage2-*/mutants.out/missed.txt >"$survivors.next" 2>/dev/null || true
  # What stage 2 caught before (a hang that timed out counts as caught) stays caught.
  cat "$out"/stage2-*/mutants.out/caught.txt "$out"/stage2-*/mutants.out/timeout.txt \
    >>"$out/caught-earlier.txt" 2>/dev/null || true
  mv "$survivors.next" "$survivors"
else
  cp "$first/missed.txt" "$survivors"
  rm -f "$out/caught-earlier.txt"
fi
rm -rf "$out"/stage2-*
for group in "${groups[@]}"; do
  IFS='|' read -r name pattern tests <<<"$group"
  # This group's survivors of stage 1, each as an exact regex.
  selected=()
  while IFS= read -r mutant; do
    selected+=(-F "^$(printf '%s' "$mutant" | sed 's/[][\.|$(){}?+*^]/\\&/g')\$")
  done < <(grep "^$pattern" "$survivors" || true)
  [ ${#selected[@]} -eq 0 ] && continue
  say "stage 2, $name: $(( ${#selected[@]} / 2 )) mutants against: $tests"
  build=(-C --lib)
  for test in $tests; do build+=(-C --test -C "$test"); done
  cargo mutants "${args[@]}" "${integration[@]}" "${selected[@]}" "${inplace[@]}" --baseline skip \
    --timeout 300 -o "$out/stage2-$name" "${build[@]}" || true
done

# A survivor of a file no group names has no integration tests to try: it stays missed.
ungrouped=$(cat "$survivors")
for group in "${groups[@]}"; do
  IFS='|' read -r _ pattern _ <<<"$group"
  ungrouped=$(printf '%s\n' "$ungrouped" | grep -v "^$pattern" || true)
done

say "summary"
# (A file not written, e.g. no earlier catches, counts 0: not a failure of the pipeline.)
count() { cat "$@" 2>/dev/null | wc -l || true; }
missed=$(cat "$out"/stage2-*/mutants.out/missed.txt 2>/dev/null || true)
if [ -n "$ungrouped" ]; then
  missed=$(printf '%s\n%s' "$missed" "$ungrouped" | grep . || true)
fi
caught=$(( $(count "$first/caught.txt") + $(count "$out"/stage2-*/mutants.out/caught.txt) \
  + $(count "$out/caught-earlier.txt") ))
timeouts=$(( $(count "$first/timeout.txt") + $(count "$out"/stage2-*/mutants.out/timeout.txt) ))
unviable=$(count "$first/unviable.txt")
total=$(( $(count "$first/caught.txt") + $(count "$first/missed.txt") + unviable + $(count "$first/timeout.txt") ))
printf 'mutants: %s tested, %s caught (%s by unit tests alone), %s missed, %s unviable, %s timeouts\n' \
  "$total" "$caught" "$(count "$first/caught.txt")" "$(printf '%s' "$missed" | grep -c . || true)" \
  "$unviable" "$timeouts"
if [ -n "$missed" ]; then
  say "missed mutants (behaviour no test checks)"
  printf '%s\n' "$missed"
  exit 1
fi
