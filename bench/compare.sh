#!/usr/bin/env bash
# cairn beside restic, borg, rustic, bupstash, conserve and vykar on two corpora, in one
# run, each tool at its defaults (encryption on where the tool has it: conserve has
# none). The corpora: the Linux 6.1 source tree (small compressible files), and a mixed
# tree of mostly incompressible files, photos, videos, disk images, zip and office files,
# with some CSV, XML and logs (bench/corpus.py, about 1.1 GB, the same bytes every run).
#
# For each corpus: every tool's init and first backup (page cache dropped) into a new
# repository, three times, the tools taking turns, the median run counting and the last
# run's repository kept. Then for each tool: an unchanged second backup (the median of
# five runs), a backup after in-place changes (bench/corpus.py change: overwritten
# ranges, appends, new files); then the tree goes back as it was for the next tool.
# Then every tool restores its last snapshot into an empty directory (page cache
# dropped), three times, the tools taking turns, and the median run counts;
# each restored tree is checked against the source with `diff -r --no-dereference`. Wall
# time (to the millisecond), CPU time (user+sys) and peak RSS come from
# crates/core/examples/timed.rs; repository size from
# `du -sb`. Rows for cairn alone: a plain parallel walk that lstat()s every file
# (crates/core/examples/statwalk.rs), the floor under an unchanged backup; a plain
# parallel write of the tree (crates/core/examples/writefloor.rs: create, write from a
# cache-hot buffer, close), the floor under a restore, and a plain restore: the same with
# every file's bytes read back from zstd pieces and written unnamed until complete (not a
# strict floor, see writefloor.rs); a plain parallel read of the tree while the smallest
# first backup's repository is written durably to the same disk, in turns with the first
# backups (crates/core/examples/backupfloor.rs), the floor under a first backup there; and a
# copy of the tree backed up into the repository that holds the original (duplicate
# data), with a plain parallel read of the copy as its floor.
#
# Prints a table per step and writes the same as markdown to WORKDIR/compare.md. Tools
# not on PATH are skipped (and listed as such). bench/install-peers.sh installs them all,
# vykar built from its source (it is not on crates.io).
# Exits non-zero if any step failed or any restore differed from the source.
#
# usage: bench/compare.sh [--no-install] [WORKDIR]     (as root: apt, drop_caches)
#   --no-install, or CAIRN_BENCH_NO_INSTALL=1: do not run bench/install-peers.sh
#   CAIRN_BIN=PATH: measure this cairn binary instead of building one
#   CAIRN_BENCH_TOOLS="cairn restic ...": measure only these (default: all seven)
#   CAIRN_BENCH_CORPORA="linux mixed": the corpora, in order (default: both)
#   CAIRN_BENCH_FIRSTS=N: runs of each first backup (median; default 3)
#   CAIRN_BENCH_REPEAT=N: runs of the unchanged backup and the walk (median; default 5)
#   CAIRN_BENCH_RESTORES=N: runs of each restore (median; default 3). Every restored tree
#     is kept until its corpus is done, and so is every first backup's repository: the
#     disk needs (tools + 2) x RESTORES + tools x FIRSTS + 3 times the corpus's size
#     (1.3 GB for the Linux tree) free.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
install=1
[ "${CAIRN_BENCH_NO_INSTALL:-}" = 1 ] && install=0
args=()
for a in "$@"; do
  case $a in
    --no-install) install=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$a") ;;
  esac
done
work=${args[0]:-/tmp/cairn-compare}
mkdir -p "$work"
work=$(cd "$work" && pwd)
# shellcheck source=bench/lib.sh
source "$here/bench/lib.sh"

[ "$install" = 1 ] && "$here/bench/install-peers.sh"
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
cairn=$(build_cairn "$here")
statwalk=$(build_example "$here" statwalk)
writefloor=$(build_example "$here" writefloor)
backupfloor=$(build_example "$here" backupfloor)
timer=$(build_example "$here" timed)

# ext4 without a journal (as on this VM) skips inodes freed in the last minute, or six
# while their inode table block is dirty, when it allocates new ones: a restore right
# after a large deletion spent most of its time in that scan (perf: find_get_block_common,
# recently_deleted). So nothing is deleted while a corpus is measured, and after a
# deletion (between corpora, or the previous run's cleanup) the run waits until six
# minutes have passed.
deleted_at="$work/.deleted-at"
# Deletes the restored trees, repositories and duplicate copies, noting when.
delete_trees() {
  [ -e "$work/restore" ] || [ -e "$work/dup" ] || [ -e "$work/repos" ] || return 0
  rm -rf "$work/repos" "$work/restore" "$work/dup"
  date +%s >"$deleted_at"
}
wait_after_deletion() {
  [ -e "$deleted_at" ] || return 0
  local wait_s=$(($(cat "$deleted_at") + 360 - $(date +%s)))
  if [ "$wait_s" -gt 0 ]; then
    echo "waiting ${wait_s} s: files were deleted less than six minutes ago (see the comment)"
    sleep "$wait_s"
  fi
}
rm -rf "$work/cache" "$work/logs"
failures=()

# Each tool reads its repository and password from the environment where it can. cairn
# uses its default repository (XDG_DATA_HOME/cairn/default, set in run_tool) with the
# random key it makes for it, as `cairn backup DIR` with no setup does and as bupstash
# uses its key file: no password, so no Argon2id (64 MiB, ~80 ms) in every command. The
# other tools with passwords stretch them as they do by default.
export RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench \
  RUSTIC_PASSWORD=bench RUSTIC_NO_PROGRESS=true \
  RESTIC_REPOSITORY="$work/repos/restic" \
  RUSTIC_REPOSITORY="$work/repos/rustic" BUPSTASH_REPOSITORY="$work/repos/bupstash" \
  BUPSTASH_KEY="$work/repos/bupstash.key" VYKAR_PASSPHRASE=bench \
  VYKAR_CONFIG="$work/vykar.yaml"
unset CAIRN_PASSWORD CAIRN_PASSWORD_FILE CAIRN_PASSWORD_COMMAND CAIRN_REPOSITORY
# vykar takes its repository from a config file. Its default encryption is chosen by
# measuring the machine (AES-256-GCM or ChaCha20-Poly1305).
printf 'repositories:\n  - label: bench\n    url: %s\n' "$work/repos/vykar" >"$work/vykar.yaml"

# tool_cmd TOOL STEP [RUN]: sets `cmd` to TOOL's command line for STEP (init, backup1,
# backup2, backup3, restore); a repeated step's later runs name their snapshot STEP.RUN
# where the tool wants names of its own (borg, bupstash). Backups are of the same
# absolute path ($src) for every tool; restores go into $work/restore/TOOL/RUN, which
# exists and is empty, and restore the last snapshot (backup3).
tool_cmd() {
  local repo="$work/repos/$1" dest="$work/restore/$1/${3:-1}" name=$2
  [ "${3:-1}" -gt 1 ] && name="$2.$3"
  case $1:$2 in
    cairn:init) cmd=("$cairn" init -q) ;;
    cairn:backup*) cmd=("$cairn" backup "$src") ;;
    cairn:restore) cmd=("$cairn" restore latest --target "$dest") ;;
    restic:init) cmd=(restic init) ;;
    restic:backup*) cmd=(restic backup "$src") ;;
    restic:restore) cmd=(restic restore latest --target "$dest") ;;
    borg:init) cmd=(borg init --encryption=repokey-blake2 "$repo") ;;
    borg:backup*) cmd=(borg create "$repo::$name" "$src") ;;
    # borg extracts into the current directory.
    borg:restore) cmd=(env -C "$dest" borg extract "$repo::backup3") ;;
    rustic:init) cmd=(rustic init) ;;
    rustic:backup*) cmd=(rustic backup "$src") ;;
    rustic:restore) cmd=(rustic restore latest "$dest") ;;
    # A bupstash repository needs a key, made with the repository.
    bupstash:init) cmd=(bash -c 'bupstash init && bupstash new-key -o "$BUPSTASH_KEY"') ;;
    # The step=... tag names the item, so the restore can ask for the second one.
    bupstash:backup*) cmd=(bupstash put "step=$name" "$src") ;;
    # Its own restore, not `bupstash get | tar -x`: the tar stream rewrites a symlink
    # target of the tree (../.././x becomes ../../x). Owners and xattrs are opt-in there;
    # the other tools restore them by default as root.
    bupstash:restore) cmd=(bupstash restore --ownership --xattrs --into "$dest" step=backup3) ;;
    conserve:init) cmd=(conserve init "$repo") ;;
    conserve:backup*) cmd=(conserve --no-progress backup "$repo" "$src") ;;
    conserve:restore) cmd=(conserve --no-progress restore "$repo" "$dest") ;;
    vykar:init) cmd=(vykar init) ;;
    vykar:backup*) cmd=(vykar backup --label bench "$src") ;;
    vykar:restore) cmd=(vykar restore latest "$dest") ;;
    *) echo "no command for $1 $2" >&2; return 1 ;;
  esac
}

# record STEP TOOL WALL CPU RSS EXTRA...: one row of results.tsv.
record() { (IFS=$'\t'; echo "$*") >>"$results"; }

# fail MESSAGE LOG: says loudly what went wrong and remembers it for the exit status.
fail() {
  echo "!!! $1 (see $2)" >&2
  tail -n 20 "$2" >&2 || true
  failures+=("$1")
}

# Runs of the unchanged backup and the plain walk, whose median is recorded: they take
# under a second, where one run on a shared machine moves the ratio by 15% (the mixed
# corpus's, 10-30 ms, by more: bupstash's took 24-35 ms in runs minutes apart).
repeats=${CAIRN_BENCH_REPEAT:-5}
# Runs of each restore (and of the plain write), interleaved between the tools, whose
# median is recorded: one run of the same restore took 0.65 s to 1.65 s on this VM
# (cairn, mixed corpus, cache dropped each time), and the tool restoring after another
# had just used a gigabyte paid more (see drop_caches in bench/lib.sh).
restores=${CAIRN_BENCH_RESTORES:-3}
# Runs of each first backup, taking turns, whose median is recorded: the same build's
# first backup of the mixed corpus took 2.03 s in one run and 2.41 s in the next, and
# 1.60-1.92 s by hand between them (cold, in new repositories), so one run moved its
# ratio from 0.47x to 0.61x of bupstash's.
firsts=${CAIRN_BENCH_FIRSTS:-3}

# median RUN...: of `timed` outputs, the one with the median wall time.
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }

# step TOOL STEP: times one step, records it with the repository's size after it and
# prints it. The tool's output goes to $work/logs/TOOL-STEP.*. The unchanged backup is
# timed $repeats times (each a new snapshot of the same tree).
step() {
  local tool=$1 s=$2 log="$work/logs/$corpus/$1-$2" m size wall cpu rss n=1 r runs=()
  [ "$s" = backup2 ] && n=$repeats
  for ((r = 1; r <= n; r++)); do
    tool_cmd "$tool" "$s" "$r"
    if ! m=$(timed "$log.out" "$log.err" "${cmd[@]}"); then
      fail "$tool $s failed" "$log.err"
      record "$s" "$tool" failed
      return 1
    fi
    runs+=("$m")
  done
  m=$(median "${runs[@]}")
  size=$({ du -sb "$work/repos/$tool" 2>/dev/null || echo -; } | cut -f1)
  read -r wall cpu rss <<<"$m"
  record "$s" "$tool" "$wall" "$cpu" "$rss" "$size"
  printf '  %-9s %-8s %8s s wall %8s s CPU %6d MiB RSS\n' "$tool" "$s" "$wall" "$cpu" $((rss / 1024))
}

# restore_runs: every tool's restore of its last backup, and two plain versions of it,
# $restores times each, taking turns (cairn, the next tool, ..., the plain ones; then
# again), the page cache dropped before each; records the median run of each. Every
# restored tree is compared with the source and kept until the corpus is done. The plain
# ones (crates/core/examples/writefloor.rs): writefloor, the plain parallel write of the
# tree from a cache-hot buffer, the floor; restorefloor, the same with each file's bytes
# read back from pieces as cairn stores them (zstd where it pays; stored beforehand, in
# $work/repos), decompressed, and each file unnamed until written, as cairn's restore
# keeps a killed restore from leaving partial files.
restore_runs() {
  local tool r m log wall cpu rss rest lines flags
  local -A runs=() failed=()
  local -A floor_name=([writefloor]="plain parallel write"
    [restorefloor]="plain parallel write of zstd pieces into unnamed files")
  python3 "$here/bench/corpus.py" change "$src/$leaf" --kind "$corpus" --state 1
  log="$work/logs/$corpus/restorefloor-store"
  if ! "$writefloor" --store "$work/repos/pieces" "$src" >"$log.out" 2>"$log.err"; then
    fail "writefloor --store failed" "$log.err"
    failed[restorefloor]=failed
  fi
  for ((r = 1; r <= restores; r++)); do
    for tool in "${restorable[@]}" writefloor restorefloor; do
      [ -n "${failed[$tool]:-}" ] && continue
      log="$work/logs/$corpus/$tool-restore"
      drop_caches
      if [ -n "${floor_name[$tool]:-}" ]; then
        # writefloor times its write phase itself, after listing the source; peak memory
        # is not a restore's, so none.
        flags=()
        [ "$tool" = restorefloor ] && flags=(--unnamed --pieces "$work/repos/pieces")
        mkdir -p "$work/restore/$tool"
        if "$writefloor" "${flags[@]}" "$src" "$work/restore/$tool/$r" >"$log.out" 2>"$log.err"; then
          read -r wall cpu rest <"$log.out"
          runs[$tool]+="$wall $cpu -"$'\n'
          echo "$wall $cpu -" >>"$log.runs"
        else
          fail "$tool failed" "$log.err"
          failed[$tool]=failed
        fi
        continue
      fi
      tool_env "$tool"
      mkdir -p "$work/restore/$tool/$r"
      tool_cmd "$tool" restore "$r"
      if m=$(timed "$log.out" "$log.err" "${cmd[@]}"); then
        runs[$tool]+="$m"$'\n'
        # Every run, not only the median: restores vary from run to run.
        echo "$m" >>"$log.runs"
        verify "$tool" "$r" || failed[$tool]=DIFFERS
      else
        fail "$tool restore failed" "$log.err"
        failed[$tool]=failed
      fi
    done
  done
  for tool in "${restorable[@]}" writefloor restorefloor; do
    case ${failed[$tool]:-} in
      failed) [ -n "${floor_name[$tool]:-}" ] || record restore "$tool" failed; continue ;;
      DIFFERS) record verify "$tool" DIFFERS; continue ;;
    esac
    mapfile -t lines <<<"${runs[$tool]%$'\n'}"
    m=$(median "${lines[@]}")
    read -r wall cpu rss <<<"$m"
    if [ -n "${floor_name[$tool]:-}" ]; then
      record restore "${floor_name[$tool]}" "$wall" "$cpu" - -
      printf '  %-12s %-5s %8s s wall %8s s CPU  (median of %d)\n' "$tool" write "$wall" "$cpu" "$restores"
    else
      record restore "$tool" "$wall" "$cpu" "$rss" -
      record verify "$tool" identical
      printf '  %-9s %-8s %8s s wall %8s s CPU %6d MiB RSS  (median of %d)\n' "$tool" restore \
        "$wall" "$cpu" $((rss / 1024)) "$restores"
    fi
  done
  python3 "$here/bench/corpus.py" change "$src/$leaf" --kind "$corpus" --state 0
}

# verify TOOL RUN: compares a restored tree with the source, wherever under the target
# the tool put it (restic, borg, rustic and cairn keep the absolute path; bupstash,
# conserve and vykar restore the directory's contents); fails if it differs.
verify() {
  local tool=$1 dest="$work/restore/$1/$2" got log="$work/logs/$corpus/$1-diff"
  got=$(find "$dest" -type d -name "$leaf" -print -quit)
  if [ -n "$got" ] && diff -r --no-dereference "$src/$leaf" "$got" >"$log" 2>&1; then
    return 0
  fi
  [ -n "$got" ] || echo "no $leaf under $dest" >>"$log"
  fail "$tool restore $2 DIFFERS from the source" "$log"
  return 1
}

# The cairn-only rows, with cairn's repository holding the first and second backups.
walk_row() {
  local m wall cpu rss log="$work/logs/$corpus/statwalk" r runs=()
  for ((r = 1; r <= repeats; r++)); do
    if ! m=$(timed "$log.out" "$log.err" "$statwalk" "$src"); then
      fail "statwalk failed" "$log.err"; return 0
    fi
    runs+=("$m")
  done
  m=$(median "${runs[@]}")
  read -r wall cpu rss <<<"$m"
  record walk "plain parallel walk" "$wall" "$cpu" "$rss" -
  printf '  %-9s %-8s %8s s wall %8s s CPU %6d MiB RSS  (%s)\n' statwalk walk "$wall" "$cpu" \
    $((rss / 1024)) "$(cat "$log.out")"
}

duplicate_row() {
  local dup="$work/dup/$corpus" m wall cpu rss log="$work/logs/$corpus/cairn-duplicate" added total rest
  mkdir -p "$work/dup"
  cp -a "$src" "$dup"
  drop_caches
  if ! m=$(timed "$log.out" "$log.err" "$cairn" backup --json "$dup"); then
    fail "cairn backup of the duplicate failed" "$log.err"; return 0
  fi
  read -r wall cpu rss <<<"$m"
  added=$(grep -oE '"bytes_added": *[0-9]+' "$log.out" | grep -oE '[0-9]+$')
  total=$(grep -oE '"total_bytes": *[0-9]+' "$log.out" | grep -oE '[0-9]+$')
  record duplicate cairn "$wall" "$cpu" "$rss" "$added" "$total"
  printf '  %-9s %-8s %8s s wall %8s s CPU %6d MiB RSS  %s bytes added\n' cairn duplicate \
    "$wall" "$cpu" $((rss / 1024)) "$added"
  # The floor under it: the copy read by 64 threads from a cold cache, nothing written
  # (backupfloor with no bytes to write).
  log="$work/logs/$corpus/readfloor"
  drop_caches
  if ! "$backupfloor" "$dup" "$work/restore/readfloor" 0 >"$log.out" 2>"$log.err"; then
    fail "backupfloor (read only) failed" "$log.err"; return 0
  fi
  read -r wall cpu rest <"$log.out"
  record readfloor "plain parallel read" "$wall" "$cpu" - - "$total"
  printf '  %-9s %-8s %8s s wall %8s s CPU  (%s)\n' backupfloor read "$wall" "$cpu" "$rest"
}

# run_tool TOOL: every step of one tool, in a cache and config home of its own (so no
# earlier run or user setting counts). Stops at the first failed step.
# tool_env TOOL: a cache and config home of TOOL's own (so no earlier run or user setting
# counts).
tool_env() {
  export XDG_CACHE_HOME="$work/cache/$1" XDG_CONFIG_HOME="$work/cache/$1/config" \
    BORG_BASE_DIR="$work/cache/$1"
  # cairn's default repository, and nothing else, lands under its directory of repos/.
  if [ "$1" = cairn ]; then export XDG_DATA_HOME="$work/repos/cairn"; else unset XDG_DATA_HOME; fi
  mkdir -p "$XDG_CACHE_HOME" "$work/restore/$1"
}

# floor_round RUN: the floor under a first backup on this disk, as one more turn of run
# RUN of the first backups, so that it meets the disk and the VM's memory as they do
# (both vary over a run; it used to run after the restores): the tree read while as
# many bytes as the smallest repository so far are written durably beside it, the page
# cache dropped first. The first run tries 2, 8 and 64 threads reading and the later
# ones the fastest of them: many readers read a cold tree of small files fastest, and
# starve the write of a tree of large ones (backupfloor.rs). Adds the run's fastest to
# `floor_runs`, whose median counts.
floor_round() {
  local r=$1 bytes n log wall cpu rest best="" best_n=""
  bytes=$(printf '%s' "${runs[*]}" | awk '$4 ~ /^[0-9]+$/ { if (min == "" || $4 < min) min = $4 }
    END { print min }')
  [ -n "$bytes" ] || return 0
  for n in $floor_readers; do
    log="$work/logs/$corpus/backupfloor-$r-$n"
    drop_caches
    if ! "$backupfloor" "$src" "$work/restore/backupfloor-$r-$n" "$bytes" "$n" >"$log.out" 2>"$log.err"; then
      fail "backupfloor with $n readers failed" "$log.err"; return 0
    fi
    read -r wall cpu rest <"$log.out"
    printf '  %-9s %-8s %8s s wall %8s s CPU  (run %d: %s)\n' backupfloor read+write "$wall" "$cpu" "$r" "$rest"
    if [ -z "$best" ] || awk -v a="$wall" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then
      best="$wall $cpu" best_n=$n
    fi
  done
  floor_readers=$best_n
  floor_runs+="$best"$'\n'
}

# first_runs: every tool's init and first backup into a new repository, $firsts times,
# taking turns (cairn, the next tool, ...; then again), the page cache dropped before
# each backup; records the first run's init and the median first backup, with the size
# of its repository. A run's repository (and the tool's cache, so that the next run
# starts without one) is set aside under $work/repos/first-RUN until the corpus is done;
# the last run's stays for the steps that follow. Each run ends with the floor under
# them (floor_round). A tool whose init or first backup
# failed joins `failed_first`, and run_tool skips it.
first_runs() {
  local tool r m log size p aside wall cpu rss lines floor_readers="2 8 64" floor_runs=""
  local -A runs=()
  failed_first=()
  for ((r = 1; r <= firsts; r++)); do
    for tool in "${tools[@]}"; do
      [[ " ${failed_first[*]} " == *" $tool "* ]] && continue
      tool_env "$tool"
      if ((r == 1)); then
        echo "== $tool"
        step "$tool" init || { failed_first+=("$tool"); continue; }
      else
        aside="$work/repos/first-$((r - 1))"
        mkdir -p "$aside"
        for p in "$work/repos/$tool" "$work/repos/$tool".*; do
          [ -e "$p" ] && mv "$p" "$aside/"
        done
        mv "$work/cache/$tool" "$aside/$tool.cache"
        tool_env "$tool"
        log="$work/logs/$corpus/$tool-init"
        tool_cmd "$tool" init
        if ! timed "$log.out" "$log.err" "${cmd[@]}" >/dev/null; then
          fail "$tool init (first backup run $r) failed" "$log.err"
          failed_first+=("$tool"); continue
        fi
      fi
      log="$work/logs/$corpus/$tool-backup1"
      drop_caches
      tool_cmd "$tool" backup1
      if ! m=$(timed "$log.out" "$log.err" "${cmd[@]}"); then
        fail "$tool backup1 failed" "$log.err"
        record backup1 "$tool" failed
        failed_first+=("$tool"); continue
      fi
      size=$({ du -sb "$work/repos/$tool" 2>/dev/null || echo -; } | cut -f1)
      runs[$tool]+="$m $size"$'\n'
      # Every run, not only the median.
      echo "$m $size" >>"$log.runs"
      read -r wall cpu rss <<<"$m"
      printf '  %-9s %-8s %8s s wall %8s s CPU %6d MiB RSS  (run %d)\n' "$tool" backup1 "$wall" \
        "$cpu" $((rss / 1024)) "$r"
    done
    floor_round "$r"
  done
  for tool in "${tools[@]}"; do
    [[ " ${failed_first[*]} " == *" $tool "* ]] && continue
    mapfile -t lines <<<"${runs[$tool]%$'\n'}"
    read -r wall cpu rss size <<<"$(median "${lines[@]}")"
    record backup1 "$tool" "$wall" "$cpu" "$rss" "$size"
  done
  if [ -n "$floor_runs" ]; then
    mapfile -t lines <<<"${floor_runs%$'\n'}"
    read -r wall cpu <<<"$(median "${lines[@]}")"
    record backup1 "plain parallel read and write" "$wall" "$cpu" - -
  fi
}

# run_tool TOOL: the later backups of one tool (its first ones were first_runs'),
# stopping at the first failed step; a tool whose backups all ran joins `restorable`,
# whose restores restore_runs times afterwards.
run_tool() {
  local tool=$1
  [[ " ${failed_first[*]} " == *" $tool "* ]] && return 0
  tool_env "$tool"
  echo "== $tool"
  # What the steps before left to the kernel to write (the last first backup's
  # repository, if its tool does not make it durable) is on the disk before this tool's
  # steps are timed, not written back under them.
  sync
  step "$tool" backup2 || return 0
  [ "$tool" = cairn ] && walk_row
  python3 "$here/bench/corpus.py" change "$src/$leaf" --kind "$corpus" --state 1
  step "$tool" backup3 || return 0
  # Repositories stay until the corpus is done: see the comment on deletions above.
  restorable+=("$tool")
}

version_of() {
  case $1 in
    cairn) "$cairn" --version ;;
    restic) restic version ;;
    bupstash) bupstash version ;;
    *) "$1" --version ;;
  esac 2>&1 | head -n 1 || true
}

tools=() missing=()
for t in ${CAIRN_BENCH_TOOLS:-cairn restic borg rustic bupstash conserve vykar}; do
  if [ "$t" = cairn ] || command -v "$t" >/dev/null; then tools+=("$t"); else missing+=("$t"); fi
done
versions=()
for t in "${tools[@]}"; do versions+=("$(version_of "$t")"); done

# render text|md: the results as one table per step. For each step, a last row gives
# cairn's wall time, peak RSS and repository size over the best of the other tools.
render() {
  awk -F'\t' -v fmt="$1" -v src_bytes="$src_bytes" -v restores="$restores" -v firsts="$firsts" '
    function mib(b) { return b == "-" ? "-" : sprintf("%.1f", b / 1048576) }
    function kib(k) { return k == "-" ? "-" : mib(k * 1024) }
    function ratio(c, best, who) {
      if (c == "" || best == "" || best + 0 == 0 || c == "-") return "-"
      return sprintf("%.2f%s (%s)", c / best, fmt == "md" ? "×" : "x", who)
    }
    function row(a, b, c, d, e, f) {
      if (fmt == "md") {
        line = "| " a " | " b " | " c " | " d " | " e " |"
        if (f != "") line = line " " f " |"
        print line
      } else printf "  %-30s %18s %8s %18s %18s  %s\n", a, b, c, d, e, f
    }
    # floor_line(NAME, WALL, STEP, BEST): how a floor (or plain version) of STEP compares
    # with half the time of the best other tool.
    function floor_line(name, w, step, best) {
      printf "%s%s / best other %s: %.2f%s (%s)\n", fmt == "md" ? "\n" : "  ", name, step,
        w / best, fmt == "md" ? "×" : "x",
        (w / best > 0.5 ? "above 0.5: on this machine it alone takes more than half the best other" : \
          "at most 0.5: this machine leaves room for half the best other")
    }
    function table(s, title, extra,    i, n, t, best_w, best_r, best_s, who_w, who_r, who_s) {
      if (!(s in count)) return
      if (fmt == "md") {
        print "\n### " title "\n"
        row("tool", "wall s", "CPU s", "peak RSS MiB", "repository MiB", extra)
        row("---", "---", "---", "---", "---", extra == "" ? "" : "---")
      } else {
        print "\n" title
        row("tool", "wall s", "CPU s", "RSS MiB", "repo MiB", extra)
      }
      for (i = 1; i <= count[s]; i++) {
        t = tool[s, i]
        if (wall[s, t] == "failed") { row(t, "failed", "-", "-", "-", ""); continue }
        row(t, wall[s, t], cpu[s, t], kib(rss[s, t]), mib(size[s, t]),
            extra == "" ? "" : (t in verified ? verified[t] : "-"))
        if (t == "cairn" || t ~ /^plain parallel/) continue
        if (best_w == "" || wall[s, t] + 0 < best_w + 0) { best_w = wall[s, t]; who_w = t }
        if (best_r == "" || rss[s, t] + 0 < best_r + 0) { best_r = rss[s, t]; who_r = t }
        if (size[s, t] != "-" && (best_s == "" || size[s, t] + 0 < best_s + 0)) {
          best_s = size[s, t]; who_s = t
        }
      }
      if (s == "backup1") best1 = best_w
      if (s == "backup2") best2 = best_w
      if (s == "restore") best_restore = best_w
      if (((s, "cairn") in wall) && wall[s, "cairn"] != "failed" && best_w != "")
        row("cairn / best other", ratio(wall[s, "cairn"], best_w, who_w), "-",
            ratio(rss[s, "cairn"], best_r, who_r), ratio(size[s, "cairn"], best_s, who_s),
            extra == "" ? "" : "-")
    }
    $1 == "verify" { verified[$2] = $3; next }
    $1 == "duplicate" { dup = $0; next }
    $1 == "readfloor" { readfloor = $0; next }
    {
      s = $1 == "walk" ? "backup2" : $1
      count[s]++; tool[s, count[s]] = $2
      wall[s, $2] = $3; cpu[s, $2] = $4; rss[s, $2] = $5; size[s, $2] = $6
    }
    END {
      table("init", "init")
      table("backup1", "first backup (page cache dropped first; the median of " firsts " runs, the tools taking turns)")
      if (("backup1", "plain parallel read and write") in wall && best1 != "" && best1 > 0)
        floor_line("plain parallel read of the tree with the smallest repository written durably beside it",
          wall["backup1", "plain parallel read and write"], "first backup", best1)
      table("backup2", "unchanged second backup")
      # (A walk that rounds to 0 gives no ratio.)
      if (("backup2", "plain parallel walk") in wall && ("backup2", "cairn") in wall &&
          wall["backup2", "cairn"] != "failed" && wall["backup2", "plain parallel walk"] > 0)
        printf "%scairn unchanged backup / plain parallel walk (lstat of every file, all cores): %.2f%s (target: within 2%s)\n",
          fmt == "md" ? "\n" : "  ", wall["backup2", "cairn"] / wall["backup2", "plain parallel walk"],
          fmt == "md" ? "×" : "x", fmt == "md" ? "×" : "x"
      if (("backup2", "plain parallel walk") in wall && best2 != "" && best2 > 0)
        floor_line("plain parallel walk", wall["backup2", "plain parallel walk"], "unchanged backup", best2)
      table("backup3", "backup after in-place changes (bench/corpus.py change)")
      table("restore", "restore of that last backup (page cache dropped first; the median of " restores " runs, the tools taking turns)", "identical to source")
      if (("restore", "plain parallel write") in wall && ("restore", "cairn") in wall &&
          wall["restore", "cairn"] != "failed" && wall["restore", "plain parallel write"] > 0)
        printf "%scairn restore / plain parallel write (create, write from a cache-hot buffer, close; all cores): %.2f%s\n",
          fmt == "md" ? "\n" : "  ", wall["restore", "cairn"] / wall["restore", "plain parallel write"],
          fmt == "md" ? "×" : "x"
      zfloor = "plain parallel write of zstd pieces into unnamed files"
      if (("restore", zfloor) in wall && wall["restore", zfloor] > 0 && best_restore != "" && best_restore > 0) {
        floor_line(zfloor, wall["restore", zfloor], "restore", best_restore)
        if (("restore", "cairn") in wall && wall["restore", "cairn"] != "failed")
          printf "%scairn restore / that plain restore: %.2f%s\n", fmt == "md" ? "\n" : "  ",
            wall["restore", "cairn"] / wall["restore", zfloor], fmt == "md" ? "×" : "x"
      }
      if (dup != "") {
        split(dup, d, "\t")
        title = "duplicate data: a cp -a copy of the tree, backed up into cairn'"'"'s repository holding the original (page cache dropped first)"
        mbs = sprintf("%.1f", d[7] / 1e6 / d[3])
        if (fmt == "md") {
          print "\n### " title "\n"
          print "| tool | wall s | CPU s | peak RSS MiB | MB/s | bytes added |"
          print "| --- | --- | --- | --- | --- | --- |"
          print "| cairn | " d[3] " | " d[4] " | " mib(d[5] * 1024) " | " mbs " | " d[6] " |"
        } else {
          print "\n" title
          printf "  %-22s %10s %10s %10s %12s  %s\n", "tool", "wall s", "CPU s", "RSS MiB", "MB/s", "bytes added"
          printf "  %-22s %10s %10s %10s %12s  %s\n", "cairn", d[3], d[4], mib(d[5] * 1024), mbs, d[6]
        }
        if (readfloor != "") {
          split(readfloor, f, "\t")
          fmbs = sprintf("%.1f", f[7] / 1e6 / f[3])
          if (fmt == "md") print "| plain parallel read | " f[3] " | " f[4] " | - | " fmbs " | - |"
          else printf "  %-22s %10s %10s %10s %12s  %s\n", "plain parallel read", f[3], f[4], "-", fmbs, "-"
          printf "%scairn duplicate backup / plain parallel read of the copy (cold cache, 64 readers): %.2f%s\n",
            fmt == "md" ? "\n" : "  ", d[3] / f[3], fmt == "md" ? "×" : "x"
        }
      }
    }' "$results"
}

# run_corpus CORPUS: every tool on one corpus, the tables printed and added to compare.md.
run_corpus() {
  corpus=$1
  case $corpus in
    linux) src=$(prepare_linux_tree "$work") leaf=linux-source-6.1
      title="the Linux 6.1 source tree" ;;
    mixed) src="$work/mixed-src" leaf=mixed
      title="mixed, mostly incompressible files (bench/corpus.py)"
      [ -d "$src/$leaf" ] || python3 "$here/bench/corpus.py" mixed "$src/$leaf" ;;
    *) echo "unknown corpus $corpus (linux, mixed)" >&2; exit 2 ;;
  esac
  # A run stopped half-way may have left the tree changed.
  python3 "$here/bench/corpus.py" change "$src/$leaf" --kind "$corpus" --state 0
  delete_trees
  wait_after_deletion
  rm -rf "$work/cache"
  mkdir -p "$work/repos" "$work/restore" "$work/cache" "$work/logs/$corpus"
  results="$work/results-$corpus.tsv"
  : >"$results"
  src_bytes=$(du -sb "$src" | cut -f1)
  src_files=$(find "$src" -type f | wc -l)
  # Files with other names (a source tree copied with `cp -al`, as by hand between runs)
  # are restored as hard links by some tools and as copies by others: said with the
  # figures, since they change what a restore does.
  src_linked=$(find "$src" -type f -links +1 | wc -l)
  linked=""
  ((src_linked == 0)) || linked=", $src_linked of them with other names (hard links)"
  echo "corpus $corpus: $src ($src_bytes bytes in $src_files files$linked)"
  # Every restored tree is kept until the corpus is done (each tool's and the two plain
  # ones', $restores times), beside a repository per tool, the stored pieces, the
  # floors' writes (three in the first run, one in each later run, none larger than the
  # tree) and the duplicate's copy: a full disk half-way (a run of 2026-11-29) wastes
  # the run.
  local need avail
  need=$(((((${#tools[@]} + 2) * restores) + ${#tools[@]} * firsts + (firsts + 2) + 3) * $(du -sk "$src" | cut -f1) * 1024))
  avail=$(df --output=avail -B1 "$work" | tail -n 1)
  if ((avail < need)); then
    echo "compare.sh: the $corpus corpus needs about $((need >> 30)) GiB free in $work" \
      "(restored trees are kept until it is done), and $((avail >> 30)) GiB are;" \
      "free some, or set CAIRN_BENCH_RESTORES=1" >&2
    exit 2
  fi
  restorable=()
  first_runs
  for t in "${tools[@]}"; do
    run_tool "$t"
    python3 "$here/bench/corpus.py" change "$src/$leaf" --kind "$corpus" --state 0
  done
  echo "== restores, taking turns"
  restore_runs
  # After the restores, which restore the latest snapshot.
  if [[ " ${restorable[*]} " == *" cairn "* ]]; then tool_env cairn; duplicate_row; fi
  render text
  {
    echo
    echo "## Compared with other tools: $title"
    echo
    echo "Source $src_bytes bytes in $src_files files$linked."
    render md
  } >>"$work/compare.md"
}

{
  echo "\`bench/compare.sh\` at commit $(git -C "$here" describe --always --dirty) on $(date -u +%Y-%m-%d)" \
    "($(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM)." \
    "Each tool at its defaults; conserve has no encryption."
  echo
  for i in "${!tools[@]}"; do echo "- ${tools[$i]}: ${versions[$i]}"; done
  # A stale list leaves cairn's code spread out (more of it resident), not wrong.
  echo "- cairn's symbol order: $("$here/scripts/symbol-order" --check "$cairn")"
  for t in "${missing[@]}"; do echo "- $t: not on PATH, not measured"; done
} >"$work/compare.md"
for corpus in ${CAIRN_BENCH_CORPORA:-linux mixed}; do run_corpus "$corpus"; done
echo
echo "markdown: $work/compare.md"
delete_trees
if [ ${#failures[@]} -gt 0 ]; then
  printf '!!! %s\n' "${failures[@]}" >&2
  exit 1
fi
