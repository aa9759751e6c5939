"""Content-addressed environment images, built once in their own step before any rollout.

tag = trajforge/env:<sha256(base image id, final Dockerfile, context files)[:16]>. An image whose tag
exists is never rebuilt, so identical environments share one image across builds. Builds use the
legacy builder with no network (no registry is reachable): `FROM` images of imported Dockerfiles are
mapped through the alias table (fnmatch patterns -> local images, `{base}` = the base image), and an
image that is neither aliased nor present locally fails with the tail of the build log. Each step's
container is limited (memory without swap, a CPU quota, file size and open files: `sandbox.build_*`;
the build API has no pids limit) and a build past its timeout is cancelled.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import re
import tarfile
import time

import docker
import docker.errors

from ...schemas.common import FileSpec
from ...schemas.config import SandboxConfig
from ...schemas.environment import EnvSpec
from ..sandbox import AGENT_UID, DockerUnavailable
from ..sandbox.limits import build_params

LABEL = {"trajforge.image": "env"}
DOCKERFILE_NAME = ".trajforge.Dockerfile"
DEFAULT_DOCKERFILE = """FROM {base}
COPY --chown={uid}:{uid} work/ {workdir}/
WORKDIR {workdir}
"""
SETUP = """COPY --chown={uid}:{uid} .tf-setup.sh /tmp/.tf-setup.sh
USER {uid}:{uid}
RUN cd {workdir} && bash -e /tmp/.tf-setup.sh && rm -f /tmp/.tf-setup.sh
USER root
"""
# appended to imported Dockerfiles: the agent user owns the work dir (numeric: the image may have no passwd entry)
HANDOVER = """USER root
RUN mkdir -p {workdir} /home/agent && chown -R {uid}:{uid} {workdir} /home/agent
WORKDIR {workdir}
"""
# ... or, for a root agent (what imported tasks assume), the image as its Dockerfile made it, work dir present
HANDOVER_ROOT = """USER root
RUN mkdir -p {workdir}
WORKDIR {workdir}
"""
FROM_LINE = re.compile(r"^(\s*FROM\s+)(--platform=\S+\s+)?(\S+)(.*)$", re.I | re.M)


class ImageBuildError(RuntimeError):
    """A Dockerfile that failed to build; `log_tail` holds the last lines of the build log."""

    def __init__(self, message: str, log_tail: str):
        super().__init__(f"{message}\n{log_tail}")
        self.log_tail = log_tail


def base_image_id(client: docker.DockerClient, base: str) -> str:
    try:
        return client.images.get(base).id
    except docker.errors.ImageNotFound:
        raise DockerUnavailable(f"base image {base!r} is missing: run `make setup` "
                                "(or deploy/images/build-base.sh) to build it offline") from None


def map_from(dockerfile: str, aliases: dict[str, str], base_id: str) -> str:
    """Rewrite `FROM image` lines through the alias table (first matching pattern wins)."""
    stages: set[str] = set()

    def sub(m: re.Match) -> str:
        image, rest = m.group(3), m.group(4)
        alias = re.search(r"\s+AS\s+(\S+)", rest, re.I)
        if alias:
            stages.add(alias.group(1).lower())
        if image.lower() in stages:
            return m.group(0)
        for pattern, target in aliases.items():
            if fnmatch.fnmatch(image, pattern):
                return f"{m.group(1)}{target.format(base=base_id)}{rest}"
        return m.group(0)

    return FROM_LINE.sub(sub, dockerfile)


def render(env: EnvSpec, base_id: str, aliases: dict[str, str]) -> tuple[str, list[FileSpec]]:
    """The Dockerfile and build-context files that produce `env`'s image."""
    if env.dockerfile is None:
        text = DEFAULT_DOCKERFILE.format(base=base_id, uid=AGENT_UID, workdir=env.workdir)
        context = [FileSpec(path=f"work/{f.path.strip('/')}", content=f.content, mode=f.mode) for f in env.files]
    else:
        text = map_from(env.dockerfile, aliases, base_id).rstrip("\n") + "\n"
        text += (HANDOVER_ROOT if env.agent_user == "root" else HANDOVER).format(uid=AGENT_UID, workdir=env.workdir)
        context = list(env.context)
    if env.setup:
        text += SETUP.format(uid=AGENT_UID, workdir=env.workdir)
        context.append(FileSpec(path=".tf-setup.sh", content="\n".join(env.setup) + "\n", mode=0o755))
    return text, context


def _context_tar(dockerfile: str, files: list[FileSpec]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        add(DOCKERFILE_NAME, dockerfile.encode())  # not "Dockerfile": an imported context may have its own
        d = tarfile.TarInfo("work")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(d)
        for f in files:
            add(f.path.strip("/"), f.content.encode(), f.mode)
    return buf.getvalue()


def image_tag(base_id: str, env: EnvSpec, aliases: dict[str, str] | None = None) -> str:
    dockerfile, context = render(env, base_id, aliases or {})
    payload = json.dumps([base_id, dockerfile, [f.model_dump() for f in context]], sort_keys=True)
    return "trajforge/env:" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def _build(client: docker.DockerClient, context: bytes, tag: str, limits: SandboxConfig, timeout_s: float):
    """The decoded log stream of a legacy-builder build whose step containers are limited (`build_params`:
    docker-py's `build` passes neither a CPU quota nor ulimits) and have no network."""
    api = client.api
    params = {"t": tag, "dockerfile": DOCKERFILE_NAME, "rm": True, "forcerm": True, "labels": json.dumps(LABEL),
              "networkmode": "none", **build_params(limits)}
    response = api._post(api._url("/build"), data=context, params=params, stream=True, timeout=timeout_s,
                         headers={"Content-Type": "application/tar"})
    return response, api._stream_helper(response, decode=True)


def ensure_image(client: docker.DockerClient, base: str, env: EnvSpec,
                 aliases: dict[str, str] | None = None, timeout_s: float = 900,
                 limits: SandboxConfig | None = None) -> tuple[str, bool]:
    """Return (tag, built_now). Raises ImageBuildError with the tail of the log on failure, also when the
    build runs past `timeout_s` (the connection is dropped, which cancels the build). `limits`: the
    build containers' memory, CPU and ulimits (default: SandboxConfig's defaults)."""
    base_id = base_image_id(client, base)
    aliases = aliases or {}
    tag = image_tag(base_id, env, aliases)
    try:
        client.images.get(tag)
        return tag, False
    except docker.errors.ImageNotFound:
        pass
    dockerfile, context = render(env, base_id, aliases)
    log: list[str] = []
    deadline = time.monotonic() + timeout_s
    response = None
    try:
        response, chunks = _build(client, _context_tar(dockerfile, context), tag, limits or SandboxConfig(), timeout_s)
        for chunk in chunks:
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                raise ImageBuildError(f"image for {env.env_id} failed to build: {chunk['error'].strip()}",
                                      "".join(log)[-2000:])
            if time.monotonic() > deadline:
                raise ImageBuildError(f"image for {env.env_id} failed to build: still building after "
                                      f"{timeout_s:g}s", "".join(log)[-2000:])
    except ImageBuildError:
        raise
    except docker.errors.APIError as err:
        raise ImageBuildError(f"image for {env.env_id} failed to build: {err}", "".join(log)[-2000:]) from None
    except Exception as err:  # read timeout of a hung build, dropped connection
        raise ImageBuildError(f"image for {env.env_id} failed to build: {err.__class__.__name__}: {err}",
                              "".join(log)[-2000:]) from None
    finally:
        if response is not None:
            response.close()
    return tag, True


def prune_images(client: docker.DockerClient, keep: set[str]) -> list[str]:
    """Remove trajforge env images not in `keep`; returns removed tags."""
    removed = []
    for img in client.images.list(filters={"label": "trajforge.image=env"}):
        for tag in img.tags:
            if tag not in keep:
                try:
                    client.images.remove(tag)
                    removed.append(tag)
                except docker.errors.APIError:
                    pass
    return removed
