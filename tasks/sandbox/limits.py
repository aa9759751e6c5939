"""Resource limits of sandboxes and image builds, and which of them this Docker engine can enforce.

Every sandbox gets RLIMIT_FSIZE (`file_size_mb`) and RLIMIT_NOFILE (`open_files`); its writable layer
is capped at `disk_mb` where the engine's storage driver supports `--storage-opt size` (overlay2 on
xfs mounted with pquota, btrfs, zfs, devicemapper). Elsewhere (overlay2 on ext4, the common case) no
total cap exists and the per-file cap is what bounds a runaway writer; a tmpfs is deliberately not
used instead: a mount would take its folder out of the root-filesystem walk change sets rely on.
Whether the cap works is learnt from the first sandbox create (the engine refuses the option where it
cannot enforce it) and remembered per engine. Image builds (legacy builder: one container per
step) get memory without swap, a CPU quota and the same ulimits; the build API has no pids limit.
"""

from __future__ import annotations

import json
import threading

import docker
import docker.errors
from docker.types import Ulimit

from ...schemas.config import SandboxConfig

_CAP: dict[str, bool] = {}  # engine (base url) -> whether `storage_opt size` is enforced
_LOCK = threading.Lock()
CPU_PERIOD = 100_000


def ulimits(cfg: SandboxConfig) -> list[Ulimit]:
    fsize = cfg.file_size_mb << 20  # RLIMIT_FSIZE is in bytes
    return [Ulimit(name="fsize", soft=fsize, hard=fsize),
            Ulimit(name="nofile", soft=cfg.open_files, hard=cfg.open_files)]


def storage_cap(client: docker.DockerClient) -> bool | None:
    """Whether this engine caps a container's writable layer (None: not known yet)."""
    return _CAP.get(client.api.base_url)


def _is_storage_opt_refusal(err: Exception) -> bool:
    text = str(err).lower()
    return "storage-opt" in text or "storage opt" in text or "storageopt" in text


def create_capped(client: docker.DockerClient, image: str, cfg: SandboxConfig, **kw):
    """`containers.create(image, **kw)` with the writable-layer cap when the engine enforces it; the
    first refusal marks the engine as unable and the container is created without it."""
    known = storage_cap(client)
    if known is False:
        return client.containers.create(image, **kw)
    try:
        container = client.containers.create(image, storage_opt={"size": f"{cfg.disk_mb}m"}, **kw)
    except docker.errors.APIError as err:
        if not _is_storage_opt_refusal(err):
            raise
        with _LOCK:
            _CAP[client.api.base_url] = False
        return client.containers.create(image, **kw)
    with _LOCK:
        _CAP[client.api.base_url] = True
    return container


def probe_storage_cap(client: docker.DockerClient, image: str, labels: dict[str, str]) -> tuple[bool, str]:
    """(enforced, why) from a create of a throwaway container (never started, removed at once)."""
    try:
        c = client.api.create_container(image, command=["true"], labels=labels,
                                        host_config=client.api.create_host_config(storage_opt={"size": "64m"}))
    except docker.errors.APIError as err:
        if _is_storage_opt_refusal(err):
            return False, str(getattr(err, "explanation", None) or err)
        raise
    client.api.remove_container(c["Id"], force=True)
    return True, "the engine accepts --storage-opt size"


def build_params(cfg: SandboxConfig) -> dict[str, str | int]:
    """Query parameters of `/build` limiting each build step's container (memory without swap, CPU
    quota, file size and open files)."""
    mem = cfg.build_memory_mb << 20
    fsize = cfg.file_size_mb << 20
    return {"memory": mem, "memswap": mem, "cpuperiod": CPU_PERIOD, "cpuquota": int(cfg.build_cpus * CPU_PERIOD),
            "ulimits": json.dumps([{"Name": "fsize", "Soft": fsize, "Hard": fsize},
                                   {"Name": "nofile", "Soft": cfg.open_files, "Hard": cfg.open_files}])}
