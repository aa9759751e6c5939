"""Content-addressed environment images, built once in their own step before any rollout.

tag = trajforge/env:<sha256(base image id, final Dockerfile, context files, binary blobs' hashes)[:16]>.
An image whose tag exists is never rebuilt, so identical environments share one image across builds
(and an interrupted import resumes where it stopped). Builds use the legacy builder. `FROM` images of
imported Dockerfiles are mapped through the alias table (fnmatch patterns -> local images, `{base}` =
the base image; the mapping is recorded on the environment, `base_images`), and an image that is
neither aliased nor present locally fails (`base_image_missing`). Build-time network
(`BuildOptions.egress`) is for imported Dockerfiles only (their `apt-get`/`pip` steps); agent-time
network stays none. Under `allowlist` they build on trajforge's build network (`buildnet.py`), whose
only way out is the egress proxy, named to the build by `http_proxy` / `https_proxy` build args carrying
the build's token; any connection the proxy refused (host and port, from its log for that token) fails
the build as `build_egress_refused`, also when the Dockerfile swallowed the error (the image is removed).
`ADD <url>` is fetched by the engine itself, outside any build network: it is refused
(`build_egress_refused`) unless `egress: host`. The image is labelled with the policy that built it
(`trajforge.build_egress`), recorded on the environment (`build_egress`). With a CA bundle, it is copied into every stage and named by `PIP_CERT`,
`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, ... as build args (never persisted in the image config, never
part of the tag); without one configured, the host's own (`host_ca_bundle`: the first of `SSL_CERT_FILE`,
`PIP_CERT`, `REQUESTS_CA_BUNDLE` naming a file) is used, and a build that fails a certificate check says
to pass `--ca-bundle` (`CA_HINT`). Proxies go in as Docker's predefined proxy build args. Each step's
container is limited (memory without swap, a CPU quota, file size and open files: `sandbox.build_*`; the
build API has no pids limit) and a build past its timeout (the task's `build_timeout_s`, else the default) is
cancelled. Every failure carries a cause code (`ImageBuildError.cause`) and the log is handed to
`log_sink` (kept per image by the caller).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable, Mapping

import docker
import docker.errors

from ...schemas.common import FileSpec
from ...schemas.config import BuildImagesConfig, SandboxConfig
from ...schemas.environment import BaseImage, EnvSpec
from ..sandbox import AGENT_UID, DockerUnavailable
from ..sandbox.limits import build_params
from . import kinds
from .blobs import BlobMissing, BlobStore
from .tools.layer import ToolsLayerError

LABEL = {"trajforge.image": "env"}
EGRESS_LABEL = "trajforge.build_egress"
REMOTE_ADD = re.compile(r"^\s*ADD\s+(?:--\S+\s+)*(?P<url>(?:https?|git|ssh|ftp)://\S+|git@\S+)", re.I | re.M)
_HOST_WARNED: list[bool] = []
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


CA_PATH = "/usr/local/share/trajforge-build-ca.crt"
CA_NAME = ".trajforge-build-ca.crt"
CA_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS",
           "UV_NATIVE_TLS_CERT")
HOST_CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE")  # the host's own bundle, in this order
CERT_ERROR = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|SSL certificate problem", re.I)
CA_HINT = ("a TLS certificate check failed during the build: behind a TLS-intercepting proxy, pass --ca-bundle "
           "PATH (e.g. /etc/ssl/certs/ca-certificates.crt) or set synthesize.build.ca_bundle")
# cause codes of a failed build, first match in the log wins (else `build_step_failed`)
CAUSES = (
    ("base_image_missing", re.compile(r"pull access denied|manifest unknown|repository does not exist|"
                                      r"No such image|not found: manifest|failed to resolve reference|"
                                      r"Get \"https?://[^\"]+/v2/", re.I)),  # pulling a FROM image no alias maps
    ("build_fetch_failed", re.compile(r"Temporary failure resolving|Could not resolve|Failed to fetch|"
                                      r"Name or service not known|Network is unreachable|CERTIFICATE_VERIFY_FAILED|"
                                      r"certificate verify failed|SSL certificate problem|"
                                      r"Could not fetch URL|ConnectionError|Connection refused|SSL: ", re.I)),
    ("package_not_found", re.compile(r"Unable to locate package|has no installation candidate|"
                                     r"No matching distribution found|Could not find a version", re.I)),
)


class ImageBuildError(RuntimeError):
    """A Dockerfile that failed to build; `log_tail` holds the last lines of the build log, `cause` a code:
    base_image_missing | build_fetch_failed | package_not_found | build_timeout | blob_missing |
    build_egress_refused (a connection the build policy refused: `refusals` names host and port) |
    reserved_name | artifact_mismatch (a pinned MCP server's locked artifact has other bytes) | artifact_unsafe
    (its npm tarball holds a link or an escaping path, or its lock a path outside node_modules/) | build_step_failed;
    `hint` the fix when the log shows one (a certificate check: `CA_HINT`), also
    leading the message's first line."""

    def __init__(self, message: str, log_tail: str, cause: str | None = None, refusals: tuple = ()):
        self.refusals = tuple(refusals)
        self.hint = CA_HINT if CERT_ERROR.search(f"{message}\n{log_tail}") else None
        if self.hint and self.hint not in message:
            head, _, rest = message.partition(": ")
            message = f"{head}: {self.hint}; {rest}" if rest else f"{message}: {self.hint}"
        super().__init__(f"{message}\n{log_tail}")
        self.log_tail = log_tail
        self.cause = cause or classify(f"{message}\n{log_tail}")


def classify(log: str) -> str:
    for cause, pattern in CAUSES:
        if pattern.search(log):
            return cause
    return "build_step_failed"


@dataclass(frozen=True)
class BuildOptions:
    """How images are built (never what they are: none of this enters an image tag). `egress`: imported
    Dockerfiles build on trajforge's build network through its proxy to `allowlist` (`allowlist`), with no
    network (`none`) or on the host's (`host`); `subnet`: the build network's; `ca_bundle`: a host CA
    bundle copied into networked builds; `proxies`: `http_proxy` / `https_proxy` / `no_proxy` build args
    (`host` only: under `allowlist` the build's proxy is trajforge's); `timeout_s`: a build's limit unless
    the task sets its own."""

    egress: str = "none"
    allowlist: tuple[str, ...] = ()
    subnet: str = "198.51.100.224/27"
    ca_bundle: str | None = None
    proxies: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 900

    def networked(self, env: EnvSpec) -> bool:
        return self.egress != "none" and env.dockerfile is not None

    @classmethod
    def from_config(cls, build: BuildImagesConfig, environ: Mapping[str, str] | None = None) -> "BuildOptions":
        """`synthesize.build` as options; its `ca_bundle`, else the host's own (`host_ca_bundle(environ)`).
        `egress: host` prints a warning (once per process)."""
        if build.egress == "host" and not _HOST_WARNED:
            _HOST_WARNED.append(True)
            print("warning: synthesize.build.egress: host - imported Dockerfiles build on the host's network; "
                  "any RUN step reaches every service on this host (its loopback included)", file=sys.stderr)
        return cls(egress=build.egress, allowlist=build.allowed_hosts(), subnet=build.subnet,
                   ca_bundle=build.ca_bundle or host_ca_bundle(environ), proxies=build.proxies(),
                   timeout_s=build.timeout_s)


def host_ca_bundle(environ: Mapping[str, str] | None = None) -> str | None:
    """The host's own CA bundle: the first of `HOST_CA_VARS` that is set and names a file (default: os.environ)."""
    environ = os.environ if environ is None else environ
    for var in HOST_CA_VARS:
        path = environ.get(var)
        if path and os.path.isfile(path):
            return path
    return None


def base_image_id(client: docker.DockerClient, base: str) -> str:
    try:
        return client.images.get(base).id
    except docker.errors.ImageNotFound:
        raise DockerUnavailable(f"base image {base!r} is missing: run `make setup` "
                                "(or deploy/images/build-base.sh) to build it offline") from None


def map_from(dockerfile: str, aliases: dict[str, str], base_id: str, mapped: dict[str, str] | None = None) -> str:
    """Rewrite `FROM image` lines through the alias table (first matching pattern wins); `mapped`
    collects image -> what it became (the target pattern with `{base}` kept as the base's name)."""
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
                if mapped is not None:
                    mapped[image] = target
                return f"{m.group(1)}{target.format(base=base_id)}{rest}"
        if mapped is not None:
            mapped[image] = image
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


def base_mapping(env: EnvSpec, aliases: dict[str, str], base: str) -> dict[str, str]:
    """{FROM image of env's Dockerfile: the local image it builds on} (`{base}` named as `base`)."""
    if env.dockerfile is None:
        return {}
    mapped: dict[str, str] = {}
    map_from(env.dockerfile, aliases, "{base}", mapped)
    return {k: v.replace("{base}", base) for k, v in mapped.items()}


def with_ca(dockerfile: str) -> str:
    """`dockerfile` with the build CA bundle copied in after every FROM and named by the usual variables
    as build args (set for RUN steps, not kept in the image config); removed again at the end."""
    lines = [f"COPY {CA_NAME} {CA_PATH}", "ARG " + " ".join(f"{v}={CA_PATH}" for v in CA_VARS)]
    text = FROM_LINE.sub(lambda m: m.group(0) + "\n" + "\n".join(lines), dockerfile)
    return text.rstrip("\n") + f"\nRUN rm -f {CA_PATH}\n"


def _context_tar(dockerfile: str, files: list[FileSpec], blobs: list[tuple[str, bytes, int]] = ()) -> bytes:
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
        for path, data, mode in blobs:
            add(path.strip("/"), data, mode)
    return buf.getvalue()


def image_tag(base_id: str, env: EnvSpec, aliases: dict[str, str] | None = None) -> str:
    dockerfile, context = render(env, base_id, aliases or {})
    payload = [base_id, dockerfile, [f.model_dump() for f in context]]
    if env.blobs:  # binary files count by content (older tags, without any, stay what they were)
        payload.append([b.model_dump() for b in env.blobs])
    return "trajforge/env:" + hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def remote_adds(dockerfile: str) -> list[tuple[str, int]]:
    """(host, port) of each `ADD <url>` (the engine fetches those itself, on its own network)."""
    found = []
    for m in REMOTE_ADD.finditer(dockerfile):
        url = m.group("url")
        if url.lower().startswith("git@"):
            found.append((url[4:].partition(":")[0], 22))
            continue
        parts = urllib.parse.urlsplit(url)
        default = {"http": 80, "https": 443, "git": 9418, "ssh": 22, "ftp": 21}.get(parts.scheme.lower(), 0)
        try:
            port = parts.port or default
        except ValueError:
            port = default
        found.append((parts.hostname or url, port))
    return found


def egress_message(env: EnvSpec, refused) -> str:
    return (f"image for {env.env_id} failed to build: build_egress_refused: the build tried "
            f"{', '.join(map(str, refused[:5]))} (synthesize.build.egress: allowlist)")


def _remove(client: docker.DockerClient, tag: str) -> None:
    try:
        client.images.remove(tag, force=True)
    except docker.errors.APIError:
        pass


def registry_host(image: str) -> tuple[str, int] | None:
    """(host, port) of the registry an image reference names (`host[:port]/path`), None for Docker Hub's."""
    first, slash, _ = image.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        return None
    host, _, port = first.rpartition(":") if first.count(":") == 1 else (first, "", "")
    return host.strip("[]"), int(port) if port.isdigit() else 443


def engine_fetches(client: docker.DockerClient, dockerfile: str) -> list:
    """What the Docker engine would fetch itself, on its own network, outside any build network: every
    `ADD <url>`, and every `FROM` / `COPY --from` image not present locally that names a registry host
    (a registry on the host's loopback is the host). As refusals."""
    from .egress import Refusal

    found = [Refusal(h, p, "ADD <url> is fetched by the Docker engine outside the build network")
             for h, p in remote_adds(dockerfile)]
    stages: set[str] = set()
    images = []
    for m in FROM_LINE.finditer(dockerfile):
        images.append(m.group(3))
        alias = re.search(r"\s+AS\s+(\S+)", m.group(4), re.I)
        if alias:
            stages.add(alias.group(1).lower())
    images += re.findall(r"^\s*COPY\s+(?:--\S+\s+)*?--from=(\S+)", dockerfile, re.I | re.M)
    for image in dict.fromkeys(images):
        where = registry_host(image) if image.lower() not in stages and not image.startswith("sha256:") else None
        if where is None:
            continue
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            found.append(Refusal(*where, f"the Docker engine would pull {image} itself, outside the build network"))
        except docker.errors.APIError:
            pass
    return found


def _build(client: docker.DockerClient, context: bytes, tag: str, limits: SandboxConfig, timeout_s: float,
           network: str = "none", buildargs: dict[str, str] | None = None, egress: str = "none"):
    """The decoded log stream of a legacy-builder build whose step containers are limited (`build_params`:
    docker-py's `build` passes neither a CPU quota nor ulimits) on `network` (`none`, `host`, or the
    build network's name); the image is labelled with the `egress` policy that built it."""
    api = client.api
    params = {"t": tag, "dockerfile": DOCKERFILE_NAME, "rm": True, "forcerm": True,
              "labels": json.dumps({**LABEL, EGRESS_LABEL: egress}), "networkmode": network,
              **build_params(limits, client)}
    if buildargs:
        params["buildargs"] = json.dumps(buildargs)
    response = api._post(api._url("/build"), data=context, params=params, stream=True, timeout=timeout_s,
                         headers={"Content-Type": "application/tar"})
    return response, api._stream_helper(response, decode=True)


def ensure_image(client: docker.DockerClient, base: str, env: EnvSpec,
                 aliases: dict[str, str] | None = None, timeout_s: float | None = None,
                 limits: SandboxConfig | None = None, options: BuildOptions | None = None,
                 log_sink: Callable[[str, str], None] | None = None) -> tuple[str, bool]:
    """Return (tag, built_now); sets `env.base_images`. Raises ImageBuildError (with a cause code and the
    tail of the log) on failure, also when the build runs past its timeout (`timeout_s`, else the task's
    `build_timeout_s`, else `options.timeout_s`; the connection is dropped, which cancels the build).
    `limits`: the build containers' memory, CPU and ulimits (default: SandboxConfig's defaults).
    `log_sink(tag, log)` receives the whole log of every build that ran (success or failure)."""
    options = options or BuildOptions()
    timeout_s = timeout_s or env.build_timeout_s or options.timeout_s
    base_id = base_image_id(client, base)
    layer = kinds.of(env).layer
    if layer is not None:  # e.g. tools: the base + the MCP SDK (tasks/envs/tools/layer.py)
        try:
            base_id = layer(client, base_id, env, options.egress != "none")
        except ToolsLayerError as err:
            raise ImageBuildError(f"image for {env.env_id} failed to build: {err}", "", cause=err.cause) from None
    aliases = aliases or {}
    env.base_images = [BaseImage(image=k, local=v) for k, v in base_mapping(env, aliases, base).items()]
    tag = image_tag(base_id, env, aliases)
    try:
        env.build_egress = (client.images.get(tag).labels or {}).get(EGRESS_LABEL)  # older images: unknown
        return tag, False
    except docker.errors.ImageNotFound:
        pass
    dockerfile, context = render(env, base_id, aliases)
    reserved = sorted(({f.path.strip("/") for f in context} | {b.path.strip("/") for b in env.blobs})
                      & {DOCKERFILE_NAME, CA_NAME})
    if reserved:  # a later tar entry of that name would replace the Dockerfile trajforge built (and records)
        raise ImageBuildError(f"image for {env.env_id} failed to build: its build context has a file named "
                              f"{reserved[0]}, a name trajforge reserves for the Dockerfile it builds and the "
                              "build CA", "", cause="reserved_name")
    try:
        store = BlobStore() if env.blobs else None
        blobs = [(b.path, store.get(b.sha256), b.mode) for b in env.blobs]
    except BlobMissing as err:
        raise ImageBuildError(f"image for {env.env_id} failed to build: {err}", "", cause="blob_missing") from None
    policy = options.egress if options.networked(env) else "none"
    refused = engine_fetches(client, dockerfile) if options.egress != "host" and env.dockerfile else []
    if refused:
        raise ImageBuildError(f"image for {env.env_id} failed to build: build_egress_refused: "
                              f"{', '.join(map(str, refused))}", "", cause="build_egress_refused", refusals=refused)
    network = {"none": "none", "host": "host"}.get(policy, "none")
    buildargs = {k: v for k, v in options.proxies} if policy == "host" else {}
    token, gate = None, None
    if policy == "allowlist":
        from . import buildnet

        gate = buildnet.gate(client, options.subnet)
        network, token = gate.network, gate.proxy.open_build(options.allowlist)
        url = gate.proxy.url(token)
        buildargs = {"http_proxy": url, "https_proxy": url, "HTTP_PROXY": url, "HTTPS_PROXY": url,
                     "no_proxy": "", "NO_PROXY": ""}
    if policy != "none" and options.ca_bundle:
        try:
            with open(options.ca_bundle, "rb") as f:
                blobs.append((CA_NAME, f.read(), 0o644))
        except OSError as err:
            raise ImageBuildError(f"image for {env.env_id} failed to build: CA bundle {options.ca_bundle}: {err}",
                                  "", cause="build_fetch_failed") from None
        dockerfile = with_ca(dockerfile)
    env.build_egress = policy
    log: list[str] = []
    deadline = time.monotonic() + timeout_s
    response = None
    try:
        response, chunks = _build(client, _context_tar(dockerfile, context, blobs), tag, limits or SandboxConfig(),
                                  timeout_s, network, buildargs, policy)
        for chunk in chunks:
            if "stream" in chunk:
                log.append(chunk["stream"])
            if "error" in chunk:
                raise ImageBuildError(f"image for {env.env_id} failed to build: {chunk['error'].strip()}",
                                      "".join(log)[-2000:])
            if time.monotonic() > deadline:
                raise ImageBuildError(f"image for {env.env_id} failed to build: still building after "
                                      f"{timeout_s:g}s", "".join(log)[-2000:], cause="build_timeout")
        refused = gate.proxy.close_build(token) if gate else []
        if refused:  # it built anyway (the Dockerfile swallowed the error): not an image of this policy
            _remove(client, tag)
            raise ImageBuildError(egress_message(env, refused), "".join(log)[-2000:], cause="build_egress_refused",
                                  refusals=refused)
    except ImageBuildError as err:
        refused = gate.proxy.close_build(token) if gate else []
        if refused and err.cause != "build_egress_refused":  # the refusal is why it failed
            err = ImageBuildError(egress_message(env, refused), err.log_tail, cause="build_egress_refused",
                                  refusals=refused)
        log.append(f"\n[trajforge] {err.cause}: {err.args[0].splitlines()[0]}\n")
        raise err from None
    except docker.errors.APIError as err:
        log.append(f"\n[trajforge] {err}\n")
        refused = gate.proxy.close_build(token) if gate else []
        if refused:
            raise ImageBuildError(egress_message(env, refused), "".join(log)[-2000:], cause="build_egress_refused",
                                  refusals=refused) from None
        raise ImageBuildError(f"image for {env.env_id} failed to build: {err}", "".join(log)[-2000:]) from None
    except Exception as err:  # read timeout of a hung build, dropped connection
        log.append(f"\n[trajforge] {err.__class__.__name__}: {err}\n")
        timed_out = time.monotonic() > deadline - 1 or "timed out" in str(err).lower()
        raise ImageBuildError(f"image for {env.env_id} failed to build: {err.__class__.__name__}: {err}",
                              "".join(log)[-2000:], cause="build_timeout" if timed_out else None) from None
    finally:
        if response is not None:
            response.close()
        if gate is not None:
            gate.proxy.close_build(token)
        if log_sink is not None:
            try:
                log_sink(tag, "".join(log))
            except Exception:  # keeping a log never fails a build
                pass
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
