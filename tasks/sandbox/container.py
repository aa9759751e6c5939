"""The one sandbox API: a hardened, labelled Docker container per episode or verification.

Defaults: no network, every capability dropped, no-new-privileges, pids/memory/CPU
limits, agent commands as the non-root `agent` user, per-command timeout with a hard kill of the
command's process group, head+tail output truncation, unique names, labels so orphans can be
reaped, never the Docker socket inside. The docker SDK is used (not the CLI) so a worker keeps one
connection pool and errors arrive as typed exceptions.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import time
import uuid
from dataclasses import dataclass
from typing import Iterable

import docker
import docker.errors

from ...schemas.common import FileSpec
from ...schemas.config import SandboxConfig
from ...schemas.environment import DEFAULT_WORKDIR
from .reaper import LABEL, owner_label

AGENT_UID = 1000
WORKDIR = DEFAULT_WORKDIR
USERS = {"agent": f"{AGENT_UID}:{AGENT_UID}", "root": "0:0"}  # numeric: imported images may lack a passwd entry


class SandboxError(RuntimeError):
    """The container could not be created or driven: an infrastructure failure, never the model's."""


class DockerUnavailable(SandboxError):
    pass


class StateTooLarge(SandboxError):
    """The work dir outgrew `final_state_limit_bytes`: the model's doing, not an infrastructure fault."""


def docker_client(pool_size: int = 10) -> docker.DockerClient:
    """A client whose HTTP pool fits `pool_size` concurrent calls (an episode driver keeps many)."""
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


# Runs the command in its own process group under `timeout` (which kills the whole group), keeps
# the full output in a file and returns head + tail when it is longer than the limit.
# The OOM-kill counter of the container's memory cgroup (v2 `memory.events`, v1 `memory.oom_control`)
# is read before and after, so a command killed by the OOM killer is told apart from other kills.
_WRAPPER = r'''
oomc() { cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null \
  | awk '$1=="oom_kill"{n=$2} END{print n+0}'; }
out=$(mktemp /tmp/.tf-out.XXXXXX); limit=$1; half=$((limit / 2)); shift
o1=$(oomc)
timeout -k 2 -s KILL "$@" >"$out" 2>&1 </dev/null; ec=$?
o2=$(oomc)
size=$(wc -c <"$out")
if [ "$size" -gt "$limit" ]; then
  head -c "$half" "$out"; printf '\n[... %d bytes truncated ...]\n' $((size - limit)); tail -c "$half" "$out"
else cat "$out"; fi
printf '\n__TF_META__ %d %d %d\n' "$ec" "$size" $((o2 - o1)); rm -f "$out"
'''


_DIGEST = r"""
import glob, hashlib, json, os, sys
out = {}
for pattern in sys.argv[1:]:
    for p in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isfile(p) or os.path.islink(p):
            try:
                out[p] = hashlib.sha256(open(p, "rb").read()).hexdigest()
            except OSError:
                out[p] = "unreadable"
print(json.dumps(out))
"""


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


class Sandbox:
    """A running container. Use as a context manager; `close()` always removes the container."""

    def __init__(self, client: docker.DockerClient, image: str, cfg: SandboxConfig,
                 labels: dict[str, str] | None = None, workdir: str = DEFAULT_WORKDIR,
                 cap_add: tuple[str, ...] = ()):
        """`cap_add` is for verifier containers only (SETUID/SETGID let hidden tests run agent code as
        the agent user); agent containers keep no capability at all."""
        self.client, self.image, self.cfg, self.workdir, self.cap_add = client, image, cfg, workdir, list(cap_add)
        self.name = f"tf-{uuid.uuid4().hex[:12]}"
        self.labels = {LABEL: "1", "trajforge.owner": owner_label(), **(labels or {})}
        self.container = None

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        try:
            # create + start, never `run`: run would try to pull a missing image from a registry
            self.container = self.client.containers.create(
                self.image, command=["sleep", "infinity"], name=self.name, labels=self.labels,
                detach=True, network_mode="none", cap_drop=["ALL"], cap_add=self.cap_add or None,
                security_opt=["no-new-privileges"],
                pids_limit=self.cfg.pids_limit, mem_limit=f"{self.cfg.memory_mb}m",
                memswap_limit=f"{self.cfg.memory_mb}m", nano_cpus=int(self.cfg.cpus * 1e9),
                working_dir=self.workdir, init=True, environment={"HOME": "/home/agent"},
            )
            self.container.start()
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {self.image!r} not found; build it first (synthesize stage / make setup)") from None
        except Exception as err:  # docker or transport errors; the create may have succeeded
            self._remove_by_name()
            raise SandboxError(f"could not start a container from {self.image!r}: {err}") from None

    def _remove_by_name(self) -> None:
        try:
            self.client.api.remove_container(self.name, force=True)
        except Exception:
            pass  # never created, or reaped later by label

    def exec(self, command: str, timeout_s: float, user: str = "agent", workdir: str | None = None,
             output_limit: int | None = None) -> ExecResult:
        """Run `command` with bash; the hard kill at `timeout_s` takes the whole process group."""
        limit = output_limit or self.cfg.output_limit_bytes
        argv = ["sh", "-c", _WRAPPER, "tf", str(limit), f"{timeout_s:g}", "bash", "-c", command]
        t0 = time.monotonic()
        try:
            code, raw = self.container.exec_run(argv, user=USERS.get(user, user), workdir=workdir or self.workdir,
                                                demux=False,
                                                environment={"HOME": "/home/agent" if user == "agent" else "/root"})
        except docker.errors.DockerException as err:
            raise SandboxError(f"exec failed in {self.name}: {err}") from None
        duration = time.monotonic() - t0
        text = (raw or b"").decode("utf-8", errors="replace")
        body, sep, meta = text.rpartition("\n__TF_META__ ")
        if not sep:  # the wrapper itself was killed (OOM killer or pids limit hit the wrapper)
            return ExecResult(code if code is not None else -1, text, duration, False, len(raw or b""), False,
                              oom_killed=code == 137)
        ec, size, ooms = (int(x) for x in meta.split())
        timed_out = ec == 137 and duration >= timeout_s * 0.95
        return ExecResult(ec, body, duration, timed_out, size, size > limit, oom_killed=ooms > 0 and not timed_out)

    def put_files(self, files: Iterable[FileSpec], parent: str, root: str, uid: int = AGENT_UID,
                  dir_mode: int = 0o755) -> None:
        """Create `parent/root/` with `files`, owned by `uid` (the daemon extracts, not the agent)."""
        self.put_archive(parent, _tar(files, root, uid, dir_mode))

    def put_archive(self, parent: str, data: bytes) -> None:
        try:
            if not self.container.put_archive(parent, data):
                raise SandboxError(f"put_archive to {parent} refused in {self.name}")
        except docker.errors.DockerException as err:
            raise SandboxError(f"put_archive to {parent} failed in {self.name}: {err}") from None

    def get_archive(self, path: str, limit: int) -> bytes:
        """A tar of `path`; raises SandboxError past `limit` bytes (never buffers more than that)."""
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

    def digests(self, globs: list[str]) -> dict[str, str]:
        """sha256 of every file matching `globs` (relative to the work dir), read as root; a file root
        cannot read is `unreadable` (a chmod is a change too)."""
        if not globs:
            return {}
        res = self.exec(f"exec /usr/bin/python3 -I -c {shlex.quote(_DIGEST)} {' '.join(map(shlex.quote, globs))}",
                        60, user="root", output_limit=4 << 20)
        try:
            return json.loads(res.output.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SandboxError(f"could not checksum protected paths in {self.name}: {res.output[-300:]}") from None

    def kill_agent_processes(self) -> int:
        """Kill every process of the agent user (background jobs included) before verification.
        Returns how many were running (0: the agent left nothing behind; -1: too many to count, e.g.
        a fork bomb filled the pids limit). pkill runs as the agent itself: root in these containers
        has no CAP_KILL over other users. Retried: under a fork bomb even pkill may fail to start."""
        u = USERS["agent"]
        try:
            _, out = self.container.exec_run(["pgrep", "-c", "-u", str(AGENT_UID)], user="0:0")
            text = (out or b"").decode(errors="replace").strip()
            left = int(text) if text.isdigit() else -1
            if left == 0:  # nothing runs and nothing can start (no agent exec is in flight): done
                return 0
            for _ in range(10):
                self.container.exec_run(["pkill", "-KILL", "-u", str(AGENT_UID)], user=u)
                code, _ = self.container.exec_run(["pgrep", "-u", str(AGENT_UID)], user="0:0")
                if code == 1:  # no process of the agent left
                    break
                time.sleep(0.1)
        except docker.errors.DockerException as err:
            raise SandboxError(f"could not stop the agent's processes in {self.name}: {err}") from None
        return left

    def close(self) -> None:
        """Remove the container (idempotent; also after a start that failed half-way)."""
        self.container = None
        self._remove_by_name()
