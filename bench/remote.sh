#!/usr/bin/env bash
# The Linux 6.1 source tree into a local directory, a Garage S3 node, an OpenSSH server
# and a `cairn serve` (REST, plain HTTP on loopback), all on this machine: wall time and
# peak RSS of each command, and the requests each one sends (`--stats`); for `cairn
# serve`, the server's own peak RSS too. Starts its own servers (scripts/services.sh) on
# ports 39500+ and stops them at the end.
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
server_pid=
stop_all() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  "$here/scripts/services.sh" stop "$services"
}
trap stop_all EXIT
CAIRN_TEST_S3_PORT=29500 CAIRN_TEST_SSH_PORT=29522 CAIRN_TEST_S3_CLUSTER_PORT=29530 \
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

# cairn serve: the same machine, plain HTTP on loopback, one maintain token (backup,
# restore and check need no more). GNU time reports the server's peak RSS when it ends.
served="$work/served"
rm -rf "$served" && mkdir -p "$served"
token=$("$cairn" serve --dir "$served" token add bench --repo bench --rights maintain | awk '{print $NF}')
/usr/bin/time -o "$work/server-time" -f "%M KiB peak RSS" \
  "$cairn" serve --dir "$served" --listen 127.0.0.1:0 >"$work/server.out" 2>"$work/server.log" &
timer_pid=$!
for _ in $(seq 50); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
address=$(awk '/listening on/ {print $NF}' "$work/server.out")
server_pid=$(pgrep -P "$timer_pid" | head -1)
export CAIRN_REST_TOKEN=$token
run "cairn serve (REST, loopback)" "rest:$address/bench"
kill "$server_pid"; server_pid=
wait "$timer_pid" 2>/dev/null || true
echo "  server: $(tail -1 "$work/server-time")"
