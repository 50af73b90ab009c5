#!/usr/bin/env bash
# Installs the backup tools bench/compare.sh measures cairn against, skipping any already
# on PATH: restic and borg from Debian, rustic, bupstash and conserve with cargo (bupstash
# links Debian's libsodium). The cargo builds take a while; they run once per machine.
set -euo pipefail

need_apt=()
command -v restic >/dev/null || need_apt+=(restic)
command -v borg >/dev/null || need_apt+=(borgbackup)
command -v bupstash >/dev/null || need_apt+=(libsodium-dev pkg-config)
command -v /usr/bin/time >/dev/null || need_apt+=(time)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi

install_crate() { # install_crate BINARY CRATE
  command -v "$1" >/dev/null && return 0
  echo "installing $2 (cargo install --locked)..." >&2
  nice cargo install --locked -q "$2"
}
install_crate rustic rustic-rs
install_crate bupstash bupstash
install_crate conserve conserve
