#!/usr/bin/env bash
# Fetches a Debian-packaged etcd server with apt and unpacks it, without installing it.
#
#   deploy/fetch-etcd.sh VERSION [DEST]
#
# VERSION is 3.5.16 (the `etcd-server` package of Debian 13 "trixie", leasehold's default
# server) or 3.4.23 (Debian 12 "bookworm", the compatibility target). The package is fetched
# with `apt-get download` under a temporary source list for that suite, from the mirror this
# machine's apt already uses, and unpacked with `dpkg-deb -x` into DEST (default:
# $LEASEHOLD_CACHE_DIR, else $XDG_CACHE_HOME/leasehold, else ~/.cache/leasehold, then
# etcd-VERSION). Nothing is installed system-wide. Prints the path of the etcd binary on stdout;
# progress goes to stderr. Safe to run concurrently: the last step is an atomic rename.
#
# The leasehold test harness runs this same script (embedded at build time) when the binary it
# needs to build an etcd image is missing.
set -euo pipefail

version=${1:?usage: fetch-etcd.sh VERSION [DEST]}
cache=${LEASEHOLD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold}
dest=${2:-$cache/etcd-$version}
bin=$dest/usr/bin/etcd

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

fail() { echo "fetch-etcd: $*" >&2; exit 1; }

case $version in
  3.5.16) suite=trixie ;;
  3.4.23) suite=bookworm ;;
  *) fail "no Debian suite known for etcd $version (known: 3.5.16, 3.4.23)" ;;
esac

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || fail "needs $tool (a Debian-based machine) to fetch etcd $version"
done

# The mirror this machine's apt already uses: deb822 sources first, then the one-line format.
mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
fi
[ -n "$mirror" ] || fail "found no Debian mirror in /etc/apt/sources.list{,.d}"

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || fail "needs $keyring (package debian-archive-keyring)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/archives/partial" "$tmp/unpacked"
echo "deb [signed-by=$keyring] $mirror $suite main" >"$tmp/sources.list"

opts=(
  -o "Dir::Etc::SourceList=$tmp/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$tmp/lists"
  -o "Dir::Cache::Archives=$tmp/archives"
  -o "Debug::NoLocking=1"
)
[ "$(id -u)" = 0 ] && opts+=(-o "APT::Sandbox::User=root")

echo "fetch-etcd: fetching etcd-server $version (Debian $suite)" >&2
apt-get "${opts[@]}" -qq update >&2 || fail "apt-get update for $suite failed"
(cd "$tmp" && apt-get "${opts[@]}" -qq download etcd-server >&2) || fail "apt-get download etcd-server ($suite) failed"

deb=$(ls "$tmp"/etcd-server_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "apt-get download left no etcd-server .deb"
dpkg-deb -x "$deb" "$tmp/unpacked"

got=$("$tmp/unpacked/usr/bin/etcd" --version 2>&1 | awk '/^etcd Version:/ { print $3 }') ||
  fail "the unpacked etcd does not run on this machine: $("$tmp/unpacked/usr/bin/etcd" --version 2>&1 | head -n 1)"
[ "$got" = "$version" ] || fail "Debian $suite ships etcd $got, not $version"

mkdir -p "$(dirname "$dest")"
mv -T "$tmp/unpacked" "$dest" 2>/dev/null || [ -x "$bin" ] || fail "could not move etcd into $dest"
echo "fetch-etcd: etcd $version unpacked into $dest" >&2
echo "$bin"
