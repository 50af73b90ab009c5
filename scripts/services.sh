#!/usr/bin/env bash
# Starts or stops the real servers that cairn's tests talk to, on loopback only:
# a single-node Garage (S3) and an OpenSSH server (SFTP), each with its own data, keys
# and config under DIR; nothing of the system's configuration is touched.
#
#   scripts/services.sh install          # garage (cargo install, ~25 min once), openssh-server, fuse3
#   scripts/services.sh start DIR        # writes DIR/env to source: addresses and credentials
#   scripts/services.sh stop DIR
set -euo pipefail

S3_PORT=${CAIRN_TEST_S3_PORT:-39300}
SSH_PORT=${CAIRN_TEST_SSH_PORT:-39322}

install() {
  if ! command -v garage >/dev/null; then
    echo "== installing garage (cargo install --locked garage; about 25 minutes the first time)"
    cargo install --locked garage
  fi
  if [ ! -x /usr/sbin/sshd ]; then
    echo "== installing openssh-server"
    if [ "$(id -u)" = 0 ]; then apt-get install -y openssh-server >/dev/null; else sudo apt-get install -y openssh-server >/dev/null; fi
  fi
  # The mount tests unmount with fusermount3, as a user would (mounting itself needs no
  # libfuse: cairn speaks the FUSE protocol through /dev/fuse).
  if ! command -v fusermount3 >/dev/null; then
    echo "== installing fuse3"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    # A fresh machine may have no package lists yet.
    $sudo apt-get install -y fuse3 >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y fuse3 >/dev/null; }
  fi
}

start_garage() {
  local dir=$1/garage
  mkdir -p "$dir/meta" "$dir/data"
  cat >"$dir/garage.toml" <<TOML
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$((S3_PORT + 1))"
rpc_public_addr = "127.0.0.1:$((S3_PORT + 1))"
rpc_secret = "$(openssl rand -hex 32)"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$S3_PORT"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((S3_PORT + 3))"
admin_token = "$(openssl rand -base64 32)"
TOML
  local g="garage -c $dir/garage.toml"
  RUST_LOG=warn $g server >"$dir/server.log" 2>&1 &
  echo $! >"$dir/pid"
  local node=""
  for _ in $(seq 100); do
    node=$($g status 2>/dev/null | grep -oE '^[0-9a-f]{16}' | head -n 1) && [ -n "$node" ] && break
    sleep 0.2
  done
  [ -n "$node" ] || { echo "garage did not start; see $dir/server.log" >&2; exit 1; }
  $g layout assign -z dc1 -c 1G "$node" >/dev/null
  $g layout apply --version 1 >/dev/null
  $g bucket create cairn-test >/dev/null
  local key
  key=$($g key create cairn-test)
  $g bucket allow --read --write --owner cairn-test --key cairn-test >/dev/null
  local id secret
  id=$(echo "$key" | awk '/Key ID/ {print $NF}')
  secret=$(echo "$key" | awk '/Secret key/ {print $NF}')
  cat >>"$1/env" <<ENV
export CAIRN_TEST_S3="s3:http://127.0.0.1:$S3_PORT/cairn-test"
export AWS_ACCESS_KEY_ID=$id
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_DEFAULT_REGION=garage
ENV
}

start_sshd() {
  local dir=$1/ssh
  mkdir -p "$dir/home/.ssh" "$dir/repos"
  chmod 700 "$dir/home/.ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/hostkey"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/home/.ssh/id_ed25519"
  cp "$dir/home/.ssh/id_ed25519.pub" "$dir/authorized_keys"
  cat >"$dir/sshd_config" <<CONF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $dir/hostkey
AuthorizedKeysFile $dir/authorized_keys
PasswordAuthentication no
PermitRootLogin prohibit-password
StrictModes no
Subsystem sftp internal-sftp
PidFile $dir/sshd.pid
CONF
  # The client side, as a user would have it in ~/.ssh/config. ssh finds ~ through the
  # password database, not $HOME, so the tests put a wrapper first on PATH that hands
  # this file to the real ssh with -F.
  cat >"$dir/home/.ssh/config" <<CONF
Host cairn-test-sftp
  HostName 127.0.0.1
  Port $SSH_PORT
  User $(id -un)
  IdentityFile $dir/home/.ssh/id_ed25519
  UserKnownHostsFile $dir/home/.ssh/known_hosts
  StrictHostKeyChecking yes
CONF
  chmod 600 "$dir/home/.ssh/config"
  # cairn's SFTP client checks host keys strictly, as a careful user's ssh does.
  echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$dir/hostkey.pub")" >"$dir/home/.ssh/known_hosts"
  mkdir -p "$dir/bin"
  printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$dir/home/.ssh/config" >"$dir/bin/ssh"
  chmod +x "$dir/bin/ssh"
  mkdir -p /run/sshd
  /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log"
  for _ in $(seq 50); do [ -s "$dir/sshd.pid" ] && break; sleep 0.1; done
  cat >>"$1/env" <<ENV
export CAIRN_TEST_SSH_BIN=$dir/bin
export CAIRN_TEST_SFTP="sftp:cairn-test-sftp:$dir/repos"
ENV
}

stop() {
  local dir=$1
  for pidfile in "$dir/garage/pid" "$dir/ssh/sshd.pid"; do
    if [ -s "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
}

case ${1:-} in
  install) install ;;
  start)
    dir=${2:?usage: $0 start DIR}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    : >"$dir/env"
    start_garage "$dir"
    start_sshd "$dir"
    echo "services up; source $dir/env"
    ;;
  stop) stop "${2:?usage: $0 stop DIR}" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
