"""Reaping sandboxes that outlived their run (operational: no stage fingerprints this module).

Every sandbox carries `trajforge.sandbox`, `trajforge.owner` (host:pid:start time, `engine.identity`) and
`trajforge.build` labels. A sandbox whose owning process is gone, or any sandbox of a build that is
about to (re)start, is removed. Each Dask worker reaps its own host's engine. A build's sandboxes
are reaped by build id only by the holder of that build's lease (tasks/engine/lease.py): a second
driver of a live build stops before it reaps anything, so live sandboxes of other drivers are never
touched. The commits of venue `fresh` (labelled `trajforge.fresh`) are reaped by the same rule.
"""

from __future__ import annotations

import socket

import docker
import docker.errors

from ..engine.identity import owner_alive
from .fresh import FRESH_LABEL

LABEL = "trajforge.sandbox"


def reap_here(build_id: str | None = None, engine: str | None = None) -> int:
    """On the calling host: sandboxes of dead owners, plus every sandbox of `build_id` (a build about
    to (re)start has none running). Run on each Dask worker so every host's engine is cleaned: the
    engine this worker's episodes use ($TRAJFORGE_DOCKER_HOST, else the config's `engine`, else local)."""
    from ...schemas.config import SandboxConfig
    from .container import docker_client

    client = docker_client(sandbox=SandboxConfig(engine=engine))  # the worker's variable still wins
    try:
        return reap_orphans(client) + (reap_orphans(client, build_id=build_id) if build_id else 0)
    finally:
        client.close()


def reap_orphans(client: docker.DockerClient, build_id: str | None = None) -> int:
    """Remove sandboxes of this host whose owning process is gone (or, with `build_id`, every
    sandbox of that build: none may outlive its stage). Returns how many were removed."""
    host = socket.gethostname()
    removed = 0
    filters = {"label": [LABEL] + ([f"trajforge.build={build_id}"] if build_id else [])}
    # sparse: one listing call; a full listing inspects each container and fails with NotFound when
    # one is removed meanwhile (another build on this host finishing its sandboxes)
    for c in client.containers.list(all=True, filters=filters, sparse=True):
        owner = (c.attrs.get("Labels") or {}).get("trajforge.owner", "")
        if owner.partition(":")[0] != host:
            continue
        if build_id is None and owner_alive(owner) is not False:
            continue  # the owner is alive (or cannot be told): never touched
        try:
            client.api.remove_container(c.id, force=True, v=True)
            removed += 1
        except docker.errors.DockerException:  # gone already, or being removed
            pass
    # the commits venue `fresh` judges from (fresh.py) carry their sandbox's labels: the same rule
    filters = {"label": [FRESH_LABEL + "=1"] + ([f"trajforge.build={build_id}"] if build_id else [])}
    for img in client.images.list(filters=filters):
        owner = (img.labels or {}).get("trajforge.owner", "")
        if owner.partition(":")[0] != host or (build_id is None and owner_alive(owner) is not False):
            continue
        try:
            client.api.remove_image(img.id, force=True)
            removed += 1
        except docker.errors.DockerException:
            pass
    return removed
