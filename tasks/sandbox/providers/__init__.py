"""Sandbox providers: which engine a worker's sandboxes run on, and what it can enforce.

The engine of a process is `$TRAJFORGE_DOCKER_HOST` (set per Dask worker: each host's worker names its
own engine) if set, else the config's `sandbox.engine`, else the local engine. Its URL scheme picks the
provider from `PROVIDERS`; a new provider is one module with a `Provider` subclass plus one
`register(...)` line (here, or in a config's `plugins:` module). Every sandbox, image build and reaper
call gets its client through `connect`.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import docker

from ....schemas.config import SandboxConfig
from ..errors import DockerUnavailable
from .base import MEANING, Capabilities, EngineLacks, Provider, check, needs
from .docker_url import DockerURL
from .local import LocalEngine

ENV = "TRAJFORGE_DOCKER_HOST"
PROVIDERS: dict[str, type[Provider]] = {}  # URL scheme ("" for none) -> provider


def register(provider: type[Provider]) -> None:
    """Serve each of `provider.schemes` with it (a later registration of a scheme replaces the former)."""
    for scheme in provider.schemes:
        PROVIDERS[scheme] = provider


register(LocalEngine)
register(DockerURL)


def engine_url(sandbox: SandboxConfig | None = None) -> tuple[str | None, str]:
    """(the engine address this process uses, where it comes from): `$TRAJFORGE_DOCKER_HOST`, else
    `sandbox.engine`, else None (the local engine)."""
    if os.environ.get(ENV):
        return os.environ[ENV], f"${ENV}"
    if sandbox is not None and sandbox.engine:
        return sandbox.engine, "sandbox.engine"
    return None, "the local default"


def provider_for(url: str | None, origin: str = "sandbox.engine") -> Provider:
    """The registered provider serving `url`'s scheme (a bare path is a unix socket), made for `url`."""
    scheme = "unix" if url and url.startswith("/") else (urlsplit(url).scheme if url else "")
    if scheme not in PROVIDERS:
        known = ", ".join(f"{s}://" for s in sorted(PROVIDERS) if s)
        raise DockerUnavailable(f"{origin}: {url!r} names no sandbox provider (known: {known}, or a socket path)")
    return PROVIDERS[scheme](url or None, origin)


def connect(pool_size: int = 10, sandbox: SandboxConfig | None = None,
            url: str | None = None, origin: str | None = None) -> docker.DockerClient:
    """A client of this process's engine (`engine_url`, or `url`). With `sandbox`, the engine must have
    every capability its settings need (`needs`), else `EngineLacks` before any sandbox is created."""
    if url is None and origin is None:
        url, origin = engine_url(sandbox)
    provider = provider_for(url, origin or "sandbox.engine")
    client = provider.client(pool_size)
    wanted = needs(sandbox) if sandbox is not None else {}
    if wanted:
        try:
            check(provider, provider.capabilities(client, sandbox), wanted)
        except BaseException:
            client.close()
            raise
    return client


__all__ = ["ENV", "MEANING", "PROVIDERS", "Capabilities", "DockerURL", "EngineLacks", "LocalEngine", "Provider",
           "check", "connect", "engine_url", "needs", "provider_for", "register"]
