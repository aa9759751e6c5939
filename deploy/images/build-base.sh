#!/usr/bin/env bash
# Build the local base image offline: debootstrap (Debian's mirror is reachable, no image registry is)
# -> docker import -> a thin Dockerfile layer with the agent user. Idempotent: exits early when the
# tag for this recipe's hash already exists; the imported rootfs is tagged by its package list.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# python3-pytest: imported Terminal-Bench / Harbor tasks run pytest offline (no pip install possible)
# tmux: the interactive terminal harness (trajforge-terminal-v1, tasks/agent/harnesses/terminal.py)
packages="python3,python3-pytest,git,sqlite3,jq,procps,coreutils,findutils,grep,sed,gawk,diffutils,less,file,ca-certificates,tmux"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
recipe_hash=$(cat "$0" "$here/base/Dockerfile" | sha256sum | cut -c1-12)
rootfs="trajforge/rootfs:bookworm-$(echo "$packages" | sha256sum | cut -c1-8)"
tag="trajforge/base:${recipe_hash}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  docker tag "$tag" trajforge/base:latest
  echo "base image $tag present"; exit 0
fi
if ! docker image inspect "$rootfs" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "debootstrap bookworm ($packages) ..."
  debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -c . | docker import - "$rootfs" >/dev/null
fi
DOCKER_BUILDKIT=0 docker build -q --build-arg "ROOTFS=$rootfs" -t "$tag" "$here/base" >/dev/null \
  2>"${TMPDIR:-/tmp}/trajforge-base-build.log" || { cat "${TMPDIR:-/tmp}/trajforge-base-build.log"; exit 1; }
docker tag "$tag" trajforge/base:latest
echo "built base image $tag"
