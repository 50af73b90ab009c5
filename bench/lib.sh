# Shared by the bench scripts: the Linux 6.1 source tree and a timing wrapper.
# shellcheck shell=bash

# Unpacks Debian's linux-source-6.1 under $1 (once) and prints the tree's path.
prepare_linux_tree() {
  local src=$1/linux-src
  if [ ! -d "$src/linux-source-6.1" ]; then
    [ -f /usr/src/linux-source-6.1.tar.xz ] || apt-get install -y linux-source-6.1 >/dev/null
    mkdir -p "$src" && tar xf /usr/src/linux-source-6.1.tar.xz -C "$src"
  fi
  echo "$src"
}

# Empties the page cache where allowed (root), so reads come from disk; then waits 3 s.
# A VM whose balloon device reports free memory to its host (virtio_balloon's free page
# reporting, as on the VMs of docs/BENCHMARKS.md) hands back memory left free for 2 s,
# and the next use of it faults on the host: a restore of the mixed corpus took 0.75-0.85 s
# started at once after dropping the cache and 1.05-1.62 s started 20 s later (1.0-1.1
# against 1.7-2.8 CPU s). Without the wait, how much of that a step paid depended on
# what ran before it: the first tool after an idle spell paid the most.
drop_caches() {
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  sleep 3
}

# measure NAME CMD...: runs CMD with its stdout discarded and prints wall, CPU and RSS.
measure() {
  local name=$1; shift
  /usr/bin/time -f "$name: %e s wall, %U s user, %S s sys, %M KiB peak RSS" "$@" >/dev/null
}

# timed OUT ERR CMD...: runs CMD with its stdout to OUT and stderr to ERR, and prints
# "WALL CPU RSS" (seconds to the millisecond, user+sys seconds, peak KiB), measured by
# crates/core/examples/timed.rs, which the caller builds into $timer (build_example).
# Fails with CMD's status, so a step that fails is never reported as a time.
timed() { "$timer" "$@"; }

# Builds cairn in release mode in the checkout $1 and prints the binary's path; with
# CAIRN_BIN set, prints that instead (to measure a binary built elsewhere).
build_cairn() {
  if [ -n "${CAIRN_BIN:-}" ]; then echo "$CAIRN_BIN"; return; fi
  (cd "$1" && cargo build --release -p cairn-cli -q)
  echo "$1/target/release/cairn"
}

# Builds example $2 of cairn-core in the checkout $1 and prints its path: statwalk and
# writefloor (crates/core/examples/), the floors under an unchanged backup and a restore.
build_example() {
  (cd "$1" && cargo build --release -p cairn-core --example "$2" -q)
  echo "$1/target/release/examples/$2"
}
