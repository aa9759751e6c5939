"""The one sandbox API: a hardened, labelled Docker container per episode or verification.

Defaults: no network, every capability dropped, no-new-privileges, pids/memory/CPU
limits, agent commands as the non-root `agent` user, per-command timeout with a hard kill of the
command's process group, head+tail output truncation, unique names, labels so orphans can be
reaped, never the Docker socket inside. The docker SDK is used (not the CLI) so a worker keeps one
connection pool and errors arrive as typed exceptions.
"""

from __future__ import annotations

import base64
import io
import json
import os
import posixpath
import re
import shlex
import tarfile
import time
import uuid
from dataclasses import dataclass
from typing import Iterable

import docker
import docker.errors

from ...schemas.common import ChangeSet, FileSpec
from ...schemas.config import SandboxConfig
from ...schemas.environment import DEFAULT_WORKDIR
from ..engine.identity import owner_label
from . import fresh
from .checksums import digest_command
from .errors import (
    FinalStateUnavailable,
    OutputTooLarge,
    SandboxError,
    SandboxStopped,
    StateTooLarge,
    StateUnreadable,
    WorkDirGone,
)
from .layer import (
    HARNESS_PATH,
    SYSTEM,
    classify,
    folder_changes,
    layer_entries,
    toolchain_changes,
    under,
    upper_changes,
)
from .limits import create_capped, ulimits
from .providers import connect
from .reaper import LABEL
from .stopped import stopped_by_agent
from .streams import META, ExecHung, capture_argv, run_exec
from .users import AGENT_UID, ROOT_FILE_CAPS, USERS
from .walk import _AGENT_ROOTS, _BASELINES, _NOISE, DECISION_CAP, ChangeWalk, _has_child

# (image id, work dir) -> the image's work dir as a tar (None: the image has none), seeding a tmpfs work dir
_WORK_SEEDS: dict[tuple[str, str], tuple[bytes, int, int, int] | None] = {}


def _ns_pid(host_pid: int) -> int | None:
    """The innermost namespace's pid of a host process (`NSpid`), None when it is gone."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _host_children(host_pid: int) -> set[int] | None:
    """The container pids of a host process's children (read from this host's /proc), None when it is gone."""
    try:
        with open(f"/proc/{host_pid}/task/{host_pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return None
    pids = {_ns_pid(k) for k in kids}
    return {p for p in pids if p is not None}


def _spellings(path: str) -> list[bytes]:
    """The names a change-set path may stand for: as written, and, when it holds the walk's `\\xNN`
    spelling of bytes that are not UTF-8, with those bytes (a literal `\\x41` in a name looks alike)."""
    raw = path.encode("utf-8", errors="surrogateescape")
    decoded = re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), raw)
    return [raw] if decoded == raw else [raw, decoded]


def docker_client(pool_size: int = 10, sandbox: SandboxConfig | None = None) -> docker.DockerClient:
    """A client of this worker's engine (`providers.engine_url`: $TRAJFORGE_DOCKER_HOST, else
    `sandbox.engine`, else the local one) whose HTTP pool fits `pool_size` concurrent calls (an episode
    driver keeps many). With `sandbox`, an engine lacking a capability its settings need is refused
    (`providers.EngineLacks`, a `DockerUnavailable`) before any sandbox is created."""
    return connect(pool_size, sandbox)


@dataclass
class ExecResult:
    exit_code: int
    output: str
    duration_s: float
    timed_out: bool
    output_bytes: int
    truncated: bool
    oom_killed: bool = False

    @property
    def killed_by(self) -> str | None:
        return "timeout" if self.timed_out else "oom" if self.oom_killed else None


def _tar(files: Iterable[FileSpec], root: str, uid: int, dir_mode: int = 0o755) -> bytes:
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        seen_dirs: set[str] = set()
        top = tarfile.TarInfo(root)
        top.type, top.mode, top.uid, top.gid, top.mtime = tarfile.DIRTYPE, dir_mode, uid, uid, now
        tar.addfile(top)
        for f in files:
            parts = f.path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join([root, *parts[:i]])
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, dir_mode, uid, uid, now
                    tar.addfile(info)
            data = f.content.encode()
            info = tarfile.TarInfo("/".join([root, *parts]))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), f.mode, uid, uid, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# every sandbox has the same host name: an answer that depends on it (a task that reads /etc/hostname) is the
# same in the episode's container and in a fresh one that tests its final state isolated
HOSTNAME = "sandbox"


class Sandbox(ChangeWalk):
    """A running container. Use as a context manager; `close()` always removes the container."""

    def __init__(self, client: docker.DockerClient, image: str, cfg: SandboxConfig,
                 labels: dict[str, str] | None = None, workdir: str = DEFAULT_WORKDIR,
                 cap_add: tuple[str, ...] = (), agent: str = "agent", own_entrypoint: bool = False):
        """`agent`: who runs the agent's commands (`exec`'s default user): the unprivileged `agent`, whose
        container keeps no capability (`cap_add` is for verifier containers: SETUID/SETGID let hidden
        tests run agent code as the agent user), or `root` with root's ordinary file powers
        (ROOT_FILE_CAPS: imported tasks assume them), still with no network and no-new-privileges.
        `own_entrypoint`: `/bin/sleep infinity` replaces the image's ENTRYPOINT (a verifier container runs none of
        the task's start-up code); a HEALTHCHECK never runs in any sandbox."""
        self.client, self.image, self.cfg, self.workdir = client, image, cfg, workdir
        self.agent = agent
        self.cap_add = sorted(set(cap_add) | (set(ROOT_FILE_CAPS) if agent == "root" else set()))
        self.name = f"tf-{uuid.uuid4().hex[:12]}"
        self.labels = {LABEL: "1", "trajforge.owner": owner_label(), **(labels or {})}
        self.container = None
        self.keep_pids: set[int] = {1}  # the init process and the container's `sleep infinity`
        self.settled = False  # `settle` ran and no command of the agent's user ran since
        self.started_at = 0.0
        self.baseline: frozenset[str] = frozenset()
        self.children: dict[str, set[str]] = {}
        self.baseline_dirs: frozenset[str] = frozenset()
        self._work_owner = "0:0"  # who fills a tmpfs work dir (`work_tmpfs_mb`): the image's owner of it
        self.agent_roots: tuple[str, ...] | None = None  # where the agent can change files (None: anywhere)
        self.others_wrote = False  # something other than the unprivileged agent may have written since start
        self.restarted = False  # `restart` ran: no process of the episode is left, whatever its pid
        self.stopped: str | None = None  # why the agent's own processes stopped the container (stopped.py), if they did
        self.toolchain_changed: list[str] = []  # what `toolchain` found the episode changed of the harness's programs
        self.toolchain_allowed: tuple[str, ...] = ()  # ...except these (the reference solution's changes)
        self.own_entrypoint = own_entrypoint  # trajforge's entrypoint, not the image's (verifier containers)
        self.fresh = False  # venue `fresh`: `settle` moves the episode's files into a new container (fresh.py)
        self.episode_container = None  # ...and the stopped episode container stays here until `close`
        self.fresh_image: str | None = None  # the commit it was made from (removed by `close`)
        self.volume_changes: dict[str, str] = {}  # {path: added|modified|deleted} in the image's VOLUMEs
        self.carried: frozenset[str] = frozenset()  # the paths of the episode's commit layer (venue `fresh`)
        self.layer_paths: frozenset[str] = frozenset()  # the paths of the writable layer at the last `layer_changes`

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _work_seed(self) -> tuple[bytes, int, int, int] | None:
        """The image's work dir as (tar, owner uid, gid, mode), from a created, never started container
        (once per image): what a tmpfs mounted over it would hide. None if the image has no such folder.
        One owner only (a tmpfs is filled by that user: the sandbox keeps no CAP_CHOWN)."""
        key = (self.image, self.workdir)
        if key not in _WORK_SEEDS:
            c = self.client.api.create_container(self.image, command=["true"], labels=self.labels)
            try:
                bits, _ = self.client.api.get_archive(c["Id"], self.workdir)
                data = b"".join(bits)
            except docker.errors.NotFound:
                data = None
            finally:
                self.client.api.remove_container(c["Id"], force=True, v=True)
            seed = None
            if data is not None:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    members = tar.getmembers()
                owners = {(m.uid, m.gid) for m in members}
                if len(owners) > 1:
                    raise SandboxError(f"sandbox.work_tmpfs_mb: the work dir {self.workdir} of {self.image} has files of "
                                       f"{len(owners)} owners ({sorted(owners)[:4]}); a tmpfs work dir needs one")
                seed = (data, members[0].uid, members[0].gid, members[0].mode & 0o7777)
            _WORK_SEEDS[key] = seed
        return _WORK_SEEDS[key]

    def _seed_work(self, seed: tuple[bytes, int, int, int]) -> None:
        """Copy the image's work dir into its tmpfs, as its owner (files, modes, times)."""
        data, uid, gid, _ = seed
        self._work_owner = f"{uid}:{gid}"
        self._put_into_work(posixpath.dirname(self.workdir.rstrip("/")) or "/", data)

    def _put_into_work(self, parent: str, data: bytes) -> None:
        """`put_archive(parent, data)` when the work dir is a tmpfs: the engine's archive upload writes
        below the mount, where the container never sees it. Members outside the work dir go the usual
        way; those inside are extracted to a staging folder on the root filesystem and copied in by
        `cp` in the container, as the work dir's owner (their owner becomes it: the sandbox keeps no
        CAP_CHOWN), modes and times kept."""
        work = self.workdir.rstrip("/")
        inside, outside = io.BytesIO(), io.BytesIO()
        mode = None
        with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=inside, mode="w") as tin, \
                tarfile.open(fileobj=outside, mode="w") as tout:
            n_out = 0
            for m in src.getmembers():
                path = posixpath.normpath(posixpath.join(parent, m.name))
                body = src.extractfile(m) if m.isfile() else None
                if path == work:
                    mode = m.mode & 0o7777
                elif path.startswith(work + "/"):
                    m.name = posixpath.relpath(path, work)
                    tin.addfile(m, body)
                else:
                    tout.addfile(m, body)
                    n_out += 1
        if n_out:
            self._put(parent, outside.getvalue())
        user = self._work_owner
        stage = f"/tmp/.tf-seed.{uuid.uuid4().hex[:6]}"
        q = shlex.quote
        code, out = self._harness(["mkdir", "-m", "700", stage], user=user, timeout_s=self.cfg.exec_grace_s)
        if code == 0:
            self._put(stage, inside.getvalue())
            chmod = f"chmod {mode:o} {q(stage)}" if mode is not None else f"chmod \"$(stat -c %a {q(work)})\" {q(stage)}"
            code, out = self._harness(["sh", "-c", f"{chmod} && cp -R -P --preserve=mode,timestamps,links "
                                                   f"{q(stage)}/. {q(work)}/ && rm -rf {q(stage)}"],
                                      user=user, timeout_s=120)
        if code != 0:
            raise SandboxError(f"could not copy into the tmpfs work dir of {self.name}: {out[-300:]!r}")

    def _create(self, image: str, name: str, tmpfs: dict | None = None, **over):
        """A container of `image` with every sandbox default (`over`: e.g. trajforge's own entrypoint)."""
        # (the command by its absolute path: a restart must not find a `sleep` of the agent's on the image's PATH,
        # e.g. in /usr/local/sbin; /bin/sleep itself is a system program, judged from outside)
        kw = dict(command=["/bin/sleep", "infinity"], name=name,
                  labels=self.labels, detach=True, network_mode="none", cap_drop=["ALL"],
                  cap_add=self.cap_add or None, security_opt=["no-new-privileges"],
                  pids_limit=self.cfg.pids_limit, mem_limit=f"{self.cfg.memory_mb}m",
                  memswap_limit=f"{self.cfg.memory_mb}m", nano_cpus=int(self.cfg.cpus * 1e9),
                  ulimits=ulimits(self.cfg), working_dir=self.workdir, init=True, hostname=HOSTNAME,
                  environment={"HOME": self._home(self.agent)}, tmpfs=tmpfs,
                  healthcheck={"test": ["NONE"]})  # the engine never runs the image's programs on its own
        if self.own_entrypoint:
            kw.update(entrypoint=["/bin/sleep"], command=["infinity"])
        return create_capped(self.client, image, self.cfg, **{**kw, **over})

    def start(self) -> None:
        try:
            # opt-in (`work_tmpfs_mb`): the work dir is a size-capped tmpfs where the engine cannot cap the
            # writable layer; it counts against `memory_mb`, and it is seeded with the image's work dir
            seed, tmpfs = None, None
            if self.cfg.work_tmpfs_mb:
                seed = self._work_seed()
                owner = f",uid={seed[1]},gid={seed[2]},mode={seed[3]:o}" if seed else ""
                tmpfs = {self.workdir: f"size={self.cfg.work_tmpfs_mb}m,exec{owner}"}
            # create + start, never `run`: run would try to pull a missing image from a registry
            self.container = self._create(self.image, self.name, tmpfs=tmpfs)
            started = time.time()  # the host's clock is the container's: no inspect round-trip
            self.container.start()
            if seed is not None:
                self._seed_work(seed)
                started = time.time()  # the seeding is the image's, not the episode's
            if self.agent == "root":  # the init's children: the `sleep infinity` a root agent's cleanup spares
                self.keep_pids = {1} | self._init_children()
            # what changes after the start (ctime, which no process here can set back) is the episode's
            self.started_at = started
            image_id = self.container.attrs.get("Image") or self.image  # (`.image` would inspect the image)
            # the image's own file list, before anything ran in it, as a container of this work dir sees it (the
            # engine makes a work dir the image lacks: another work dir's container must not inherit it)
            base_key = (image_id, self.workdir, bool(self.cfg.work_tmpfs_mb))
            if base_key not in _BASELINES:
                listing = self._listing()
                children: dict[str, set[str]] = {}
                for q in listing:
                    children.setdefault(posixpath.dirname(q), set()).add(q)
                _BASELINES[base_key] = (frozenset(listing), children,
                                        frozenset(q for q, k in listing.items() if k == "d"))
            self.baseline, self.children, self.baseline_dirs = _BASELINES[base_key]
            if self.agent != "root":
                key = (image_id, self.cfg.work_tmpfs_mb, tuple(self.cap_add))
                if key not in _AGENT_ROOTS:
                    _AGENT_ROOTS[key] = self._agent_roots()
                self.agent_roots = _AGENT_ROOTS[key]
            self.others_wrote = False  # (a tmpfs work dir's seeding is the image's)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {self.image!r} not found; build it first (synthesize stage / make setup)") from None
        except Exception as err:  # docker or transport errors; the create may have succeeded
            self._remove_by_name()
            raise SandboxError(f"could not start a container from {self.image!r}: {err}") from None

    def _init_children(self) -> set[int]:
        """The pids of the container init's children (its `sleep infinity`; right after a start the init
        may not have started it yet), read from this host's /proc when the engine is local (no exec), else
        with `cat` in the container."""
        children: set[int] = set()
        host = self._host_init_pid()
        for _ in range(50):
            if host is not None:  # read from outside: no exec, and no program of the container runs
                children = _host_children(host)
                if children is None:  # the init went away between two reads: ask the container
                    host = None
                    continue
                if children:
                    break
                time.sleep(0.02)
                continue
            _, out = run_exec(self.client.api, self.container.id, ["cat", "/proc/1/task/1/children"],
                              time.monotonic() + self.cfg.exec_grace_s, 1 << 16, user="0:0",
                              environment={"PATH": HARNESS_PATH})
            children = {int(p) for p in out.split() if p.isdigit()}
            if children:
                break
            time.sleep(0.02)
        return children

    def _host_init_pid(self) -> int | None:
        """The host pid of this start's init when the engine is local and its pid namespace is readable here
        (the init's own `NSpid` ends in 1, its cgroup names this container), else None."""
        if not str(getattr(self.client.api, "base_url", "")).startswith("http+docker://"):
            return None
        try:
            self.container.reload()  # this start's State.Pid (one inspect: cheaper than an exec)
            pid = int((self.container.attrs.get("State") or {}).get("Pid") or 0)
        except (docker.errors.DockerException, ValueError):
            return None
        if not pid or _ns_pid(pid) != 1:
            return None
        try:  # this container's init, not a process of the same number in another pid namespace
            with open(f"/proc/{pid}/cgroup") as f:
                return pid if self.container.id in f.read() else None
        except OSError:
            return None

    def restart(self) -> None:
        """Kill every process of the container, whatever its pid (the init and its `sleep infinity`
        included: a root agent may have taken one over), and start it again: the writable layer stays,
        `/dev`, `/dev/shm` and tmpfs mounts start empty. Raises SandboxError when it does not come back."""
        try:
            self.container.restart(timeout=0)
            self.keep_pids = {1} | self._init_children()
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not restart {self.name} to judge it: {err}") from None
        self.restarted = True

    def pause(self) -> None:
        """Freeze every process of the container (the cgroup freezer): nothing in it runs until `unpause`. The
        freezer gives up when a process does not stop in time (`unable to freeze` on a loaded host): tried three
        times before it is an infrastructure failure."""
        for attempt in range(3):
            try:
                self.container.pause()
                return
            except docker.errors.DockerException as err:
                if attempt == 2 or "unable to freeze" not in str(err):
                    raise SandboxError(f"could not pause {self.name}: {err}") from None
                time.sleep(0.2 * (attempt + 1))

    def unpause(self) -> None:
        try:
            self.container.unpause()
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not unpause {self.name}: {err}") from None

    def path_kind(self, path: str) -> str | None:
        """What `path` is, from the engine's stat of it (never following its last component; a link in a
        folder above is followed inside the container's root): `file`, `dir`, `link`, `fifo`, `device`,
        `socket` or `other`; None when there is nothing. No program of the container runs."""
        api = self.client.api
        try:
            res = api.head(api._url("/containers/{0}/archive", self.container.id), params={"path": path})
        except Exception as err:  # transport errors
            raise SandboxError(f"could not stat {path} in {self.name}: {err}") from None
        if res.status_code == 404:
            return None
        if res.status_code != 200:
            raise SandboxError(f"could not stat {path} in {self.name}: HTTP {res.status_code}")
        mode = json.loads(base64.b64decode(res.headers["X-Docker-Container-Path-Stat"]))["mode"]
        for bit, kind in ((31, "dir"), (27, "link"), (25, "fifo"), (26, "device"), (24, "socket"), (21, "device"),
                          (19, "other")):
            if mode & (1 << bit):
                return kind
        return "file"

    def _upper_dir(self) -> str | None:
        """The container's writable layer on this host (overlay2, readable here: a local engine, this
        process root), else None."""
        data = (self.container.attrs.get("GraphDriver") or {})
        upper = (data.get("Data") or {}).get("UpperDir")
        local = str(getattr(self.client.api, "base_url", "")).startswith("http+docker://")
        if data.get("Name") != "overlay2" or not upper or not local or not os.access(upper, os.R_OK | os.X_OK):
            return None
        return upper

    def layer_changes(self) -> dict[str, str]:
        """{path: added | modified | deleted | replaced} of everything in the container's writable layer against the
        image, read from outside (the overlay upper folder on this host, else the engine's diff): what a commit of
        it carries (`layer_paths`: every path of it). The engine's diff spells a byte that is not UTF-8 as U+FFFD:
        such a name cannot be addressed, and `with_layer` makes the change set incomplete."""
        upper = self._upper_dir()
        raw = layer_entries(upper) if upper is not None else self._engine_diff()
        self.layer_paths = frozenset(raw)
        return classify(raw, self.baseline, self.baseline_dirs)

    def folder_changes(self) -> dict[str, str]:
        """{folder: modified}: folders of the image whose owner, group or mode the episode changed (the walk lists
        files and folders it added, not these), read on the engine's host; {} without a host view."""
        upper = self._upper_dir()
        lowers = ((self.container.attrs.get("GraphDriver") or {}).get("Data") or {}).get("LowerDir") or ""
        if upper is None:
            return {}
        return folder_changes(upper, [x for x in lowers.split(":") if x], self.baseline_dirs)

    def system_changes(self) -> dict[str, str]:
        """{path: added|modified|deleted|replaced} in the system folders (`layer.SYSTEM`), read from
        outside the container: its overlay upper folder on this host, else the engine's diff."""
        upper = self._upper_dir()
        if upper is not None:
            raw = upper_changes(upper)
        else:
            raw = {p: k for p, k in self._engine_diff().items() if under(p, SYSTEM + ("/usr", "/etc"))}
        return classify(raw, self.baseline, self.baseline_dirs)

    def toolchain(self) -> list[str]:
        """What the episode changed of the programs and libraries the harness runs (see layer.py), read
        from outside; for an unprivileged agent that can write none of the system folders (its places,
        `agent_roots`, lie elsewhere) and no engine view on this host, nothing is read: it cannot."""
        if self.agent != "root" and self._upper_dir() is None and self.agent_roots is not None \
                and not any(r == "/" or any(s == r or s.startswith(r + "/") or r.startswith(s + "/") for s in SYSTEM)
                            for r in self.agent_roots):
            return []
        self.toolchain_changed = toolchain_changes(self.system_changes(), self.baseline, self.toolchain_allowed)
        return self.toolchain_changed

    def _remove_by_name(self) -> None:
        try:
            self.client.api.remove_container(self.name, force=True, v=True)
        except Exception:
            pass  # never created, or reaped later by label

    @staticmethod
    def _home(user: str) -> str:
        return "/root" if user == "root" else "/home/agent"

    def exec(self, command: str, timeout_s: float, user: str | None = None, workdir: str | None = None,
             output_limit: int | None = None, readonly: bool = False, env: dict[str, str] | None = None) -> ExecResult:
        """Run `command` with bash (as the agent by default); the hard kill at `timeout_s` takes the
        whole process group. `readonly`: a harness command as another user that writes nothing (a
        checksum, a scan); any other command as another user makes the next change set a full walk.
        `env`: variables of the exec (unlike the command line, which every user reads in /proc, a
        root process's environment is readable by root only). A command with an explicit `user` is the
        harness's own: it runs with HARNESS_PATH (the image's system folders, never the agent's PATH or
        /usr/local, where a root agent may have put a `python3` of its own)."""
        agents = user is None  # the agent's own command (not a harness command as the same user)
        path = {} if agents else {"PATH": HARNESS_PATH}
        user = user or self.agent
        if user == self.agent:
            self.settled = False
        if not readonly and USERS.get(user, user) != USERS["agent"]:
            self.others_wrote = True
        limit = output_limit or self.cfg.output_limit_bytes
        t0 = time.monotonic()
        try:
            code, raw = run_exec(self.client.api, self.container.id, capture_argv(command, timeout_s, limit),
                                 t0 + timeout_s + self.cfg.exec_grace_s, 4 * limit + (1 << 16),
                                 user=USERS.get(user, user), workdir=workdir or self.workdir,
                                 environment={"HOME": self._home(user), **path, **(env or {})})
        except ExecHung as hung:
            return self._unhang(user, hung.partial, time.monotonic() - t0)
        except docker.errors.DockerException as err:
            if agents and (why := stopped_by_agent(self)):
                self.stopped = why  # (the model's doing: the episode ends, its files are judged)
                raise SandboxStopped(why) from None
            if agents and "chdir" in str(err) and "cwd" in str(err):
                # the agent removed (or replaced) its own work dir
                return ExecResult(1, f"bash: cd: {workdir or self.workdir}: No such file or directory (the command "
                                     "cannot start: its working directory is gone)\n", time.monotonic() - t0,
                                  False, 0, False)
            raise SandboxError(f"exec failed in {self.name}: {err}") from None
        duration = time.monotonic() - t0
        if not raw and code == 0:  # the capture always ends with META: the engine lost this exec's output
            raise SandboxError(f"exec in {self.name} exited 0 with an empty output stream (lost by the engine)")
        body, sep, meta = raw.rpartition(META)
        if not sep:  # the capture itself was killed (OOM killer, the pids limit, the agent)
            return ExecResult(code if code is not None else -1, raw.decode("utf-8", errors="replace"), duration,
                              False, len(raw), False, oom_killed=code == 137)
        ec, size, ooms, killed = (int(x) for x in meta.split()[:4])
        return ExecResult(ec, body.decode("utf-8", errors="replace"), duration, bool(killed), size, size > limit,
                          oom_killed=ooms > 0 and not killed)

    def _harness(self, argv: list[str], user: str = "0:0", timeout_s: float = 120,
                 cap: int = 64 << 20) -> tuple[int | None, bytes]:
        """One of the harness's own execs (process counts, kills, file walks): like `exec_run`, with a
        client-side deadline; a stream still open past it is an infrastructure failure, and so is one
        of `cap` bytes or more (a listing is never used cut: it would lose or splice entries)."""
        try:
            # (from `/`: the agent may have removed the work dir, the container's configured cwd)
            code, out = run_exec(self.client.api, self.container.id, argv, time.monotonic() + timeout_s, cap,
                                 user=user, environment={"PATH": HARNESS_PATH}, workdir="/")
        except ExecHung:
            raise SandboxError(f"{argv[0]} in {self.name} did not finish within {timeout_s:g}s") from None
        if len(out) >= cap:
            raise OutputTooLarge(f"{argv[0]} in {self.name} printed {cap >> 10} KiB or more: not used cut")
        return code, out

    def _unhang(self, user: str, partial: bytes, duration: float) -> ExecResult:
        """An exec whose output stream outlived its deadline: a process of the agent's holds it (the
        capture itself is non-dumpable, so only a stopped or killed capture or a root agent's trick gets
        here). The agent's processes are killed, as at a timeout; the command counts as timed out.
        Anything else (a harness command run as another user) is an infrastructure failure."""
        if user != self.agent:
            raise SandboxError(f"exec as {user} in {self.name} still held its output open "
                               f"{self.cfg.exec_grace_s:g}s after its timeout")
        self.kill_agent_processes()
        text = partial.decode("utf-8", errors="replace")
        return ExecResult(137, text + "\n[killed: the command's output stayed open past its timeout]", duration,
                          True, len(partial), False)

    def put_files(self, files: Iterable[FileSpec], parent: str, root: str, uid: int = AGENT_UID,
                  dir_mode: int = 0o755) -> None:
        """Create `parent/root/` with `files`, owned by `uid` (the daemon extracts, not the agent)."""
        self.put_archive(parent, _tar(files, root, uid, dir_mode))

    def put_archive(self, parent: str, data: bytes) -> None:
        """Extract a tar at `parent` (by the engine, owners kept); into a tmpfs work dir through the container."""
        if self.cfg.work_tmpfs_mb and self._touches_work(parent, data):
            self._put_into_work(parent, data)
        else:
            self._put(parent, data)

    def _touches_work(self, parent: str, data: bytes) -> bool:
        work = self.workdir.rstrip("/")
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return any(p == work or p.startswith(work + "/")
                       for p in (posixpath.normpath(posixpath.join(parent, n)) for n in tar.getnames()))

    def _put(self, parent: str, data: bytes) -> None:
        self.others_wrote = True  # the engine extracts as root, anywhere
        try:
            if not self.container.put_archive(parent, data):
                raise SandboxError(f"put_archive to {parent} refused in {self.name}")
        except docker.errors.DockerException as err:
            raise SandboxError(f"put_archive to {parent} failed in {self.name}: {err}") from None

    def capture_work(self, limit: int) -> bytes:
        """The final state: a tar of the work dir (`get_archive`). WorkDirGone (the model's doing, a failure with
        its cause) when the agent removed it or put a file, a link or anything but a folder in its place."""
        self._work_dir_there(missing_ok=False)
        return self.get_archive(self.workdir, limit)

    def _work_dir_there(self, missing_ok: bool) -> None:
        """WorkDirGone unless the work dir is a folder (or, `missing_ok`, absent); a tmpfs work dir is its mount."""
        if self.cfg.work_tmpfs_mb:
            return
        kind = self.path_kind(self.workdir)
        if kind == "dir" or (kind is None and missing_ok):
            return
        what = "removed" if kind is None else f"replaced with a {kind}"
        raise WorkDirGone(f"the work dir {self.workdir} was {what} by the agent: there is no final state to judge")

    def get_archive(self, path: str, limit: int) -> bytes:
        """A tar of `path`; raises SandboxError past `limit` bytes (never buffers more than that)."""
        work = self.workdir.rstrip("/")
        norm = posixpath.normpath(path)
        if self.cfg.work_tmpfs_mb and (norm == work or norm.startswith(work + "/")):
            return self._archive_in_work(norm, limit)
        try:
            stream, _ = self.container.get_archive(path)
            buf = bytearray()
            for chunk in stream:
                buf += chunk
                if len(buf) > limit:
                    raise StateTooLarge(f"{path} in {self.name} exceeds {limit} bytes")
            return bytes(buf)
        except docker.errors.DockerException as err:
            raise SandboxError(f"get_archive {path} failed in {self.name}: {err}") from None

    def _archive_in_work(self, path: str, limit: int) -> bytes:
        """`get_archive` of a path in a tmpfs work dir: the engine reads below the mount (the image's
        files), so `tar` runs in the container, as the work dir's owner, into a spool file taken back."""
        parent, base = posixpath.split(path)
        q = shlex.quote
        code, out = self._harness(["sh", "-c", f"t=$(mktemp /tmp/.tf-state.XXXXXX) && tar -C {q(parent or '/')} "
                                               f"-cf \"$t\" {q(base)} && echo \"$t\""], user=self._work_owner,
                                  timeout_s=120)
        spool = out.decode(errors="replace").strip().splitlines()[-1:] if code == 0 else []
        if not spool or not spool[0].startswith("/tmp/.tf-state."):
            if code == 128 + 25 or b"File size limit exceeded" in out:  # SIGXFSZ: the spool hit file_size_mb
                raise StateTooLarge(f"{path} in {self.name} archives to more than the per-file limit "
                                    f"(sparse or huge files): {out[-200:].decode(errors='replace')}")
            if b"Permission denied" in out:  # everything there is the owner's: only a chmod hides it from it
                raise StateUnreadable(f"the agent left {path} in {self.name} unreadable to its owner: "
                                      f"{out[-300:].decode(errors='replace')}")
            raise SandboxError(f"could not archive {path} in {self.name}: {out[-300:]!r}")
        try:
            return self.get_archive_file(spool[0], limit)
        finally:
            self._harness(["rm", "-f", spool[0]], user=self._work_owner, timeout_s=30)

    def digests(self, globs: list[str]) -> dict[str, str]:
        """sha256 of every file matching `globs` (relative to the work dir), read as root; a file root
        cannot read is `unreadable` (a chmod is a change too)."""
        if not globs:
            return {}
        res = self.exec(f"exec {digest_command(globs)}",
                        60, user="root", output_limit=4 << 20, readonly=True)
        try:
            return json.loads(res.output.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SandboxError(f"could not checksum protected paths in {self.name}: {res.output[-300:]}") from None

    def kill_agent_processes(self) -> int:
        """Kill every process the agent may have left (background jobs included) before verification.
        Returns how many were running (0: the agent left nothing behind; -1: too many to count, e.g.
        a fork bomb filled the pids limit, or not all gone for sure after every try). Retried: under a fork
        bomb even pkill may fail to start."""
        if self.settled:
            return 0
        if self.agent == "root":
            return self._kill_all_but_init()
        u = USERS["agent"]  # pkill as the agent itself: root here has no CAP_KILL over other users
        try:
            _, out = self._harness(["pgrep", "-c", "-u", str(AGENT_UID)])
            text = (out or b"").decode(errors="replace").strip()
            left = int(text) if text.isdigit() else -1
            # (no early return on a count of 0: a chain of forks can be between pgrep's reads of /proc)
            for _ in range(10):
                # kill(-1) as the agent: every process it may signal, in one pass the kernel does not let a
                # fork slip through (pkill reads /proc and signals one by one: a fork chain outruns it)
                self._harness(["sh", "-c", "kill -KILL -1"], user=u)
                # no process of the agent left, twice apart (pgrep reads /proc as it goes: a chain of
                # forks can be between its reads)
                if self._harness(["sh", "-c", f"! pgrep -u {AGENT_UID} && sleep 0.1 && ! pgrep -u {AGENT_UID}"])[0] == 0:
                    break
            else:
                left = -1  # never confirmed gone: they may outlive the episode (hacks.episode_process_flags)
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not stop the agent's processes in {self.name}: {err}") from None
        return left

    def _kill_all_but_init(self) -> int:
        """A root agent: every process but the container's init and its `sleep infinity` (and the
        killing shell itself) is the agent's."""
        keep = " ".join(str(p) for p in sorted(self.keep_pids))
        script = (f'keep=" {keep} $$ "; n=0; for d in /proc/[0-9]*; do p=${{d#/proc/}}; '
                  'case "$keep" in *" $p "*) continue;; esac; n=$((n+1)); kill -9 "$p" 2>/dev/null; done; echo $n')
        try:
            left = -1
            for attempt in range(10):
                _, out = self._harness(["sh", "-c", script])
                text = (out or b"").decode(errors="replace").strip().splitlines()
                n = int(text[-1]) if text and text[-1].isdigit() else -1
                if attempt == 0:
                    left = n
                if n == 0:
                    break
                time.sleep(0.1)
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not stop the agent's processes in {self.name}: {err}") from None
        return left

    def settle(self, globs: list[str], cap: int = DECISION_CAP) -> tuple[int, dict[str, str] | None, ChangeSet]:
        """After the episode: stop the agent's processes, then list what changed (`changes`) and
        checksum `globs` (`digests`). (how many processes were still running, digests, change set).

        One exec when the agent left nothing running (the usual case): the count, the walk and the
        checksums run in the same root shell, the walk and checksums only once the count is 0; else the
        processes are killed first and the exec runs again. Afterwards `kill_agent_processes` is free
        until the agent runs another command (nothing of the agent's can start without one).

        A root agent's container is restarted first (`restart`). When the episode changed the programs
        the walk would run (`toolchain`, read from outside), nothing more runs in the container: the
        digests are None (unknown) and the change set is the engine's (`outside_change_set`)."""
        if self.agent == "root":  # count and kill in one pass: what it printed is what was running
            keep = " ".join(str(p) for p in sorted(self.keep_pids))
            count = (f'keep=" {keep} $$ "; n=0; for d in /proc/[0-9]*; do p=${{d#/proc/}}; '
                     'case "$keep" in *" $p "*) continue;; esac; n=$((n+1)); kill -9 "$p" 2>/dev/null; done')
        else:
            # pgrep reads /proc as it goes and a chain of forks can stay between its reads: the container's
            # pids counter (cgroup v1 here; absent where the cgroup is the namespace's root) is exact, and
            # beyond the init, its `sleep infinity` and this shell, every task is the agent's
            count = (f"n=$(pgrep -c -u {AGENT_UID}); t=; for f in /sys/fs/cgroup/pids/pids.current /sys/fs/cgroup/pids.current; "
                     "do if [ -r $f ]; then read t < $f; break; fi; done; "
                     "if [ \"$n\" = 0 ] && [ -n \"$t\" ] && [ \"$t\" -gt 3 ]; then n=$((t - 3)); fi")
        digest = ""
        if globs:
            # (a work dir the agent removed matches nothing: every protected path then counts as changed)
            digest = (f"printf 'D 0 - '; if cd {shlex.quote(self.workdir)} 2>/dev/null; then timeout -s KILL 60 "
                      f"{digest_command(globs)}; "
                      "else echo '{}'; fi; printf '\\0'; ")
        body = f"{self._changes_script()}; {digest}"
        # venue `fresh` (fresh.py): judged in a new container; so is an episode in place whose image has a VOLUME or
        # (a root agent's) an ENTRYPOINT (`fresh.needs_rebirth`)
        reborn = (self.fresh or fresh.needs_rebirth(self)) and not self.cfg.work_tmpfs_mb
        if reborn:  # count (evidence only), then the episode's container stops and its files go into a new one
            restart = False
            first = self._first_look(f"{count}; printf 'K 0 - %s\\0' \"$n\"", walk=False)
        elif self.agent == "root" and not self.cfg.work_tmpfs_mb:
            # a root agent may have taken over any process, whatever its pid (the init, its `sleep
            # infinity`): count (evidence only: the count runs the container's own shell), then restart the
            # container, so that no process of the episode is left and /dev, /dev/shm start empty
            restart = True
            first = self._first_look(f"{count}; printf 'K 0 - %s\\0' \"$n\"", walk=False)
        else:
            restart = False
            first = self._first_look(f"{count}; printf 'K 0 - %s\\0' \"$n\"; [ \"$n\" = 0 ] || exit 0; {body}")
        if first is None:  # the agent stopped its own container: nothing runs in it; its files go into a new one
            reborn, restart, first = True, False, [("K", "-", "0")]
        counted = next((p for t, _, p in first if t == "K"), "")
        leftover = int(counted) if counted.isdigit() else -1
        rows = None if restart or reborn or leftover != 0 else first
        if restart or reborn:
            # a file, a link or anything but a folder where the work dir was: no container starts with that as its
            # working directory, and there is no final state (the model's doing; a removed one the engine remakes)
            self._work_dir_there(missing_ok=True)
        if reborn:
            fresh.stop_episode(self)
        elif restart:
            self.restart()
        elif leftover != 0 and self.kill_agent_processes() < 0:  # processes were running: stop them, then look
            leftover = -1  # (not all gone for sure: evidence where the tests run in this container)
        # before any more of the container's programs run: did the episode change them? (from outside)
        if self.toolchain():
            self.settled = True
            return leftover, None, self.outside_change_set(cap)
        folders = self.folder_changes()  # (of the episode's own container, before a fresh one replaces it)
        layer = self.layer_changes()  # ...and what its writable layer holds, which a commit carries (fail closed)
        if reborn:
            self.carried = self.layer_paths  # what the commit carries
            fresh.reincarnate(self)
        if rows is None:
            rows = self._find(body)
        after: dict[str, str] = {}
        if globs:
            text = next((p for t, _, p in rows if t == "D"), "")
            try:
                after = json.loads(text.strip().splitlines()[-1])
            except (ValueError, IndexError):  # killed at its 60 s: what the agent left there made it so (the
                # same script checksummed the image's files before): every protected path counts as changed
                after = {"<the checksums did not finish>": text[-300:]}
        self.settled = leftover == 0 or reborn  # else the kill loop may have given up (a fork bomb)
        if reborn:  # what the engine itself writes into every container's layer, and so into the commit
            rows = [r for r in rows if (r[0], r[1], r[2]) not in fresh.ENGINE_FILES]
        changes = self.with_layer(self._change_set(self._with_agent_pass(rows), cap), layer, cap)
        return leftover, after, fresh.with_volumes(changes, {**folders, **self.volume_changes}, cap)

    def _first_look(self, script: str, walk: bool = True) -> list[tuple[str, str, str]] | None:
        """`settle`'s first exec (`_find(script)`); None when the agent's own processes had stopped the container
        (`stopped`, stopped.py): the model's doing, judged from its files. A stopped tmpfs work dir went with its
        container: the final state is gone by the model's doing (FinalStateUnavailable)."""
        if self.stopped is None:
            try:
                return self._find(script, walk=walk)
            except SandboxError:
                self.stopped = stopped_by_agent(self)
                if self.stopped is None:
                    raise
        if self.cfg.work_tmpfs_mb:
            raise FinalStateUnavailable(f"{self.stopped}: its tmpfs work dir {self.workdir} went with it")
        return None

    def changes(self, cap: int = DECISION_CAP) -> ChangeSet:
        """The walk's change set (walk.py) joined with what changed in the image's VOLUMEs (read through the engine,
        against the image's content there: `fresh.volume_changes`), which the walk never enters."""
        return fresh.with_volumes(self.with_layer(super().changes(cap), self.layer_changes(), cap),
                                  fresh.volume_changes(self), cap)

    def outside_change_set(self, cap: int) -> ChangeSet:
        """The change set from the engine's diff of the writable layer (a view the agent cannot reach;
        ~1 s of daemon CPU): for an episode whose container's programs can no longer be trusted."""
        kinds = classify({p: k for p, k in self._engine_diff().items() if not _NOISE.search(p)},
                         self.baseline, self.baseline_dirs)
        added = sorted(p for p, k in kinds.items() if k == "added")
        added = [p for i, p in enumerate(added) if not _has_child(added, p, i)]
        modified = sorted(p for p, k in kinds.items() if k in ("modified", "replaced"))
        deleted = sorted(p for p, k in kinds.items() if k == "deleted")
        return ChangeSet(added=added[:cap], modified=modified[:cap], deleted=deleted[:cap],
                         total=len(added) + len(modified) + len(deleted),
                         truncated=max(len(added), len(modified), len(deleted)) > cap)

    def archive_paths(self, paths: list[str], limit: int) -> bytes | None:
        """A tar (paths relative to /) of the regular files and links among `paths` (folders: their
        whole content); None when it would exceed `limit` bytes. Any name is carried as it is: the list
        reaches `tar` NUL-separated through the engine (`--null --verbatim-files-from`: no line of it is
        an option), so a name holding a newline or starting with `-` cannot add, move or rename files."""
        if not paths:
            return None
        # a folder listed with something below it (its owner or mode changed, and its content too) is carried as
        # the folder alone: whole, it would carry its content twice (a hard link of each file to itself)
        ordered = sorted(set(paths))
        covering = {p for i, p in enumerate(ordered) if i + 1 < len(ordered)
                    and ordered[i + 1].startswith(p.rstrip("/") + "/")}
        lists = {"": [p for p in ordered if p not in covering], "n": sorted(covering)}
        spools = {k: f".tf-list.{uuid.uuid4().hex[:6]}" for k in lists}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for k, spool in spools.items():
                names = b"".join(n + b"\0" for p in lists[k] for n in _spellings(p.lstrip("/")))
                info = tarfile.TarInfo(spool)
                info.size, info.mode = len(names), 0o600
                t.addfile(info, io.BytesIO(names))
        self._put("/tmp", buf.getvalue())
        listed, alone = f"/tmp/{spools['']}", f"/tmp/{spools['n']}"
        tar = self.exec("t=$(mktemp /tmp/.tf-state.XXXXXX) && "
                        f"tar -C / --ignore-failed-read --null --verbatim-files-from -T {listed} --no-recursion "
                        f"-T {alone} -cf \"$t\" 2>/dev/null; rm -f {listed} {alone}; echo \"$t\"",
                        120, user="root", workdir="/").output.strip().splitlines()[-1:]
        if not tar or not tar[0].startswith("/tmp/.tf-state."):
            raise SandboxError(f"could not archive the changed files in {self.name}")
        try:
            return self.get_archive_file(tar[0], limit)
        except StateTooLarge:
            return None
        finally:
            self.exec(f"rm -f {shlex.quote(tar[0])}", 30, user="root", workdir="/")

    def get_archive_file(self, path: str, limit: int) -> bytes:
        """The content of one file (get_archive wraps it in a tar of one member)."""
        data = self.get_archive(path, limit + 4096)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise SandboxError(f"{path} in {self.name} is not a regular file")
            if member.size > limit:
                raise StateTooLarge(f"{path} in {self.name} exceeds {limit} bytes")
            return tar.extractfile(member).read()

    def close(self) -> None:
        """Remove the container with its anonymous volumes (idempotent; also after a start that failed half-way),
        and, for a `fresh` one, the stopped episode container and the commit it was made from."""
        self.container = None
        self._remove_by_name()
        if self.episode_container is not None or self.fresh_image is not None:
            from .fresh import discard

            discard(self)
