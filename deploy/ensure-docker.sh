#!/usr/bin/env bash
# Make sure a Docker engine answers. As root on a fresh Debian machine: install docker.io and start
# dockerd with --bridge=none (sandboxes run without network; no container gets a private address).
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "No Docker engine is reachable and we are not root: start dockerd (or ask an admin), then retry." >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "installing docker.io ..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
echo "starting dockerd --bridge=none ..."
mkdir -p /var/log
# setsid: its own session, so a caller whose process group is killed (a CI step, a job runner) does not take the engine down
setsid nohup dockerd --bridge=none >/var/log/trajforge-dockerd.log 2>&1 < /dev/null &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && { echo "dockerd is up"; exit 0; }
  sleep 1
done
echo "dockerd did not come up; see /var/log/trajforge-dockerd.log:" >&2
tail -20 /var/log/trajforge-dockerd.log >&2
exit 1
