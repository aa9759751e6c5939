"""A Docker engine by address: `unix:///path/d.sock` (or the bare path), `tcp://host:2376` with TLS, or
`ssh://user@host`. Invariants: a `tcp://` engine is never spoken to without TLS that verifies the
engine (an open Docker port is root on its host for anyone): the CA and client certificate come from
`$TRAJFORGE_DOCKER_CERT_PATH`, else `$DOCKER_CERT_PATH`, else `~/.docker` (`ca.pem`, `cert.pem`,
`key.pem`, as the `docker` CLI reads them). Only a unix-socket engine shares this host's filesystem,
so only it may have `host_reads`."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import docker
import docker.errors
from docker.tls import TLSConfig

from ....schemas.config import SandboxConfig
from ..errors import DockerUnavailable
from .base import Capabilities, Provider, docker_capabilities

CERT_FILES = ("ca.pem", "cert.pem", "key.pem")


def cert_dir() -> str:
    return (os.environ.get("TRAJFORGE_DOCKER_CERT_PATH") or os.environ.get("DOCKER_CERT_PATH")
            or os.path.join(os.path.expanduser("~"), ".docker"))


class DockerURL(Provider):
    name, schemes = "docker-url", ("unix", "tcp", "ssh")

    def __init__(self, url: str | None = None, origin: str = "sandbox.engine"):
        if url and url.startswith("/"):
            url = "unix://" + url
        super().__init__(url, origin)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url or "").scheme

    def _tls(self) -> TLSConfig:
        d = cert_dir()
        absent = [f for f in CERT_FILES if not os.path.isfile(os.path.join(d, f))]
        if absent:
            raise DockerUnavailable(
                f"the Docker engine {self} (from {self.origin}) is tcp://, which trajforge speaks only with TLS, "
                f"and {d} lacks {', '.join(absent)}: put the engine's CA and a client certificate there "
                "(or name their folder with $TRAJFORGE_DOCKER_CERT_PATH)")
        return TLSConfig(client_cert=(os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")),
                         ca_cert=os.path.join(d, "ca.pem"), verify=True)

    def client(self, pool_size: int = 10) -> docker.DockerClient:
        kw: dict = {"base_url": self.url, "timeout": 120, "max_pool_size": max(10, pool_size)}
        if self.scheme == "tcp":
            kw["tls"] = self._tls()
        elif self.scheme == "ssh":
            kw["use_ssh_client"] = True  # the system `ssh` and its config (keys, known hosts)
        try:
            client = docker.DockerClient(**kw)
        except docker.errors.DockerException as err:  # e.g. ssh:// without paramiko (`pip install 'docker[ssh]'`)
            raise self.unreachable(err) from None
        try:
            client.ping()
        except Exception as err:
            client.close()
            raise self.unreachable(err) from None
        return client

    def capabilities(self, client: docker.DockerClient, sandbox: SandboxConfig | None = None) -> Capabilities:
        return docker_capabilities(client, sandbox, on_this_host=self.scheme == "unix")
