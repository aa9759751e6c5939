#!/usr/bin/env bash
# Make another local base image offline, for imported Dockerfiles whose registry `FROM` has no local
# stand-in: debootstrap SUITE from MIRROR -> docker import -> the same thin layer as the default base
# (agent user, work dir). Usage: add-base.sh NAME SUITE [MIRROR] [PACKAGES]; tags trajforge/base-NAME:latest.
# Idempotent: the tag for this recipe (suite, mirror, packages, layer) is reused when present.
# `trajforge images base add` runs this and prints the alias line to add to `synthesize.image_aliases`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"; suite="$2"
mirror="${3:-http://deb.debian.org/debian}"
packages="${4:-python3,python3-pytest,git,sqlite3,jq,procps,coreutils,findutils,grep,sed,gawk,diffutils,less,file,ca-certificates}"
components="${COMPONENTS:-main}"
recipe=$(printf '%s\n' "$suite" "$mirror" "$packages" "$components" | cat - "$here/base/Dockerfile" | sha256sum | cut -c1-12)
rootfs="trajforge/rootfs:${suite}-$(printf '%s %s %s' "$mirror" "$packages" "$components" | sha256sum | cut -c1-8)"
tag="trajforge/base-${name}:${recipe}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  docker tag "$tag" "trajforge/base-${name}:latest"; echo "base image $tag present"; exit 0
fi
if ! docker image inspect "$rootfs" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "debootstrap $suite from $mirror ($packages) ..."
  extra=(); script=()
  if [[ "$mirror" == *ubuntu* ]]; then  # Ubuntu from a Debian host: its keyring, and gutsy's script for new suites
    [ -e /usr/share/keyrings/ubuntu-archive-keyring.gpg ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ubuntu-keyring >/dev/null
    extra=(--keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg)
    [ -e "/usr/share/debootstrap/scripts/$suite" ] || script=(/usr/share/debootstrap/scripts/gutsy)
  fi
  debootstrap --variant=minbase --components="$components" --include="$packages" "${extra[@]}" "$suite" \
    "$work/rootfs" "$mirror" "${script[@]}" >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -c . | docker import - "$rootfs" >/dev/null
fi
log="${TMPDIR:-/tmp}/trajforge-base-${name}.log"
DOCKER_BUILDKIT=0 docker build -q --build-arg "ROOTFS=$rootfs" -t "$tag" "$here/base" >/dev/null 2>"$log" \
  || { cat "$log"; exit 1; }
docker tag "$tag" "trajforge/base-${name}:latest"
echo "built base image $tag"
