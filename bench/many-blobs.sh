#!/usr/bin/env bash
# Memory of a repository holding millions of blobs: the index must fit in 48 bytes a blob.
#
# Makes a repository with the smallest chunks cairn allows (64 B min, 256 B average, 1 KiB
# max) from generated incompressible data streamed through `backup --stdin` (no source
# files on disk), in backups of about 2 million blobs each, then measures the peak RSS of
#   - backups adding about a million new blobs: from 1,000 files in 1,000 directories
#     (310 MB under WORKDIR/dirs, the usual shape), and as one file from stdin (its tree
#     then holds a million chunk references);
#   - a backup adding 10,000 (what loading and holding the index costs);
#   each undone afterwards (its snapshot, index files and packs are removed, so every
#   binary measures the same repository),
#   - an unchanged backup (the first stream again: every blob is already there),
#   - check.
# With COMPARE=/path/to/other/cairn, each step also runs with that binary (e.g. an older
# build, to compare indexes); both must read the same repository format.
#
# usage: bench/many-blobs.sh [WORKDIR] [BACKUPS]    (BACKUPS of ~2M blobs each; default 5)
# The repository takes about 0.35 GB per million blobs; it is deleted at the end
# (KEEP=1 keeps it, and a second run with KEEP=1 reuses it).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/cairn-bench}
backups=${2:-5}
mkdir -p "$work"
# shellcheck source=bench/lib.sh
source "$here/bench/lib.sh"
cairn=${CAIRN:-$(build_cairn "$here")}
repo="$work/many-blobs-repo"
export CAIRN_PASSWORD=bench CAIRN_REPOSITORY="$repo"

# Bytes that make about this many blobs: with these limits, fastcdc's chunks of random
# data average about 310 bytes.
bytes_for() { echo $(($1 * 310)); }

# stream SEED BYTES: deterministic incompressible bytes (AES-CTR of zeros).
stream() {
  # openssl ends on SIGPIPE when head has enough, which is no failure.
  { openssl enc -aes-128-ctr -nosalt -pbkdf2 -iter 1 -pass "pass:$1" -in /dev/zero 2>/dev/null ||
    true; } | head -c "$2"
}

blobs_added() { python3 -c 'import json,sys; print(json.load(sys.stdin)["blobs_added"])'; }

# Resumable: a run stopped while making the repository goes on from the next backup.
if [ ! -f "$work/many-blobs-made" ]; then
  [ -f "$repo/config" ] ||
    "$cairn" init -q --chunk-min 64 --chunk-avg 256 --chunk-max 1K --compression none
  for i in $(seq $(($(find "$repo/snapshots" -type f 2>/dev/null | wc -l) + 1)) "$backups"); do
    added=$(stream "seed-$i" "$(bytes_for 2000000)" |
      "$cairn" backup --json --stdin --stdin-filename "stream-$i" | blobs_added)
    echo "backup $i: $added blobs added"
  done
  touch "$work/many-blobs-made"
fi
echo "repository: $(du -sh "$repo" | cut -f1), $(find "$repo/index" -type f | wc -l) index files"

# undo_since LISTING: removes every file of the repository that LISTING (sorted) does not
# name, undoing a backup.
undo_since() {
  comm -13 "$1" <(find "$repo" -type f | sort) | xargs -r rm -f
}

# undone NAME CMD...: measures CMD (as `measure` does), then undoes what it added.
undone() {
  local listing
  listing=$(mktemp)
  find "$repo" -type f | sort >"$listing"
  measure "$@"
  undo_since "$listing"
  rm -f "$listing"
}

# new_backup LABEL BIN BLOBS: measures a backup of BLOBS new blobs from stdin, then undoes it.
new_backup() {
  stream "new-$3" "$(bytes_for "$3")" |
    undone "$1: backup adding $3 blobs" "$2" backup -q --stdin --stdin-filename "new-$3"
}

# About a million new blobs as the usual shape of a backup: many files in many
# directories (1,000 directories of one 310,000-byte file), made once under $work/dirs.
dirs="$work/dirs"
if [ ! -d "$dirs" ]; then
  mkdir -p "$dirs.tmp"
  stream new-dirs "$(bytes_for 1000000)" | (cd "$dirs.tmp" && split -b 310000 -a 4 -d - f)
  for f in "$dirs.tmp"/f*; do mkdir "$f.d" && mv "$f" "$f.d/"; done
  mv "$dirs.tmp" "$dirs"
fi

run_steps() {
  local label=$1 bin=$2
  undone "$label: backup adding ~1M blobs in 1,000 directories" "$bin" backup -q "$dirs"
  new_backup "$label" "$bin" 1000000
  new_backup "$label" "$bin" 10000
  stream seed-1 "$(bytes_for 2000000)" |
    measure "$label: unchanged backup (~2M blobs, all known)" \
      "$bin" backup -q --stdin --stdin-filename stream-1
  measure "$label: check" "$bin" check -q
}

run_steps "$cairn" "$cairn"
if [ -n "${COMPARE:-}" ]; then
  run_steps "$COMPARE" "$COMPARE"
fi
[ -n "${KEEP:-}" ] || rm -rf "$repo" "$work/many-blobs-made" "$dirs"
