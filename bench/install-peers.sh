#!/usr/bin/env bash
# Installs the backup tools bench/compare.sh measures cairn against, skipping any already
# on PATH: restic and borg from Debian, rustic, bupstash and conserve with cargo (bupstash
# links Debian's libsodium), and vykar built from its source (it is not on crates.io):
# tag v0.19.1 of github.com/borgbase/vykar, cloned, or the checkout VYKAR_SRC names where
# GitHub cannot be reached. The cargo builds take a while; they run once per machine.
# CAIRN_BENCH_TOOLS (as for compare.sh) limits it to the tools named there.
set -euo pipefail

tools=" ${CAIRN_BENCH_TOOLS:-restic borg rustic bupstash conserve vykar} "
# missing TOOL: whether TOOL is to be measured and not on PATH yet.
missing() { [[ $tools == *" $1 "* ]] && ! command -v "$1" >/dev/null; }

need_apt=()
missing restic && need_apt+=(restic)
missing borg && need_apt+=(borgbackup)
missing bupstash && need_apt+=(libsodium-dev pkg-config)
command -v /usr/bin/time >/dev/null || need_apt+=(time)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi

install_crate() { # install_crate BINARY CRATE
  missing "$1" || return 0
  echo "installing $2 (cargo install --locked)..." >&2
  nice cargo install --locked -q "$2"
}
install_crate rustic rustic-rs
install_crate bupstash bupstash
install_crate conserve conserve

# vykar: `cargo build -p vykar-cli` in its own workspace (its Cargo.lock), the binary
# copied beside cargo's others.
if missing vykar; then
  src=${VYKAR_SRC:-} clone=
  if [ -z "$src" ]; then
    clone=$(mktemp -d /tmp/vykar-src.XXXXXX) src=$clone
    if ! git clone -q --depth 1 --branch v0.19.1 https://github.com/borgbase/vykar "$src" 2>/dev/null; then
      echo "vykar not installed: cannot clone github.com/borgbase/vykar; set VYKAR_SRC to a checkout of it" >&2
      src=
    fi
  fi
  if [ -n "$src" ]; then
    echo "building vykar from $src (cargo build --release --locked -p vykar-cli)..." >&2
    (cd "$src" && nice cargo build --release --locked -q -p vykar-cli)
    bin=${CARGO_HOME:-$HOME/.cargo}/bin
    mkdir -p "$bin" && install -m 0755 "$src/target/release/vykar" "$bin/vykar"
  fi
  # The clone and its build (about a gigabyte) are not needed once vykar is installed.
  [ -z "$clone" ] || rm -rf "$clone"
fi
