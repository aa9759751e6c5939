"""Resource limits of sandboxes and image builds, and which of them this Docker engine can enforce.

Every sandbox gets RLIMIT_FSIZE (`file_size_mb`) and RLIMIT_NOFILE (`open_files`); its writable layer
is capped at `disk_mb` where the engine's storage driver supports `--storage-opt size` (overlay2 on
xfs mounted with pquota, btrfs, zfs, devicemapper). Elsewhere (overlay2 on ext4, the common case) no
total cap exists and the per-file cap is what bounds a runaway writer, unless `work_tmpfs_mb` is set
(opt-in): the work dir is then a size-capped tmpfs (memory, counted against `memory_mb`), seeded with
the image's work dir as its owner, and the change-set walk starts there too (`Sandbox._prune`), so
its changes are found as on the root filesystem. Writes outside the work dir stay uncapped.
Whether the cap works is learnt from the first sandbox create (the engine refuses the option where it
cannot enforce it) and remembered per engine. Image builds (legacy builder: one container per
step) get memory without swap, a CPU quota and the same ulimits. The build API has no pids option
(`docker build` has none either), and `ulimit nproc` would not help: the kernel does not enforce
RLIMIT_NPROC on root (the user of build steps here, without user namespaces) and counts it per user
over the whole host. What the legacy builder does honour is `cgroupparent`: where this process can
write the engine's cgroups (a local engine with the `cgroupfs` driver, run as root), build containers
are placed under `/trajforge-build-<N>`, whose `pids.max` N (BUILD_PIDS_FACTOR x `pids_limit`) caps
the processes of all of this host's build steps together (`build_cgroup`); elsewhere they have none.
"""

from __future__ import annotations

import json
import os
import threading

import docker
import docker.errors
from docker.types import Ulimit

from ...schemas.config import SandboxConfig

_CAP: dict[str, bool] = {}  # engine (`engine_key`) -> whether `storage_opt size` is enforced
_BUILD_CG: dict[tuple[str, int], str | None] = {}  # (engine, pids cap) -> cgroup parent of build steps, or None
BUILD_PIDS_FACTOR = 4  # the host's build steps together may run this many times a sandbox's pids
CGROUP_ROOT = "/sys/fs/cgroup"
_LOCK = threading.Lock()
CPU_PERIOD = 100_000


def ulimits(cfg: SandboxConfig) -> list[Ulimit]:
    fsize = cfg.file_size_mb << 20  # RLIMIT_FSIZE is in bytes
    return [Ulimit(name="fsize", soft=fsize, hard=fsize),
            Ulimit(name="nofile", soft=cfg.open_files, hard=cfg.open_files)]


def engine_key(client: docker.DockerClient) -> str:
    """Which engine a client talks to: its base URL, plus the socket path for a unix socket (every one
    of those has the base URL `http+docker://localhost`: two engines on one host must not share a key)."""
    path = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
    return f"{client.api.base_url}{path or ''}"


def storage_cap(client: docker.DockerClient) -> bool | None:
    """Whether this engine caps a container's writable layer (None: not known yet)."""
    return _CAP.get(engine_key(client))


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
            _CAP[engine_key(client)] = False
        return client.containers.create(image, **kw)
    with _LOCK:
        _CAP[engine_key(client)] = True
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
    client.api.remove_container(c["Id"], force=True, v=True)
    return True, "the engine accepts --storage-opt size"


def _pids_cgroup(name: str, cap: int, version: str) -> bool:
    """Create (or update) cgroup `name` of this host with `pids.max` = cap; False if it cannot be done."""
    if version == "2":
        root = CGROUP_ROOT
        with open(os.path.join(root, "cgroup.controllers")) as f:
            if "pids" not in f.read().split():
                return False
        with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
            f.write("+pids")
    else:
        root = os.path.join(CGROUP_ROOT, "pids")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "pids.max"), "w") as f:
        f.write(str(cap))
    with open(os.path.join(path, "pids.max")) as f:
        return f.read().strip() == str(cap)


def build_cgroup(client: docker.DockerClient, cfg: SandboxConfig) -> str | None:
    """The cgroup parent (`/trajforge-build-<N>`) under which image-build containers together run at
    most N = BUILD_PIDS_FACTOR x `pids_limit` processes, or None where this process cannot set one up:
    a remote engine (its cgroups are another host's), the `systemd` cgroup driver (a parent must then
    be a systemd slice), not root, or no pids controller. Learnt once per engine and cap."""
    cap = BUILD_PIDS_FACTOR * cfg.pids_limit
    key = (engine_key(client), cap)
    if key not in _BUILD_CG:
        name, found = f"trajforge-build-{cap}", None
        try:
            info = client.info()
            local = client.api.base_url.startswith("http+docker://localhost")  # the unix socket
            if local and info.get("CgroupDriver") == "cgroupfs" and _pids_cgroup(name, cap, str(info.get("CgroupVersion") or "1")):
                found = "/" + name
        except (OSError, docker.errors.DockerException):
            found = None
        with _LOCK:
            _BUILD_CG[key] = found
    return _BUILD_CG[key]


def build_params(cfg: SandboxConfig, client: docker.DockerClient | None = None) -> dict[str, str | int]:
    """Query parameters of `/build` limiting each build step's container (memory without swap, CPU
    quota, file size and open files; with `client`, processes where `build_cgroup` can cap them)."""
    mem = cfg.build_memory_mb << 20
    fsize = cfg.file_size_mb << 20
    params: dict[str, str | int] = {
        "memory": mem, "memswap": mem, "cpuperiod": CPU_PERIOD, "cpuquota": int(cfg.build_cpus * CPU_PERIOD),
        "ulimits": json.dumps([{"Name": "fsize", "Soft": fsize, "Hard": fsize},
                               {"Name": "nofile", "Soft": cfg.open_files, "Hard": cfg.open_files}])}
    parent = build_cgroup(client, cfg) if client is not None else None
    if parent:
        params["cgroupparent"] = parent
    return params
