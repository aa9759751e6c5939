#!/usr/bin/env bash
# Debian packages the persistent stack and the report tests need: PostgreSQL 15 (Prefect's database
# when several workers poll it), Chromium (headless page checks and screenshots) and docker-compose
# (`docker compose config` checks of deploy/compose.yaml), docker-registry (images by digest across engines,
# `sandbox.registry`), iproute2 (two hosts on one machine) and npm (MCP servers pinned as npm packages). Installs only what is missing; no-op otherwise.
set -euo pipefail
want=()
command -v pg_ctlcluster >/dev/null 2>&1 || [ -x /usr/lib/postgresql/15/bin/pg_ctl ] || want+=(postgresql)
command -v chromium >/dev/null 2>&1 || want+=(chromium)
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || want+=(docker-compose)
command -v docker-registry >/dev/null 2>&1 || want+=(docker-registry)
command -v ip >/dev/null 2>&1 || want+=(iproute2)  # network namespaces: deploy/hosts/two-hosts.sh
command -v npm >/dev/null 2>&1 || want+=(npm)  # locking MCP servers pinned as npm packages (envs import)
command -v git >/dev/null 2>&1 || want+=(git)  # the judge reads a repository's config with git's own parser (judge/directives.py)
command -v strace >/dev/null 2>&1 || want+=(strace)  # the judge traces test runs from the host (judge/trace.py)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${want[*]} (install them as root: apt-get install ${want[*]})" >&2
  exit 1
fi
echo "installing ${want[*]} ..."
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
