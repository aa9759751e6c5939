"""Venue `fresh`: after the episode, its files go into a NEW container, and nothing else of it does.

`Sandbox.settle` calls, in order (a root or an unprivileged agent alike):
1. `stop_episode`: SIGKILL to the container's init; the kernel ends its pid namespace with it, so every process
   of the episode dies whatever it became (no restart: the image's ENTRYPOINT never runs again).
2. the toolchain check, read from outside (the stopped container's writable layer on the engine's host).
3. `reincarnate`: `docker commit` of the stopped container (its files as the engine holds them: owners, groups
   and modes of files and folders, deletions), labelled `trajforge.fresh` (the reaper removes orphans), then a
   new container of that commit with trajforge's entrypoint (`/bin/sleep infinity` under docker's init), no
   healthcheck, every sandbox default; no process, no `/dev`, no tmpfs and no volume of the episode. The
   image's VOLUMEs are new anonymous volumes holding the image's content; what the episode changed there is
   carried as files (`volume_changes`: both sides read through the engine's archive API, compared member by
   member, the changed members put in, the deleted ones removed) and joins the change set, so it is walked,
   captured and checksummed like any other file.
The stopped episode container and the commit are removed by `Sandbox.close` (`discard`), with their
anonymous volumes.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
import time
import uuid
from typing import TYPE_CHECKING

import docker
import docker.errors

from ...schemas.common import ChangeSet
from .errors import SandboxError, StateTooLarge

if TYPE_CHECKING:
    from .container import Sandbox

FRESH_LABEL = "trajforge.fresh"
# walk rows of what the engine writes into every container's layer (hence into each commit), of the kind it
# writes: an empty `/.dockerenv`, `/etc/mtab` a link (an agent's replacement of either by another kind still shows)
ENGINE_FILES = {("C", "f", "/.dockerenv"), ("C", "l", "/etc/mtab")}
VOLUME_LIMIT = 256 << 20  # bytes of one VOLUME's tar read back from the episode


def stop_episode(sb: "Sandbox") -> None:
    """Kill the episode container's init (every process of its pid namespace dies with it) and wait until the
    engine says it stopped. The container stays (stopped) as `sb.episode_container` until `close`."""
    api = sb.client.api
    try:
        try:
            api.kill(sb.container.id)
        except docker.errors.APIError as err:
            if "is not running" not in str(err):
                raise
        api.wait(sb.container.id, timeout=60)
    except Exception as err:  # docker or transport errors (a timeout included)
        raise SandboxError(f"could not stop {sb.name} to judge it in a fresh container: {err}") from None
    sb.episode_container = sb.container


def needs_rebirth(sb: "Sandbox") -> bool:
    """Whether judging in the episode's own container (venue `in_place`) would hand agent files to the image's
    own machinery: a root agent's restart runs the image's ENTRYPOINT again (on files the agent may have written,
    e.g. a sourced `.env`), and a VOLUME holds files the change walk never sees. Such episodes are judged `fresh`."""
    conf = sb.container.attrs.get("Config") or {}
    return bool(conf.get("Volumes")) or (sb.agent == "root" and bool(conf.get("Entrypoint")))


def volumes(sb: "Sandbox") -> list[str]:
    """The paths the image (or the container) declares as VOLUMEs."""
    conf = (sb.container.attrs.get("Config") or {}).get("Volumes") or {}
    return sorted(posixpath.normpath(v) for v in conf)


def reincarnate(sb: "Sandbox") -> None:
    """Commit the stopped episode container and make `sb` drive a new container of that commit (see module
    docstring). Raises SandboxError when the engine cannot commit or start it (infrastructure)."""
    old = sb.episode_container
    api = sb.client.api
    paths = volumes(sb)
    episode_tars = {v: _archive(api, old.id, v, sb.name) for v in paths}
    try:
        image = api.commit(old.id, repository="trajforge-fresh", tag=uuid.uuid4().hex[:12], pause=False,
                           changes=[f"LABEL {FRESH_LABEL}=1", 'ENTRYPOINT ["/bin/sleep"]', 'CMD ["infinity"]'])
    except docker.errors.DockerException as err:
        raise SandboxError(f"could not commit {sb.name} to judge it in a fresh container: {err}") from None
    sb.fresh_image = image["Id"]
    name = f"tf-{uuid.uuid4().hex[:12]}"
    try:
        new = sb._create(sb.fresh_image, name, entrypoint=["/bin/sleep"], command=["infinity"],
                         healthcheck={"test": ["NONE"]})
        sb.container, sb.name = new, name
        new.start()
    except docker.errors.DockerException as err:
        raise SandboxError(f"could not start a fresh container from the episode of {old.name}: {err}") from None
    sb.keep_pids = {1} | sb._init_children()
    sb.restarted = True
    changes: dict[str, str] = {}
    for v in paths:
        changes.update(_carry_volume(sb, v, episode_tars[v]))
    sb.volume_changes = changes


def _archive(api, container_id: str, path: str, name: str) -> bytes:
    """A tar of `path` read by the engine (no program of the container runs); b"" when nothing is there."""
    try:
        stream, _ = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return b""
    except docker.errors.DockerException as err:
        raise SandboxError(f"could not read {path} of {name}: {err}") from None
    buf = bytearray()
    for chunk in stream:
        buf += chunk
        if len(buf) > VOLUME_LIMIT:
            raise StateTooLarge(f"the volume {path} of {name} holds more than {VOLUME_LIMIT >> 20} MiB after the "
                                "episode: its changes cannot be carried into a fresh container")
    return bytes(buf)


def _members(data: bytes) -> dict[str, tuple[tarfile.TarInfo, tuple]]:
    """{name: (member, what identifies its state)} of a tar (content by digest)."""
    out: dict[str, tuple[tarfile.TarInfo, tuple]] = {}
    if not data:
        return out
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            digest = hashlib.sha256(tar.extractfile(m).read()).hexdigest() if m.isfile() else ""
            out[m.name] = (m, (m.type, m.mode, m.uid, m.gid, m.linkname, m.size, int(m.mtime), digest))
    return out


def volume_changes(sb: "Sandbox") -> dict[str, str]:
    """{path: kind} of what differs in the container's VOLUMEs from the image's content there (both read through
    the engine): a container judged where it stands (the validator's, after the reference solution)."""
    out: dict[str, str] = {}
    for v in volumes(sb):
        now = _archive(sb.client.api, sb.container.id, v, sb.name)
        out.update(_diff(v, _members(_image_volume(sb, v)), _members(now))[2])
    return out


_IMAGE_VOLUMES: dict[tuple[str, str], bytes] = {}  # (image id, volume path) -> its content as the image has it


def _image_volume(sb: "Sandbox", path: str) -> bytes:
    """A VOLUME's content as the image has it: read once per image from a throwaway container of it (started with
    `/bin/true` as its entrypoint and ended: its new volume then holds the image's content there)."""
    image = sb.container.attrs.get("Image") or sb.image
    key = (image, path)
    if key not in _IMAGE_VOLUMES:
        api = sb.client.api
        c = api.create_container(image, command=[], entrypoint=["/bin/true"], labels=sb.labels,
                                 network_disabled=True)
        try:
            api.start(c["Id"])
            api.wait(c["Id"], timeout=60)
            _IMAGE_VOLUMES[key] = _archive(api, c["Id"], path, sb.name)
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not read the VOLUME {path} of {image}: {err}") from None
        finally:
            api.remove_container(c["Id"], force=True, v=True)
    return _IMAGE_VOLUMES[key]


def _diff(path: str, before: dict, after: dict) -> tuple[list[str], list[str], dict[str, str]]:
    """(member names changed or added, names deleted (topmost), {absolute path: kind}) between two volume tars'
    members (`_members`) of the VOLUME at `path`."""
    parent = posixpath.dirname(path.rstrip("/")) or "/"

    def absolute(n: str) -> str:
        return _spelled(posixpath.normpath(posixpath.join(parent, n)))

    changed = [n for n, (_, key) in after.items() if n not in before or before[n][1] != key]
    deleted = [n for n in before if n not in after and not any(n.startswith(d + "/") for d in before
                                                               if d not in after and d != n)]
    kinds = {absolute(n): "added" if n not in before else "modified" for n in changed
             if not (after[n][0].isdir() and n in before)}  # a folder of the image is no change by itself...
    for n in changed:  # ...unless its owner, group or mode changed
        if after[n][0].isdir() and n in before and before[n][1][1:4] != after[n][1][1:4]:
            kinds[absolute(n)] = "modified"
    kinds.update({absolute(n): "deleted" for n in deleted})
    return changed, deleted, kinds


def _carry_volume(sb: "Sandbox", path: str, episode: bytes) -> dict[str, str]:
    """Make the fresh container's volume at `path` hold what the episode's held; {path: kind} of what differs
    from the image's content there (the change set's share of this volume)."""
    fresh = _archive(sb.client.api, sb.container.id, path, sb.name)
    changed, deleted, kinds = _diff(path, _members(fresh), _members(episode))
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    if deleted:
        sb.exec("rm -rf -- " + " ".join(_bash_bytes(posixpath.normpath(posixpath.join(parent, n))) for n in deleted),
                60, user="root", workdir="/")
    if changed:
        out = io.BytesIO()
        names = set(changed)
        with tarfile.open(fileobj=io.BytesIO(episode)) as src, tarfile.open(fileobj=out, mode="w") as dst:
            for m in src:
                if m.name in names:
                    dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        sb._put(parent, out.getvalue())
    return kinds


def _spelled(path: str) -> str:
    """A name as the change walk spells it: bytes that are not UTF-8 as `\\xNN` (tar gives them as surrogates)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _bash_bytes(path: str) -> str:
    """`path` as one bash word of its exact bytes (`$'...'`, every byte but [A-Za-z0-9/._-] escaped)."""
    raw = path.encode("utf-8", "surrogateescape")
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-"
    return "$'" + "".join(chr(b) if b in safe else f"\\x{b:02x}" for b in raw) + "'"


def discard(sb: "Sandbox") -> None:
    """Remove the stopped episode container (with its anonymous volumes) and the commit (idempotent)."""
    api = sb.client.api
    if sb.episode_container is not None:
        try:
            api.remove_container(sb.episode_container.id, force=True, v=True)
        except docker.errors.DockerException:
            pass  # gone already, or reaped later by label
        sb.episode_container = None
    if sb.fresh_image is not None:
        for attempt in range(3):  # the fresh container's removal may still be settling
            try:
                api.remove_image(sb.fresh_image, force=True)
                break
            except docker.errors.NotFound:
                break
            except docker.errors.DockerException:
                time.sleep(0.2 * (attempt + 1))
        sb.fresh_image = None


def _below_any(path: str, paths: set[str]) -> bool:
    parent = posixpath.dirname(path)
    while parent not in ("/", ""):
        if parent in paths:
            return True
        parent = posixpath.dirname(parent)
    return False


def with_volumes(changes: ChangeSet, volume: dict[str, str], cap: int) -> ChangeSet:
    """The walk's change set (which stays on the root filesystem) joined with what changed in the VOLUMEs and the
    image's folders whose owner, group or mode changed (`Sandbox.folder_changes`)."""
    if not volume:
        return changes
    lists = {k: set(getattr(changes, k)) for k in ("added", "modified", "deleted")}
    for p, kind in volume.items():
        lists[kind].add(p)
    added = sorted(p for p in lists["added"] if not _below_any(p, lists["added"]))
    out = {"added": added, "modified": sorted(lists["modified"]), "deleted": sorted(lists["deleted"])}
    listed = set(changes.paths())
    total = changes.total + len([p for p in volume if p not in listed])
    return ChangeSet(**{k: v[:cap] for k, v in out.items()}, total=total,
                     truncated=changes.truncated or any(len(v) > cap for v in out.values()))
