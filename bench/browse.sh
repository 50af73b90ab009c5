#!/usr/bin/env bash
# Browsing the Linux 6.1 source tree with 10 snapshots (each after touching a few files):
# `find '*.c'` across all snapshots, `diff` between two snapshots, and `cp -a` out of a
# FUSE mount against a plain restore.
#
# usage: bench/browse.sh [WORKDIR]     (needs root for apt, drop_caches and FUSE)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cairn-bench}
mkdir -p "$work"
# shellcheck source=bench/lib.sh
source "$here/bench/lib.sh"
src=$(prepare_linux_tree "$work")
cairn=$(build_cairn "$here")
export CAIRN_PASSWORD=bench CAIRN_REPOSITORY="$work/browse-repo"
rm -rf "$work/browse-repo" "$work/restore" "$work/copy"
"$cairn" init -q
tree="$src/linux-source-6.1"
for i in $(seq 10); do
  # A few edits per snapshot, so snapshots differ but share most trees.
  for f in "$tree/README" "$tree/kernel/fork.c" "$tree/drivers/Makefile"; do
    echo "/* edit $i */" >>"$f"
  done
  "$cairn" backup -q "$src"
done
measure "find '*.c' across 10 snapshots" "$cairn" find '*.c'
echo "  matches: $("$cairn" find '*.c' | wc -l)"
first=$("$cairn" snapshots --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
measure "diff first latest" "$cairn" diff "$first" latest
drop_caches; measure "restore latest" "$cairn" restore latest --target "$work/restore"
mnt="$work/mnt"
mkdir -p "$mnt"
"$cairn" mount "$mnt" & pid=$!
for _ in $(seq 100); do [ -e "$mnt/latest" ] && break; sleep 0.1; done
drop_caches; measure "cp -a out of the mount (latest)" cp -a "$mnt/latest/" "$work/copy"
fusermount3 -u "$mnt"; wait "$pid" || true
diff -r "$work/restore$src" "$work/copy$src" >/dev/null && echo "  mount copy identical to restore"
echo "bytes: $(du -sb "$work/restore" | cut -f1)"
rm -rf "$work/restore" "$work/copy"
