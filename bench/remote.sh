#!/usr/bin/env bash
# The Linux 6.1 source tree into a local directory, a Garage S3 node and an OpenSSH
# server, all on this machine: wall time and peak RSS of each command, and the requests
# each one sends (`--stats`). Starts its own servers (scripts/services.sh) on ports
# 39500+ and stops them at the end.
#
# usage: bench/remote.sh [WORKDIR]     (needs root for apt and drop_caches, or a prepared tree)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cairn-bench}
mkdir -p "$work"
# shellcheck source=bench/lib.sh
source "$here/bench/lib.sh"
src=$(prepare_linux_tree "$work")
cairn=$(build_cairn "$here")

services="$work/services"
rm -rf "$services"
"$here/scripts/services.sh" install
trap '"$here/scripts/services.sh" stop "$services"' EXIT
CAIRN_TEST_S3_PORT=39500 CAIRN_TEST_SSH_PORT=39522 CAIRN_TEST_CLUSTER_PORT=39530 \
  "$here/scripts/services.sh" start "$services" >/dev/null
# shellcheck disable=SC1091
source "$services/env"
export PATH="$CAIRN_TEST_SSH_BIN:$PATH" CAIRN_PASSWORD=bench XDG_CACHE_HOME="$work/cache"

# step NAME ARGS...: one cairn command, timed, with its request counts.
step() {
  local name=$1; shift
  local err="$work/stats.err"
  /usr/bin/time -o "$work/time" -f "%e s wall, %M KiB peak RSS" \
    "$cairn" --stats "$@" >/dev/null 2>"$err" || { cat "$err"; exit 1; }
  printf '  %-34s %-28s %s\n' "$name" "$(cat "$work/time")" \
    "$(grep -oE '[0-9]+ \([^)]*\); received.*' "$err" || echo '-')"
}

run() {
  local label=$1 repo=$2
  echo "== $label: $repo"
  export CAIRN_REPOSITORY=$repo
  rm -rf "$work/restore" "$work/cache"
  "$cairn" init -q --pack-size 16M
  drop_caches; step "first backup" backup "$src"
  step "unchanged second backup" backup "$src"
  rm -rf "$work/cache"
  step "unchanged backup, empty cache" backup "$src"
  step "snapshots" snapshots
  step "ls -l latest (cached)" ls -l latest
  drop_caches; step "restore" restore latest --target "$work/restore"
  step "check" check
  diff -r "$src" "$work/restore$src" >/dev/null && echo "  restore identical to source"
  rm -rf "$work/restore"
}

echo "source: $(du -sb "$src" | cut -f1) bytes in $(find "$src" -type f | wc -l) files"
rm -rf "$work/local-repo"
run local "$work/local-repo"
run "S3 (Garage, 1 node)" "$CAIRN_TEST_S3/bench-$(date +%s)"
run "SFTP (OpenSSH)" "$CAIRN_TEST_SFTP/bench-$(date +%s)"
