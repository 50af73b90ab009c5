#!/usr/bin/env bash
# First backup, unchanged second backup and restore of the Linux 6.1 source tree with
# cairn alone: wall time, CPU time and peak RSS of each step. (The side-by-side comparison
# with restic, borg and others is issue 6's `bench/` work.)
#
# usage: bench/linux-tree.sh [WORKDIR]     (needs root for apt and drop_caches, or a prepared tree)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cairn-bench}
mkdir -p "$work"
src="$work/linux-src"
if [ ! -d "$src/linux-source-6.1" ]; then
  [ -f /usr/src/linux-source-6.1.tar.xz ] || apt-get install -y linux-source-6.1 >/dev/null
  mkdir -p "$src" && tar xf /usr/src/linux-source-6.1.tar.xz -C "$src"
fi
(cd "$here" && cargo build --release -p cairn-cli -q)
cairn="$here/target/release/cairn"
export CAIRN_PASSWORD=bench CAIRN_REPOSITORY="$work/repo"
rm -rf "$work/repo" "$work/restore"
"$cairn" init -q
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
measure() {
  local name=$1; shift
  /usr/bin/time -f "$name: %e s wall, %U s user, %S s sys, %M KiB peak RSS" "$@" >/dev/null
}
drop; measure "first backup (cold cache)" "$cairn" backup "$src"
measure "unchanged second backup" "$cairn" backup "$src"
drop; measure "restore (cold cache)" "$cairn" restore latest --target "$work/restore"
echo "source: $(du -sb "$src" | cut -f1) bytes in $(find "$src" -type f | wc -l) files"
echo "repository: $(du -sb "$work/repo" | cut -f1) bytes"
diff -r "$src" "$work/restore$src" && echo "restore identical to source"
