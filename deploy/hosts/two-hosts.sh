#!/usr/bin/env bash
# Two "hosts" on one machine: the multi-host path of docs (deploy/README.md, "Two hosts on one machine"),
# tried without a second machine. Network namespaces joined by a bridge, documentation addresses only:
#   hub  198.51.100.1  a Docker registry (:5000), a Dask scheduler (:8786), a Prefect server (:4200);
#                      the build's driver (and a teacher it starts) runs here: `two-hosts.sh run hub ...`
#   a    198.51.100.2  its own dockerd (data root, exec root, socket STATE/a/d.sock; the base image loaded,
#                      the registry allowed) and its own Dask worker naming that engine
#   b    198.51.100.3  the same
# Nothing listens on the machine's own interfaces, and no part reaches another over loopback.
#
# Usage (as root):
#   two-hosts.sh up               create the namespaces and start everything (idempotent)
#   two-hosts.sh status           each part: running or not
#   two-hosts.sh run HOST CMD...  run CMD in HOST's namespace (hub, a, b), with PREFECT_API_URL set
#   two-hosts.sh kill HOST        a host dies: SIGKILL its worker, its engine and every process of its sandboxes
#   two-hosts.sh revive HOST      it comes back: its engine, then its worker (which reaps the dead sandboxes)
#   two-hosts.sh down             stop everything and delete the namespaces (STATE stays: logs)
# Environment: TF_HOSTS_STATE (default /tmp/tf-hosts), TF_HOSTS_PREFIX (namespace prefix, default tf),
#   TF_PYTHON (the interpreter with trajforge; default: this checkout's .venv/bin/python).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${TF_HOSTS_STATE:-/tmp/tf-hosts}"
PREFIX="${TF_HOSTS_PREFIX:-tf}"
PY="${TF_PYTHON:-$REPO/.venv/bin/python}"
BIN="$(dirname "$PY")"
NET=198.51.100
HUB="$NET.1"
BASE_IMAGE="${TF_BASE_IMAGE:-trajforge/base:latest}"
export PREFECT_API_URL="http://$HUB:4200/api"
export DASK_LOGGING__DISTRIBUTED=info  # whatever the caller set: `up` waits for the workers' "Registered to"

addr() { case "$1" in hub) echo "$HUB" ;; a) echo "$NET.2" ;; b) echo "$NET.3" ;; *) echo "no host $1 (hub, a, b)" >&2; exit 2 ;; esac; }
ns() { echo "$PREFIX-$1"; }
inns() { local h="$1"; shift; nsenter --net="/var/run/netns/$(ns "$h")" "$@"; }
sock() { echo "unix://$STATE/$1/d.sock"; }

# start NAME HOST CMD...: in HOST's namespace, its own session (pid = process group), log and pid file in STATE
start() {
  local name="$1" h="$2"; shift 2
  if alive "$name"; then return 0; fi
  mkdir -p "$STATE/logs" "$STATE/run"
  setsid nsenter --net="/var/run/netns/$(ns "$h")" "$@" >"$STATE/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/run/$name.pid"
}
alive() { [ -f "$STATE/run/$1.pid" ] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }
stop() {  # stop NAME [SIGNAL]: the whole process group
  local pidf="$STATE/run/$1.pid"
  [ -f "$pidf" ] || return 0
  local pid; pid="$(cat "$pidf")"
  kill "-${2:-TERM}" -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$pidf"
}
wait_for() {  # wait_for WHAT SECONDS CMD...: until CMD succeeds
  local what="$1" limit="$2"; shift 2
  for _ in $(seq 1 $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "$what did not come up within ${limit}s (logs: $STATE/logs/)" >&2
  return 1
}
http_ok() { inns hub "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1"; }

net_up() {
  ip netns list | grep -qw "$(ns hub)" && return 0
  for h in hub a b; do ip netns add "$(ns "$h")"; ip -n "$(ns "$h")" link set lo up; done
  ip -n "$(ns hub)" link add br0 type bridge
  ip -n "$(ns hub)" addr add "$HUB/24" dev br0
  ip -n "$(ns hub)" link set br0 up
  for h in a b; do
    ip link add "$PREFIX-$h-eth" type veth peer name "$PREFIX-$h-hub"
    ip link set "$PREFIX-$h-eth" netns "$(ns "$h")"
    ip link set "$PREFIX-$h-hub" netns "$(ns hub)"
    ip -n "$(ns hub)" link set "$PREFIX-$h-hub" master br0 up
    ip -n "$(ns "$h")" addr add "$(addr "$h")/24" dev "$PREFIX-$h-eth"
    ip -n "$(ns "$h")" link set "$PREFIX-$h-eth" up
  done
}

engine_up() {  # engine_up HOST: its dockerd, the base image in it
  local h="$1" d="$STATE/$1"
  mkdir -p "$d"
  start "dockerd-$h" "$h" dockerd --data-root "$d/root" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
    -H "$(sock "$h")" --bridge=none --iptables=false --ip6tables=false --insecure-registry "$HUB:5000"
  wait_for "dockerd of $h" 60 docker -H "$(sock "$h")" version
  if ! docker -H "$(sock "$h")" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    docker save "$BASE_IMAGE" | docker -H "$(sock "$h")" load -q >/dev/null
  fi
}

worker_up() {  # worker_up HOST: a Dask worker naming HOST's engine; it reaps dead sandboxes as it joins
  local h="$1"
  start "worker-$h" "$h" env TRAJFORGE_DOCKER_HOST="$(sock "$h")" "$BIN/dask" worker "tcp://$HUB:8786" \
    --host "$(addr "$h")" --name "host-$h" --nworkers 1 --nthreads "${TF_HOSTS_THREADS:-2}" --no-dashboard \
    --local-directory "$STATE/$h/dask" --preload trajforge.flows.dask_preload
  wait_for "the Dask worker of $h" 60 grep -q "Registered to" "$STATE/logs/worker-$h.log"
}

up() {
  command -v docker-registry >/dev/null || { echo "docker-registry is missing (make setup installs it)" >&2; exit 1; }
  mkdir -p "$STATE/registry"
  net_up
  cat > "$STATE/registry/config.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $STATE/registry/data}, delete: {enabled: true}}
http: {addr: "$HUB:5000"}
EOF
  start registry hub docker-registry serve "$STATE/registry/config.yml"
  start scheduler hub "$BIN/dask" scheduler --host "$HUB" --port 8786 --no-dashboard
  start prefect hub env PREFECT_HOME="$STATE/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false \
    "$BIN/prefect" server start --host "$HUB" --port 4200
  wait_for "the registry" 30 http_ok "http://$HUB:5000/v2/"
  wait_for "the Prefect server" 120 http_ok "http://$HUB:4200/api/health"
  for h in a b; do engine_up "$h"; done
  for h in a b; do worker_up "$h"; done
  echo "up: scheduler tcp://$HUB:8786, registry $HUB:5000, Prefect $PREFECT_API_URL; engines $(sock a) $(sock b)"
}

kill_host() {  # every process of HOST: its worker, its engine, the engine's shims and what runs in its sandboxes
  local h="$1"
  stop "worker-$h" KILL
  MARK="$STATE/$h/exec" "$PY" - <<'EOF'
import os, psutil
mark, doomed = os.environ["MARK"], []
for p in psutil.process_iter(["cmdline"]):
    if p.pid != os.getpid() and any(mark in a for a in (p.info["cmdline"] or [])):
        doomed += [p, *p.children(recursive=True)]
for p in doomed:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
EOF
  # what a reboot clears: the mounts of its containers and the engine's run-time folder (pid files, sockets)
  awk -v d="$STATE/$h/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$STATE/$h/exec" "$STATE/run/dockerd-$h.pid" "$STATE/$h/dockerd.pid"
}

down() {
  for h in a b; do stop "worker-$h"; done
  stop prefect; stop scheduler; stop registry
  for h in a b; do
    if alive "dockerd-$h"; then
      docker -H "$(sock "$h")" ps -aq | xargs -r docker -H "$(sock "$h")" rm -f >/dev/null 2>&1 || true
      stop "dockerd-$h"
    fi
    kill_host "$h" 2>/dev/null || true
  done
  for h in hub a b; do ip netns del "$(ns "$h")" 2>/dev/null || true; done
}

status() {
  for part in registry scheduler prefect dockerd-a dockerd-b worker-a worker-b; do
    if alive "$part"; then echo "$part: running (pid $(cat "$STATE/run/$part.pid"))"; else echo "$part: not running"; fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  run) shift; h="$1"; shift; addr "$h" >/dev/null; inns "$h" "$@" ;;
  kill) addr "$2" >/dev/null; kill_host "$2" ;;
  revive) addr "$2" >/dev/null; engine_up "$2"; worker_up "$2" ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
