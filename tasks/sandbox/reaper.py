"""Reaping sandboxes that outlived their run (operational: no stage fingerprints this module).

Every sandbox carries `trajforge.sandbox`, `trajforge.owner` (host:pid:start time) and
`trajforge.build` labels. A sandbox whose owning process is gone, or any sandbox of a build that is
about to (re)start, is removed. Each Dask worker reaps its own host's engine. A build's sandboxes
are reaped by build id only by the holder of that build's lease (tasks/engine/lease.py): a second
driver of a live build stops before it reaps anything, so live sandboxes of other drivers are never
touched.
"""

from __future__ import annotations

import os
import socket

import docker
import docker.errors

LABEL = "trajforge.sandbox"


def _process_identity(pid: int) -> str | None:
    """`pid:start time` of a live process, or None. PIDs wrap (32768 here, and every `docker exec`
    spends several), so a pid alone could name a newer process than the one that owned a sandbox."""
    import psutil

    try:
        return f"{pid}:{psutil.Process(pid).create_time():.2f}"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return f"{pid}:?"


def owner_label() -> str:
    return f"{socket.gethostname()}:{_process_identity(os.getpid())}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process an `owner_label()` names still runs: None when that cannot be told from
    here (another host, or no pid in the label). The one liveness check of sandboxes and build leases."""
    host, _, ident = owner.partition(":")
    pid, _, started = ident.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    now = _process_identity(int(pid))
    return now is not None and (now == ident or now.endswith(":?") or not started)


def reap_here(build_id: str | None = None) -> int:
    """On the calling host: sandboxes of dead owners, plus every sandbox of `build_id` (a build about
    to (re)start has none running). Run on each Dask worker so every host's engine is cleaned."""
    from .container import docker_client

    client = docker_client()
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
            client.api.remove_container(c.id, force=True)
            removed += 1
        except docker.errors.DockerException:  # gone already, or being removed
            pass
    return removed
