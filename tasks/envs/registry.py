"""Environment images on every engine of a build: built once, then pulled by digest (`sandbox.registry`).

An environment's image is built where its synthesize shard ran and named by its content
(`trajforge/env:<hash>`, images.py). With a registry (`host:port[/prefix]`), the image is pushed
there as `<registry>/trajforge/env:<hash>` and its manifest digest is put on record in the run store
(`<runs>/<dataset>/images/<hash>.json`: tag, registry, digest; written once). Before an engine runs
the first sandbox of an image it lacks (`bring_here`), it pulls `<registry>/trajforge/env@<digest>`
(the engine checks the content against the digest) and tags it with the content-addressed tag, so
sandboxes, the verifier and the build log refer to the same name on every engine. Without a
registry, or with no digest on record and the image nowhere to push from, the engine builds the
image itself from the environment (per-host builds: each engine's own base image).

Invariants: an image is pushed only from an engine that has it under its content-addressed tag; a
record names the digest the registry returned for that push; an engine never runs an environment
under a tag it did not build or pull by a recorded digest. One pull or build per image and engine
at a time within a process (`_lock`).
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal

import docker
import docker.errors

from ...schemas.environment import EnvSpec
from ..engine.store import RunStore
from ..sandbox import docker_client
from .images import BuildOptions, ImageBuildError, ensure_image

if TYPE_CHECKING:
    from ..engine.contract import StageContext

REPO = "trajforge/env"
Outcome = Literal["present", "pulled", "built"]


class RegistryError(RuntimeError):
    """The registry refused a push or a pull (names the registry and the image)."""


@dataclass
class ImageRecord:
    tag: str
    registry: str
    digest: str

    def ref(self) -> str:
        return f"{self.registry}/{REPO}@{self.digest}"


def record_path(store: RunStore, tag: str) -> str:
    return posixpath.join(store.root, "images", tag.rpartition(":")[2] + ".json")


def lookup(store: RunStore, registry: str, tag: str) -> ImageRecord | None:
    """The digest on record for `tag` in `registry`, if any."""
    path = record_path(store, tag)
    if not store.exists(path):
        return None
    rec = store.read_json(path)
    return ImageRecord(rec["tag"], rec["registry"], rec["digest"]) if rec.get("registry") == registry else None


def push(client: docker.DockerClient, tag: str, registry: str, store: RunStore) -> ImageRecord:
    """Push the local image `tag` to `registry` and put its digest on record (the first record of a
    tag stays: a later push of the same content-addressed tag is the same environment)."""
    remote = f"{registry}/{REPO}"
    version = tag.rpartition(":")[2]
    client.api.tag(tag, remote, version)
    digest, error = None, None
    try:
        for line in client.api.push(remote, tag=version, stream=True, decode=True):
            error = line.get("error") or error
            digest = (line.get("aux") or {}).get("Digest") or digest
    except docker.errors.APIError as err:
        error = str(err)
    if error or not digest:
        raise RegistryError(f"pushing {tag} to the registry {registry} (sandbox.registry) failed: "
                            f"{error or 'no digest in the reply'}")
    rec = ImageRecord(tag, registry, digest)
    path = record_path(store, tag)
    text = json.dumps({"tag": tag, "registry": registry, "digest": digest, "pushed_at": time.time()})
    if not store.create_exclusive(path, text):  # another engine pushed it first: keep its record
        found = lookup(store, registry, tag)
        if found is None:  # a record of another registry: this one's replaces it
            store.write_text(path, text)
        else:
            rec = found
    return rec


def pull(client: docker.DockerClient, rec: ImageRecord) -> None:
    """Pull `rec` by digest and tag it with its content-addressed tag."""
    try:
        client.images.pull(f"{rec.registry}/{REPO}", tag=rec.digest)
    except docker.errors.APIError as err:
        raise RegistryError(f"pulling {rec.ref()} ({rec.tag}) from the registry {rec.registry} "
                            f"(sandbox.registry) failed: {err}") from None
    repo, _, version = rec.tag.rpartition(":")
    client.api.tag(rec.ref(), repo, version)


_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(client: docker.DockerClient, tag: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((client.api.base_url, tag), threading.Lock())


def bring_here(client: docker.DockerClient, env: EnvSpec, store: RunStore, registry: str | None,
               build: Callable[[EnvSpec], str]) -> Outcome:
    """Make `env.image` present on this engine: present already (pushed, with a registry, when no
    digest is on record yet), else pulled by its recorded digest, else built here by `build(env)`
    (which returns the tag it built; the image then also gets `env.image`) and pushed."""
    with _lock(client, env.image):
        try:
            client.images.get(env.image)
            if registry and lookup(store, registry, env.image) is None:
                push(client, env.image, registry, store)
            return "present"
        except docker.errors.ImageNotFound:
            pass
        rec = lookup(store, registry, env.image) if registry else None
        if rec is not None:
            pull(client, rec)
            return "pulled"
        built = build(env)
        if built != env.image:  # this engine's base image differs: the same environment, its own build
            repo, _, version = env.image.rpartition(":")
            client.api.tag(built, repo, version)
        if registry:
            push(client, env.image, registry, store)
        return "built"


def builder(client: docker.DockerClient, base_image: str, aliases: dict[str, str] | None = None,
            **options) -> Callable[[EnvSpec], str]:
    """`build` for `bring_here`: the image builder on this engine (a copy of `env`, whose recorded
    base-image mapping stays the synthesize stage's)."""
    return lambda env: ensure_image(client, base_image, env.model_copy(deep=True), aliases, **options)[0]


def bring_all_here(ctx: "StageContext", envs: Iterable[EnvSpec]) -> dict[str, int]:
    """`bring_here` for every image of `envs` on this worker's engine, before a stage's first sandbox;
    counts per outcome (`images_present`, `images_pulled`, `images_built_here`) for the stage's stats.
    An image that can be neither pulled nor built fails the shard, naming the environment and engine."""
    cfg = ctx.config
    by_image = {e.image: e for e in envs if e.image}
    counts = {"images_present": 0, "images_pulled": 0, "images_built_here": 0}
    if not by_image:
        return counts
    client = docker_client(sandbox=cfg.sandbox)
    try:
        build = builder(client, cfg.sandbox.base_image, cfg.synthesize.image_aliases, limits=cfg.sandbox,
                        options=BuildOptions.from_config(cfg.synthesize.build))
        for image, env in sorted(by_image.items()):
            try:
                outcome = bring_here(client, env, ctx.store, cfg.sandbox.registry, build)
            except ImageBuildError as err:
                raise RegistryError(f"environment {env.env_id}: its image {image} is not on the engine "
                                    f"{client.api.base_url} and building it there failed: {err}") from None
            counts[{"built": "images_built_here"}.get(outcome, f"images_{outcome}")] += 1
    finally:
        client.close()
    return counts
