#!/usr/bin/env bash
# Starts or stops the real servers that cairn's tests talk to, on loopback only:
# a single-node Garage (S3), a three-node Garage cluster (replication factor 3) and an
# OpenSSH server (SFTP), each with its own data, keys and config under DIR; nothing of the
# system's configuration is touched.
#
#   scripts/services.sh install          # garage (cargo install, ~25 min once), openssh-server, fuse3, faketime, systemd-analyze
#   scripts/services.sh start DIR        # writes DIR/env to source: addresses and credentials
#   scripts/services.sh stop DIR
#
# Ports: the single node uses CAIRN_TEST_S3_PORT (default 29300) to +3, the cluster
# CAIRN_TEST_S3_CLUSTER_PORT (default CAIRN_TEST_S3_PORT + 10) to +5, two per node, and
# sshd CAIRN_TEST_SSH_PORT (default 29322). Set them to run beside another instance.
# The defaults are below Linux's ephemeral ports (32768-60999): at 39300 and up, a
# cluster node the tests stop and start again once found its S3 port in use, most
# likely by a connection's local end, which the kernel picks from that range.
set -euo pipefail

S3_PORT=${CAIRN_TEST_S3_PORT:-29300}
CLUSTER_PORT=${CAIRN_TEST_S3_CLUSTER_PORT:-$((S3_PORT + 10))}
SSH_PORT=${CAIRN_TEST_SSH_PORT:-29322}

# wait_for SECONDS WHAT LOG PID COMMAND...: runs COMMAND every 0.2 s until it succeeds;
# fails with a message that points at LOG after SECONDS, or at once when process PID (the
# server being waited for) has died.
wait_for() {
  local seconds=$1 what=$2 log=$3 pid=$4
  shift 4
  local i
  for i in $(seq $((seconds * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$what did not happen: the server exited; see $log" >&2
      return 1
    fi
    sleep 0.2
  done
  echo "$what did not happen within ${seconds}s; see $log" >&2
  return 1
}

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
  # The no-loss tests run one cairn process with its clock shifted (hours behind, minutes
  # ahead) through libfaketime, as a host with a wrong clock would be.
  if ! dpkg -s libfaketime >/dev/null 2>&1; then
    echo "== installing faketime"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y faketime >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y faketime >/dev/null; }
  fi
  # The test of `cairn schedule install` checks its units with systemd-analyze verify
  # (Debian's systemd package; nothing is started).
  if ! command -v systemd-analyze >/dev/null; then
    echo "== installing systemd (for systemd-analyze)"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y systemd >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y systemd >/dev/null; }
  fi
  # A jobs test runs cairn on a pseudo-terminal with script(1) (util-linux's bsdutils,
  # essential on Debian, so normally already there).
  if ! command -v script >/dev/null; then
    echo "== installing bsdutils (for script)"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y bsdutils >/dev/null || { $sudo apt-get update >/dev/null && $sudo apt-get install -y bsdutils >/dev/null; }
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
  wait_for 60 "garage (single node) answering" "$dir/server.log" "$(cat "$dir/pid")" $g status
  local node
  node=$($g node id -q | cut -d@ -f1)
  $g layout assign -z dc1 -c 1G "$node" >/dev/null
  $g layout apply --version 1 >/dev/null
  $g bucket create cairn-test >/dev/null
  local key
  key=$($g key create cairn-test)
  $g bucket allow --read --write --owner cairn-test --key cairn-test >/dev/null
  # A second key that may only read the bucket, for permission-denied tests.
  local ro
  ro=$($g key create cairn-test-readonly)
  $g bucket allow --read cairn-test --key cairn-test-readonly >/dev/null
  S3_KEY_ID=$(echo "$key" | awk '/Key ID/ {print $NF}')
  S3_SECRET=$(echo "$key" | awk '/Secret key/ {print $NF}')
  cat >>"$1/env" <<ENV
export CAIRN_TEST_S3="s3:http://127.0.0.1:$S3_PORT/cairn-test"
export AWS_ACCESS_KEY_ID=$S3_KEY_ID
export AWS_SECRET_ACCESS_KEY=$S3_SECRET
export AWS_DEFAULT_REGION=garage
export CAIRN_TEST_S3_READONLY_KEY_ID=$(echo "$ro" | awk '/Key ID/ {print $NF}')
export CAIRN_TEST_S3_READONLY_SECRET=$(echo "$ro" | awk '/Secret key/ {print $NF}')
ENV
}

# Three nodes, replication factor 3: any one may be down and reads and writes go on
# (quorum 2 of 3). Each node's dir has a `start` script that starts it again and waits
# until node 0 sees it healthy, for tests that stop a node and must leave the cluster whole.
# The cluster's bucket accepts the single node's key (imported), so the same
# AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY work on both.
start_cluster() {
  local dir=$1/cluster secret i
  secret=$(openssl rand -hex 32)
  local g0="garage -c $dir/node0/garage.toml"
  for i in 0 1 2; do
    local node=$dir/node$i
    mkdir -p "$node/meta" "$node/data"
    cat >"$node/garage.toml" <<TOML
metadata_dir = "$node/meta"
data_dir = "$node/data"
db_engine = "sqlite"
replication_factor = 3
rpc_bind_addr = "127.0.0.1:$((CLUSTER_PORT + 2 * i + 1))"
rpc_public_addr = "127.0.0.1:$((CLUSTER_PORT + 2 * i + 1))"
rpc_secret = "$secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:$((CLUSTER_PORT + 2 * i))"
root_domain = ".s3.garage.localhost"
TOML
    cat >"$node/start" <<SH
#!/usr/bin/env bash
# Starts cluster node $i (again) and waits until it serves S3 and sees all three nodes.
set -euo pipefail
RUST_LOG=warn setsid garage -c $node/garage.toml server >>$node/server.log 2>&1 </dev/null &
echo \$! >$node/pid
for _ in \$(seq 300); do
  if (: </dev/tcp/127.0.0.1/$((CLUSTER_PORT + 2 * i))) 2>/dev/null &&
    [ "\$(garage -c $node/garage.toml status 2>/dev/null | sed '/FAILED/,\$d' | grep -cE '^[0-9a-f]{16}')" -ge 3 ]; then
    exit 0
  fi
  sleep 0.2
done
echo "cluster node $i did not come back within 60s; see $node/server.log" >&2
exit 1
SH
    chmod +x "$node/start"
    RUST_LOG=warn garage -c "$node/garage.toml" server >"$node/server.log" 2>&1 &
    echo $! >"$node/pid"
  done
  local ids=()
  for i in 0 1 2; do
    wait_for 60 "cluster node $i answering" "$dir/node$i/server.log" "$(cat "$dir/node$i/pid")" \
      garage -c "$dir/node$i/garage.toml" status
    ids+=("$(garage -c "$dir/node$i/garage.toml" node id -q)")
  done
  $g0 node connect "${ids[1]}" >/dev/null
  $g0 node connect "${ids[2]}" >/dev/null
  local short=("${ids[@]%%@*}")
  wait_for 60 "all three cluster nodes connected" "$dir/node0/server.log" "$(cat "$dir/node0/pid")" \
    bash -c "[ \$($g0 status | sed '/FAILED/,\$d' | grep -cE '^[0-9a-f]{16}') -ge 3 ]"
  $g0 layout assign -z dc1 -c 1G "${short[@]}" >/dev/null
  $g0 layout apply --version 1 >/dev/null
  # Every node must have the layout before it serves requests with quorum.
  for i in 1 2; do
    wait_for 60 "cluster node $i receiving the layout" "$dir/node$i/server.log" "$(cat "$dir/node$i/pid")" \
      bash -c "garage -c $dir/node$i/garage.toml layout show | grep -q 'Current cluster layout version: 1'"
  done
  $g0 bucket create cairn-cluster >/dev/null
  $g0 key import --yes -n cairn-test "$S3_KEY_ID" "$S3_SECRET" >/dev/null
  $g0 bucket allow --read --write --owner cairn-cluster --key "$S3_KEY_ID" >/dev/null
  cat >>"$1/env" <<ENV
export CAIRN_TEST_S3_CLUSTER="s3:http://127.0.0.1:$CLUSTER_PORT/cairn-cluster"
export CAIRN_TEST_S3_CLUSTER_NODES="$dir/node0 $dir/node1 $dir/node2"
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
  /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log" ||
    { echo "sshd did not start; see $dir/sshd.log" >&2; return 1; }
  for _ in $(seq 300); do [ -s "$dir/sshd.pid" ] && break; sleep 0.1; done
  [ -s "$dir/sshd.pid" ] || { echo "sshd wrote no pid file within 30s; see $dir/sshd.log" >&2; return 1; }
  cat >>"$1/env" <<ENV
export CAIRN_TEST_SSH_BIN=$dir/bin
export CAIRN_TEST_SFTP="sftp:cairn-test-sftp:$dir/repos"
ENV
}

# Stops every server start started, including cluster nodes a test restarted, and
# tolerates ones already gone; waits (up to 10 s) so their ports are free on return.
stop() {
  local dir=$1 pidfile pids=() pid
  for pidfile in "$dir/garage/pid" "$dir"/cluster/node*/pid "$dir/ssh/sshd.pid"; do
    if [ -s "$pidfile" ]; then
      pid=$(cat "$pidfile")
      # sshd's per-connection processes outlive the listener, and with them the clients'
      # ssh masters: end them first.
      if [ "$pidfile" = "$dir/ssh/sshd.pid" ]; then pkill -P "$pid" 2>/dev/null || true; fi
      if kill "$pid" 2>/dev/null; then pids+=("$pid"); fi
    fi
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.2
  done
  echo "some servers under $dir did not stop within 10s: ${pids[*]}" >&2
}

case ${1:-} in
  install) install ;;
  start)
    dir=${2:?usage: $0 start DIR}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    : >"$dir/env"
    # Whatever fails half-way, what was started is stopped again.
    trap 'stop "$dir"' EXIT
    start_garage "$dir"
    start_cluster "$dir"
    start_sshd "$dir"
    trap - EXIT
    echo "services up; source $dir/env"
    ;;
  stop) stop "${2:?usage: $0 stop DIR}" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
