"""The local engine: the Docker engine this process is configured for (`DOCKER_HOST`, else the default
socket), as `docker` on this host talks to it. The default provider (no `sandbox.engine`)."""

from __future__ import annotations

import docker

from ....schemas.config import SandboxConfig
from ..errors import DockerUnavailable
from .base import Capabilities, Provider, docker_capabilities

# a unix-socket client's base URL (docker-py names every unix socket so): the engine shares this host
ON_THIS_HOST = "http+docker://localhost"


class LocalEngine(Provider):
    name, schemes = "local", ("", "local")

    def client(self, pool_size: int = 10) -> docker.DockerClient:
        try:
            client = docker.from_env(timeout=120, max_pool_size=max(10, pool_size))
            client.ping()
            return client
        except Exception as err:  # docker raises several types for "no engine"
            raise DockerUnavailable(
                "cannot reach a Docker engine "
                f"({err.__class__.__name__}: {err}). Start one with `dockerd --bridge=none &` as root "
                "(install it with `apt-get install -y docker.io`), or run `make setup`, which does both."
            ) from None

    def capabilities(self, client: docker.DockerClient, sandbox: SandboxConfig | None = None) -> Capabilities:
        return docker_capabilities(client, sandbox, on_this_host=client.api.base_url == ON_THIS_HOST)
