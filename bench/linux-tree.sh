#!/usr/bin/env bash
# First backup, unchanged second backup and restore of the Linux 6.1 source tree with
# cairn alone: wall time, CPU time and peak RSS of each step. (bench/compare.sh runs the
# same steps side by side with restic, borg, rustic, bupstash and conserve.)
#
# usage: bench/linux-tree.sh [WORKDIR]     (needs root for apt and drop_caches, or a prepared tree)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cairn-bench}
mkdir -p "$work"
# shellcheck source=bench/lib.sh
source "$here/bench/lib.sh"
src=$(prepare_linux_tree "$work")
cairn=$(build_cairn "$here")
export CAIRN_PASSWORD=bench CAIRN_REPOSITORY="$work/repo"
rm -rf "$work/repo" "$work/restore"
"$cairn" init -q
drop_caches; measure "first backup (cold cache)" "$cairn" backup "$src"
measure "unchanged second backup" "$cairn" backup "$src"
drop_caches; measure "restore (cold cache)" "$cairn" restore latest --target "$work/restore"
echo "source: $(du -sb "$src" | cut -f1) bytes in $(find "$src" -type f | wc -l) files"
echo "repository: $(du -sb "$work/repo" | cut -f1) bytes"
diff -r "$src" "$work/restore$src" && echo "restore identical to source"
