"""The provider seam: where sandboxes run, and what that place can enforce.

A `Provider` is one kind of engine (the local Docker engine, a Docker engine by URL, ...), made for
one engine address. It hands out a Docker-API client (`client`) and states its `Capabilities`, read
from the engine and this process, never assumed. A build's settings `needs` some of them; `check`
refuses an engine that lacks one with an `EngineLacks` naming the provider, the capability and the
setting that needs it, before any sandbox of the stage is created (an infrastructure error, never
the model's).
"""

from __future__ import annotations

import os
import socket
import threading
from abc import ABC, abstractmethod
from typing import ClassVar, get_args

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict

from ....schemas.config import EngineCapability, SandboxConfig
from ..errors import DockerUnavailable
from ..limits import build_cgroup, engine_key, probe_storage_cap, storage_cap
from ..reaper import LABEL

MEANING: dict[str, str] = {
    "storage_cap": "a cap on each sandbox's writable layer (`--storage-opt size`)",
    "build_pids": "a pids cgroup over the image builds' containers",
    "tmpfs": "tmpfs mounts (a size-capped work dir)",
    "user_namespaces": "user namespaces (the engine remaps container root to an unprivileged host user)",
    "host_reads": "host-side reads of a container's writable layer (the verifier's outside view: toolchain, "
                  "ctime and test-write checks)",
}


class Capabilities(BaseModel):
    """What an engine enforces or allows, as seen from this process. Field names are `EngineCapability`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    storage_cap: bool = False
    build_pids: bool = False
    tmpfs: bool = False
    user_namespaces: bool = False
    host_reads: bool = False

    def missing(self, needs: dict[str, str]) -> list[str]:
        """The capabilities of `needs` ({capability: the setting needing it}) this engine lacks, in order."""
        return [c for c in needs if not getattr(self, c)]

    def line(self) -> str:
        return ", ".join(f"{c} {'yes' if getattr(self, c) else 'no'}" for c in type(self).model_fields)


assert tuple(Capabilities.model_fields) == get_args(EngineCapability), "Capabilities must mirror EngineCapability"


class EngineLacks(DockerUnavailable):
    """An engine without a capability the build's settings need: refused before any sandbox is created."""


class Provider(ABC):
    """One kind of sandbox engine, made for one address (`url`; None: the provider's default).

    Invariants: `client()` returns a connected Docker-API client or raises `DockerUnavailable` naming
    this provider and its address; `capabilities()` reads, never assumes; a provider adds itself with
    one `register(...)` line (`providers/__init__.py`, or a config's `plugins:` module)."""

    name: ClassVar[str]
    schemes: ClassVar[tuple[str, ...]]  # the URL schemes it serves (`""`: no URL at all)

    def __init__(self, url: str | None = None, origin: str = "sandbox.engine"):
        self.url, self.origin = url, origin

    def __str__(self) -> str:
        return f"{self.name} {self.url}" if self.url else self.name

    @abstractmethod
    def client(self, pool_size: int = 10) -> docker.DockerClient:
        """A client whose HTTP pool fits `pool_size` concurrent calls, its engine answering."""

    @abstractmethod
    def capabilities(self, client: docker.DockerClient, sandbox: SandboxConfig | None = None) -> Capabilities:
        """What this engine can do for sandboxes configured by `sandbox` (default settings if None)."""

    def unreachable(self, err: Exception) -> DockerUnavailable:
        return DockerUnavailable(f"cannot reach the Docker engine {self} (from {self.origin}, on host "
                                 f"{socket.gethostname()}): {err.__class__.__name__}: {err}")


_CAPS: dict[tuple, Capabilities] = {}
_LOCK = threading.Lock()


def docker_capabilities(client: docker.DockerClient, sandbox: SandboxConfig | None, on_this_host: bool) -> Capabilities:
    """A Docker engine's capabilities from its `info` and this process: `host_reads` where the engine
    shares this host's filesystem (`on_this_host`), uses overlay2 and this process can read its data root;
    `build_pids` where `limits.build_cgroup` sets a cgroup up; `storage_cap` as the engine answered a
    create (probed with the base image when not known yet; False without it). Learnt once per engine."""
    cfg = sandbox or SandboxConfig()
    key = (engine_key(client), cfg.pids_limit, cfg.base_image, on_this_host)
    if key in _CAPS:
        return _CAPS[key]
    info = client.info()
    root = info.get("DockerRootDir") or ""
    layers = os.path.join(root, "overlay2")
    host_reads = (on_this_host and info.get("Driver") == "overlay2" and bool(root)
                  and os.access(layers, os.R_OK | os.X_OK))
    capped = storage_cap(client)
    if capped is None:
        from ..container import owner_label  # (where the sandboxes' owner label comes from)

        try:
            client.images.get(cfg.base_image)
            capped = probe_storage_cap(client, cfg.base_image, {LABEL: "1", "trajforge.owner": owner_label()})[0]
        except docker.errors.DockerException:
            capped = False
    caps = Capabilities(storage_cap=capped, build_pids=build_cgroup(client, cfg) is not None,
                        tmpfs=info.get("OSType", "linux") == "linux",
                        user_namespaces=any("name=userns" in str(o) for o in info.get("SecurityOptions") or []),
                        host_reads=host_reads)
    with _LOCK:
        _CAPS[key] = caps
    return caps


def needs(sandbox: SandboxConfig) -> dict[str, str]:
    """{capability: the setting that needs it} for sandboxes configured by `sandbox`: `work_tmpfs_mb`
    needs tmpfs; `require` lists what the build's integrity settings demand (e.g. `host_reads`, so a
    verifier never judges with its outside view missing)."""
    out: dict[str, str] = {}
    if sandbox.work_tmpfs_mb is not None:
        out["tmpfs"] = "sandbox.work_tmpfs_mb"
    for c in sandbox.require:
        out.setdefault(c, "sandbox.require")
    return out


def check(provider: Provider, caps: Capabilities, wanted: dict[str, str]) -> None:
    """Raise `EngineLacks` naming the provider and each capability of `wanted` it lacks."""
    missing = caps.missing(wanted)
    if missing:
        what = "; ".join(f"{c} ({MEANING[c]}), which {wanted[c]} needs" for c in missing)
        raise EngineLacks(f"the sandbox engine {provider} (from {provider.origin}, on host {socket.gethostname()}) "
                          f"lacks {what}. Point this worker at an engine that has it (sandbox.engine or "
                          f"$TRAJFORGE_DOCKER_HOST), or drop the setting; `trajforge doctor` lists each engine's "
                          "capabilities")
