#!/usr/bin/env bash
# A failover drill on deploy/compose.yml: kill one leasehold node and time the takeover.
#
#   deploy/drill.sh [-p PROJECT] [-k NODE]
#
# 1. builds the images (deploy/images.sh; set LEASEHOLD_BIN to skip cargo);
# 2. brings the compose project up under a project name of its own (default
#    leasehold-drill-PID), so parallel drills do not collide;
# 3. waits until every session is owned by exactly one node, the shares are even, and
#    every owned session has a heartbeat appended under its current epoch;
# 4. `docker kill`s NODE (default node-2): SIGKILL, no handover;
# 5. watches the other nodes' logs (Docker's timestamps) and prints, for each session the
#    killed node held, which node acquired it and how long after the kill, and the first
#    heartbeat appended under the new epoch.
#
# Exits 0 only when every session of the killed node was acquired by another node within the
# node's TTL + 2 s, and appended to under its new epoch. The project is always removed
# (`down -v`), also on failure and on Ctrl-C. Every wait has a timeout; with the binary already
# built the drill takes 15 to 30 s. Results go to stdout, progress to stderr:
#
#   moved session=… from=node-2 epoch=… to=node-1 epoch=… after=4.512s appended_after=4.533s
#   drill: passed: 4 sessions of node-2 moved within 7.0s (slowest 4.901s)
#
# Only the Docker engine of this machine and the project's own network are involved (the log
# timestamps and the kill instant are read from the same clock). Needs docker and
# docker-compose (or `docker compose`).
set -euo pipefail

cd "$(dirname "$0")/.."

project=leasehold-drill-$$
victim=node-2
while getopts "p:k:h" opt; do
  case $opt in
    p) project=$OPTARG ;;
    k) victim=$OPTARG ;;
    *) sed -n '2,4p' "$0" >&2; exit 2 ;;
  esac
done

file=deploy/compose.yml
nodes=(node-1 node-2 node-3)
# How long each phase may take.
UP_TIMEOUT=120
OWNED_TIMEOUT=90
# After the bound has passed, keep watching this long, to report late moves with their times.
LATE_WATCH=5
DOWN_TIMEOUT=90

started=$(date +%s)
say() { printf '[drill %3ss] %s\n' "$(($(date +%s) - started))" "$*" >&2; }
fail() { say "FAILED: $*"; echo "drill: FAILED: $*"; exit 1; }

if command -v docker-compose >/dev/null; then
  compose_cmd=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
else
  echo "drill: FAILED: needs docker-compose (or the docker compose plugin) on PATH" >&2
  echo "drill: FAILED: needs docker-compose (or the docker compose plugin) on PATH"
  exit 1
fi
compose() { "${compose_cmd[@]}" -p "$project" -f "$file" "$@"; }

command -v docker >/dev/null || fail "needs docker on PATH"
timeout 30 docker info >/dev/null 2>&1 || fail "Docker is not reachable (docker info failed)"
[[ " ${nodes[*]} " == *" $victim "* ]] || fail "no node $victim in $file (nodes: ${nodes[*]})"

say "building images"
timeout 600 bash deploy/images.sh || fail "deploy/images.sh failed"

up=false
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if $up; then
    say "removing project $project (down -v)"
    timeout "$DOWN_TIMEOUT" "${compose_cmd[@]}" -p "$project" -f "$file" down -v --remove-orphans -t 10 \
      >/dev/null 2>&1 || say "warning: down -v of project $project failed; remove it by hand"
  fi
  say "done in $(($(date +%s) - started))s (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

say "bringing up project $project"
up=true
timeout "$UP_TIMEOUT" "${compose_cmd[@]}" -p "$project" -f "$file" up -d >&2 ||
  fail "compose up failed (or took over ${UP_TIMEOUT}s)"

declare -A cid
for n in "${nodes[@]}"; do
  cid[$n]=$(timeout 30 "${compose_cmd[@]}" -p "$project" -f "$file" ps -q "$n")
  [ -n "${cid[$n]}" ] || fail "no container for $n"
done

# The value of FLAG in the victim's command line (`--flag value` or `--flag=value`).
arg_of() {
  timeout 30 docker inspect -f '{{range .Args}}{{println .}}{{end}}' "${cid[$victim]}" |
    awk -v flag="$1" -v fallback="$2" '
      take { print; found = 1; exit }
      $0 == flag { take = 1 }
      index($0, flag "=") == 1 { print substr($0, length(flag) + 2); found = 1; exit }
      END { if (!found) print fallback }'
}
ttl=$(arg_of --ttl 10)
sessions=$(arg_of --sessions 0)
[[ $ttl =~ ^[0-9]+$ && $sessions =~ ^[0-9]+$ && $sessions -gt 0 ]] ||
  fail "cannot read --ttl ($ttl) and --sessions ($sessions) from $victim's command"
bound=$((ttl + 2))
# Every node's share: the sessions divided by the nodes, some taking one more when it does not divide.
share_lo=$((sessions / ${#nodes[@]}))
share_hi=$(((sessions + ${#nodes[@]} - 1) / ${#nodes[@]}))

# The logs of the given nodes with Docker's timestamps, one line each:
#   2026-01-01T00:00:00.123456789Z [   0.512s] node-1 acquired session=… epoch=…
logs() {
  local n
  for n in "$@"; do
    timeout 30 docker logs --timestamps "${cid[$n]}" 2>&1 || true
  done
}

# The awk functions that read those lines: seconds since the epoch of a Docker timestamp
# (UTC, RFC 3339 with up to nanoseconds), and the fields of one node line.
AWK_LIB='
function secs(ts,    y, mo, d, era, yoe, doy, doe) {
  y = substr(ts, 1, 4) + 0; mo = substr(ts, 6, 2) + 0; d = substr(ts, 9, 2) + 0
  y -= (mo <= 2); era = int(y / 400); yoe = y - era * 400
  doy = int((153 * (mo > 2 ? mo - 3 : mo + 9) + 2) / 5) + d - 1
  doe = yoe * 365 + int(yoe / 4) - int(yoe / 100) + doy
  sub(/Z$/, "", ts)
  return (era * 146097 + doe - 719468) * 86400 + substr(ts, 12, 2) * 3600 + substr(ts, 15, 2) * 60 + substr(ts, 18)
}
# Sets ts, node, ev, s (session), e (epoch); returns 0 for lines that are not node events.
function parse(line,    rest, n, f, i) {
  ts = ""; node = ""; ev = ""; s = ""; e = ""
  if (line !~ /^[0-9]+-[0-9]+-[0-9]+T[^ ]* \[ *[0-9.]+s\] /) return 0
  ts = substr(line, 1, index(line, " ") - 1)
  rest = line; sub(/^[^]]*\] /, "", rest)
  n = split(rest, f, " ")
  node = f[1]; ev = f[2]
  for (i = 3; i <= n; i++) {
    if (f[i] ~ /^session=/) s = substr(f[i], 9)
    else if (f[i] ~ /^epoch=/) e = substr(f[i], 7)
  }
  return s != ""
}'

# What the nodes' logs say they own now: `SESSION NODE EPOCH APPENDED(0|1)`, one per line.
owners() {
  logs "${nodes[@]}" | awk "$AWK_LIB"'
    !parse($0) { next }
    ev == "acquired" { own[node, s] = e; next }
    ev == "appended" { appended[node, s, e] = 1; next }
    ev == "lost" || ev == "released" || ev == "release" || ev == "gave" { delete own[node, s] }
    END {
      for (k in own) {
        split(k, p, SUBSEP)
        print p[2], p[1], own[k], ((p[1], p[2], own[k]) in appended) ? 1 : 0
      }
    }'
}

shares=$share_lo; [ "$share_lo" = "$share_hi" ] || shares="$share_lo to $share_hi"
say "waiting for $sessions sessions to be owned, $shares per node, each appended to (ttl ${ttl}s)"
deadline=$(($(date +%s) + OWNED_TIMEOUT))
while :; do
  state=$(owners)
  verdict=$(awk -v want="$sessions" -v lo="$share_lo" -v hi="$share_hi" -v nodes="${nodes[*]}" '
    { held[$1]++; per[$2]++; if (!$4) unappended++ }
    END {
      for (s in held) { distinct++; if (held[s] > 1) doubled++ }
      split(nodes, ns, " ")
      for (i in ns) if (per[ns[i]] + 0 < lo || per[ns[i]] + 0 > hi) uneven = uneven " " ns[i] "=" per[ns[i]] + 0
      if (distinct + 0 != want || doubled || unappended || uneven != "")
        printf "%d/%d sessions owned, %d owned twice, %d not yet appended to, shares:%s\n",
          distinct, want, doubled, unappended, (uneven == "" ? " even" : uneven)
    }' <<<"$state")
  [ -z "$verdict" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    logs "${nodes[@]}" | grep -v ' appended ' | tail -n 40 >&2 || true
    fail "sessions not all owned after ${OWNED_TIMEOUT}s: $verdict"
  fi
  sleep 0.5
done
say "all $sessions sessions owned: $(awk '{ print $2 }' <<<"$state" | sort | uniq -c | awk '{ printf "%s%s=%s", sep, $2, $1; sep = " " }')"

# The victim's sessions and epochs.
mapfile -t held < <(awk -v victim="$victim" '$2 == victim { print $1, $3 }' <<<"$state" | sort)
[ "${#held[@]}" -gt 0 ] || fail "$victim owns no session"

survivors=()
for n in "${nodes[@]}"; do [ "$n" = "$victim" ] || survivors+=("$n"); done

say "killing $victim (SIGKILL), which holds ${#held[@]} sessions; bound ttl+2s = ${bound}s"
killed_at=$(date -u +%s.%N)
timeout 30 docker kill "${cid[$victim]}" >/dev/null || fail "docker kill $victim failed"
echo "killed $victim at $(date -u -d "@$killed_at" +%Y-%m-%dT%H:%M:%S.%NZ): ${#held[@]} sessions, ttl ${ttl}s, bound ${bound}s"

# For each of the victim's sessions: the first acquisition by a survivor after the kill and
# the first append under that epoch, as seconds after the kill.
moves() {
  logs "${survivors[@]}" | awk -v t0="$killed_at" -v victim="$victim" -v held="$(printf '%s\n' "${held[@]}")" "$AWK_LIB"'
    BEGIN {
      n = split(held, lines, "\n")
      for (i = 1; i <= n; i++) if (split(lines[i], f, " ") == 2) { old[f[1]] = f[2]; order[++count] = f[1] }
    }
    !parse($0) { next }
    { t = secs(ts) - t0 }
    t < 0 || !(s in old) { next }
    ev == "acquired" && !(s in to) { to[s] = node; epoch[s] = e; after[s] = t; next }
    ev == "appended" && (s in to) && node == to[s] && e == epoch[s] && !(s in app) { app[s] = t }
    END {
      for (i = 1; i <= count; i++) {
        s = order[i]
        if (s in to)
          printf "moved session=%s from=%s epoch=%s to=%s epoch=%s after=%.3fs appended_after=%s\n",
            s, victim, old[s], to[s], epoch[s], after[s], (s in app) ? sprintf("%.3fs", app[s]) : "none"
        else
          printf "stayed session=%s from=%s epoch=%s (no other node acquired it)\n", s, victim, old[s]
      }
    }'
}

say "watching ${survivors[*]} for the takeover"
watch_until=$(awk -v t="$killed_at" -v b="$bound" -v l="$LATE_WATCH" 'BEGIN { printf "%.3f", t + b + l }')
while :; do
  result=$(moves)
  if ! grep -q -e '^stayed' -e 'appended_after=none' <<<"$result"; then
    break
  fi
  if awk -v now="$(date -u +%s.%N)" -v until="$watch_until" 'BEGIN { exit !(now >= until) }'; then
    break
  fi
  sleep 0.25
done

echo "$result"
verdict=$(awk -v bound="$bound" -v victim="$victim" -v watch="$LATE_WATCH" '
  /^stayed/ { stayed++ }
  /^moved/ {
    bad = 0
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^after=/) { t = substr($i, 7) + 0; if (t > slowest) slowest = t; if (t > bound) { late++; bad = 1 } }
      if ($i == "appended_after=none") { silent++; bad = 1 }
    }
    moved++; failed += bad
  }
  END {
    total = moved + stayed
    if (stayed || late || silent) {
      why = ""
      if (stayed) why = why sprintf("; %d not acquired by any other node within %ss of the kill", stayed, bound + watch)
      if (late) why = why sprintf("; %d moved later than ttl+2s = %ss (slowest %.3fs)", late, bound, slowest)
      if (silent) why = why sprintf("; %d acquired but not appended to under the new epoch", silent)
      printf "FAILED: %d of the %d sessions of %s did not move in time%s\n", stayed + failed, total, victim, why
    } else
      printf "passed: %d sessions of %s moved within %ss (slowest %.3fs)\n", moved, victim, bound, slowest
  }' <<<"$result")
case $verdict in
  passed:*)
    echo "drill: $verdict"
    say "$verdict"
    ;;
  *)
    logs "${survivors[@]}" | grep -v ' appended ' | tail -n 40 >&2 || true
    fail "${verdict#FAILED: }"
    ;;
esac
