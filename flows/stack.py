"""The persistent stack on one host: PostgreSQL, a Prefect server (API + UI), a `process` work pool
with its worker(s), a Dask scheduler with workers (`trajforge stack up|down|status`).

Invariants:
- everything lives in one state folder (`$TRAJFORGE_STACK_DIR`, default ~/.local/share/trajforge/stack):
  `stack.json` (settings), `run/<part>.pid` (pid + start time), `logs/<part>.log`, `postgres/` (the cluster);
- `up` is idempotent: a part whose recorded process is alive and healthy is left alone; only missing parts
  start, in dependency order, each health-checked before the next;
- `down` stops every recorded process and all of its descendants (flow-run subprocesses, Dask nannies):
  nothing it started is left running; the data stays (`purge=True` removes it too);
- processes the stack starts for other hosts' sake (Prefect workers, Dask workers) get the API URL
  explicitly (`advertise` address), never the environment of whoever ran `up`;
- `status` reports this home's stack only: a part is healthy when it answers *and* a process this home
  recorded runs it (the work pool: on this stack's server); a port answered by anything else (another
  stack on the same ports) is named as such, never counted; a home without `stack.json` has no stack.
PostgreSQL refuses to run as root: as root it runs as the `postgres` user (Debian's package creates it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
from pydantic import BaseModel, Field

PG_BIN = Path(os.environ.get("TRAJFORGE_PG_BIN", "/usr/lib/postgresql/15/bin"))
PARTS = ("postgres", "prefect-server", "work-pool", "prefect-worker", "dask-scheduler", "dask-workers")
_children: dict[int, subprocess.Popen] = {}  # started by this process: reaped on stop (no zombies)


class StackError(RuntimeError):
    """A part of the stack could not be started or checked; the message names it and its log."""


def default_home() -> Path:
    return Path(os.environ.get("TRAJFORGE_STACK_DIR") or Path.home() / ".local/share/trajforge/stack")


def host_address() -> str:
    """This host's first non-loopback IPv4 address (what other hosts use to reach it)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return "127.0.0.1"


class StackSettings(BaseModel):
    """Where the parts listen. `bind` is the listening address of the API and the Dask scheduler
    (`0.0.0.0` for other hosts); `advertise` is the address given to workers (default: `bind`, or this
    host's non-loopback address when `bind` is a wildcard)."""

    home: Path = Field(default_factory=default_home)
    bind: str = "127.0.0.1"
    advertise: str | None = None
    pg_port: int = 54329
    prefect_port: int = 4200
    dask_port: int = 8786
    pool: str = "trajforge"
    prefect_workers: int = Field(1, ge=0)
    dask_workers: int = Field(1, ge=0, description="Dask worker processes")
    dask_threads: int = Field(2, ge=1)

    @property
    def host(self) -> str:
        if self.advertise:
            return self.advertise
        return host_address() if self.bind in ("0.0.0.0", "") else self.bind

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.prefect_port}"

    @property
    def dask_address(self) -> str:
        return f"tcp://{self.host}:{self.dask_port}"

    @property
    def local_api(self) -> str:  # health checks from this host
        return f"http://{'127.0.0.1' if self.bind in ('0.0.0.0', '') else self.bind}:{self.prefect_port}/api"


class PartStatus(BaseModel):
    name: str
    running: bool
    healthy: bool
    pids: list[int] = Field(default_factory=list)
    url: str = ""
    detail: str = ""


def load_settings(home: Path | None = None, **overrides) -> StackSettings:
    """The saved settings of the stack at `home` (or the defaults), with `overrides` applied."""
    home = Path(home or default_home())
    path = home / "stack.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    return StackSettings.model_validate({**saved, "home": home, **{k: v for k, v in overrides.items() if v is not None}})


class Stack:
    """One host's stack; see the module docstring for what `up`, `down` and `status` guarantee."""

    def __init__(self, settings: StackSettings, say: Callable[[str], None] = print):
        self.s, self.say = settings, say
        self.home = settings.home.resolve()
        self.run_dir, self.logs = self.home / "run", self.home / "logs"

    @property
    def has_state(self) -> bool:
        """Whether `home` holds a stack (`up` writes `stack.json` first)."""
        return (self.home / "stack.json").exists()

    # ---- process bookkeeping -------------------------------------------------------------------
    def _pidfile(self, part: str) -> Path:
        return self.run_dir / f"{part}.pid"

    def _procs(self, part: str) -> list[psutil.Process]:
        """The live processes recorded for `part` (a recorded pid whose start time differs is not ours)."""
        path = self._pidfile(part)
        if not path.exists():
            return []
        out = []
        for rec in json.loads(path.read_text()):
            try:
                p = psutil.Process(rec["pid"])
                if abs(p.create_time() - rec["created"]) < 1 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def _spawn(self, part: str, argv: list[str], env: dict[str, str], user: str | None = None) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{part}.log", "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {' '.join(argv)}\n".encode())
            log.flush()
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 cwd=self.home, start_new_session=True, user=user)
        _children[p.pid] = p
        path = self._pidfile(part)
        recs = json.loads(path.read_text()) if path.exists() else []
        recs = [r for r in recs if r["pid"] in {q.pid for q in self._procs(part)}]
        recs.append({"pid": p.pid, "created": psutil.Process(p.pid).create_time(), "argv": argv})
        path.write_text(json.dumps(recs))
        return p.pid

    def _stop(self, part: str, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Stop `part`'s processes and all their descendants; returns how many processes were stopped."""
        procs = self._procs(part)
        family: dict[int, psutil.Process] = {}
        for p in procs:
            family[p.pid] = p
            try:
                family.update({c.pid: c for c in p.children(recursive=True)})
            except psutil.Error:
                pass
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        rest = [p for p in family.values() if _alive(p)]
        for p in rest:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(rest, timeout=10)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        for p in procs:
            child = _children.pop(p.pid, None)
            if child is not None:
                child.wait(timeout=5)
        self._pidfile(part).unlink(missing_ok=True)
        return len(family)

    def _env(self, **extra: str) -> dict[str, str]:
        """The environment of a started part: this one without any Prefect API / profile pointer, plus `extra`."""
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_PROFILE")}
        env.update(PREFECT_HOME=str(self.home / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
        env.update(extra)
        return env

    def _wait(self, part: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if not self._procs(part):
                break
            time.sleep(0.5)
        tail = _tail(self.logs / f"{part}.log")
        raise StackError(f"{part} did not become healthy within {timeout:g}s (log {self.logs / f'{part}.log'}):\n{tail}")

    # ---- PostgreSQL ---------------------------------------------------------------------------------
    @property
    def pg_user(self) -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    def _pg_root(self) -> Path:
        """The folder holding the cluster: `<home>/postgres`; as root, a folder the `postgres` user owns
        (under /var/lib/postgresql when it cannot reach `<home>`), linked from `<home>/postgres`."""
        link = self.home / "postgres"
        if link.exists() or self.pg_user is None:
            return link.resolve()
        reachable = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(self.home)]).returncode == 0
        if reachable:
            return link
        root = Path("/var/lib/postgresql/trajforge") / hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        root.mkdir(parents=True, exist_ok=True)
        link.symlink_to(root)
        return root

    def _pg_password(self) -> str:
        path = self.home / "postgres.password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(18))
            path.chmod(0o600)
        return path.read_text().strip()

    @property
    def database_url(self) -> str:
        return f"postgresql+asyncpg://trajforge:{self._pg_password()}@127.0.0.1:{self.s.pg_port}/prefect"

    def _pg_ready(self) -> bool:
        """PostgreSQL answers on its port (False when PostgreSQL is not installed: no `pg_isready`)."""
        if not (PG_BIN / "pg_isready").exists():
            return False
        r = subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.s.pg_port)])
        return r.returncode == 0

    def _start_postgres(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise StackError(f"postgres: not installed (no {PG_BIN / 'initdb'}; `make setup` installs PostgreSQL 15, "
                             "or set TRAJFORGE_PG_BIN)")
        root = self._pg_root()
        data, fresh = root / "data", not (root / "data" / "PG_VERSION").exists()
        password = self._pg_password()
        if fresh:
            root.mkdir(parents=True, exist_ok=True)
            pwfile = root / "initdb.pw"
            pwfile.write_text(password)
            if self.pg_user:
                pw = pwd.getpwnam(self.pg_user)
                for p in (root, pwfile):
                    os.chown(p, pw.pw_uid, pw.pw_gid)
            r = subprocess.run([str(PG_BIN / "initdb"), "-D", str(data), "-U", "trajforge", f"--pwfile={pwfile}",
                                "--auth-host=scram-sha-256", "--auth-local=peer", "-E", "UTF8", "--no-instructions"],
                               user=self.pg_user, capture_output=True, text=True, cwd="/")
            pwfile.unlink(missing_ok=True)
            if r.returncode:
                raise StackError(f"postgres: initdb {data} failed: {r.stderr.strip()[-2000:]}")
        self._spawn("postgres", [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(self.s.pg_port),
                                 "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                                 "-c", "max_connections=200"], self._env(), user=self.pg_user)
        self._wait("postgres", self._pg_ready, 60)
        if fresh:
            r = subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.s.pg_port), "-U",
                                "trajforge", "prefect"], env={**os.environ, "PGPASSWORD": password},
                               capture_output=True, text=True)
            if r.returncode and "already exists" not in r.stderr:
                raise StackError(f"postgres: createdb prefect failed: {r.stderr.strip()}")

    # ---- Prefect --------------------------------------------------------------------------------------
    def _api(self, method: str, path: str, **kw):
        import httpx

        return httpx.request(method, self.s.local_api + path, timeout=10, **kw)

    def _api_healthy(self) -> bool:
        try:
            return self._api("GET", "/health").status_code == 200
        except Exception:
            return False

    def _start_server(self) -> None:
        env = self._env(PREFECT_API_DATABASE_CONNECTION_URL=self.database_url, PREFECT_UI_API_URL=self.s.api_url,
                        PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false")
        self._spawn("prefect-server", [sys.executable, "-m", "prefect", "server", "start", "--host", self.s.bind,
                                       "--port", str(self.s.prefect_port), "--analytics-off"], env)
        self._wait("prefect-server", self._api_healthy, float(os.environ.get("TRAJFORGE_PREFECT_STARTUP_TIMEOUT", 240)))

    def _pool_exists(self) -> bool:
        try:
            return self._api("GET", f"/work_pools/{self.s.pool}").status_code == 200
        except Exception:
            return False

    def _create_pool(self) -> None:
        from prefect.workers.process import ProcessWorker

        r = self._api("POST", "/work_pools/", json={
            "name": self.s.pool, "type": "process", "description": "trajforge builds (hosts with a Docker engine)",
            "base_job_template": ProcessWorker.get_default_base_job_template()})
        if r.status_code not in (201, 409):
            raise StackError(f"work-pool: creating {self.s.pool!r} failed: HTTP {r.status_code} {r.text[:300]}")

    def _worker_names(self) -> list[str]:
        return [f"trajforge-{socket.gethostname()}-{i}" for i in range(self.s.prefect_workers)]

    def _workers_online(self) -> bool:
        try:
            r = self._api("POST", f"/work_pools/{self.s.pool}/workers/filter", json={})
            online = {w["name"] for w in r.json() if w.get("status") == "ONLINE"}
        except Exception:
            return False
        return set(self._worker_names()) <= online

    def _start_workers(self) -> None:
        env = self._env(PREFECT_API_URL=self.s.api_url, TRAJFORGE_DASK_ADDRESS=self.s.dask_address,
                        PREFECT_LOGGING_TO_API_ENABLED="true")
        for name in self._worker_names():
            self._spawn("prefect-worker", [sys.executable, "-m", "prefect", "worker", "start", "--pool", self.s.pool,
                                           "--type", "process", "--name", name], env)
        self._wait("prefect-worker", self._workers_online, 120)

    # ---- Dask -----------------------------------------------------------------------------------------
    def dask_info(self, timeout: float = 5) -> dict | None:
        """{'workers': n, 'api_urls': {worker: PREFECT_API_URL seen there}} or None if unreachable."""
        if not self._scheduler_up():
            return None
        try:
            from distributed import Client

            with Client(self.s.dask_address, timeout=timeout) as c:
                urls = c.run(lambda: os.environ.get("PREFECT_API_URL")) if c.scheduler_info()["workers"] else {}
                return {"workers": len(c.scheduler_info()["workers"]), "api_urls": urls}
        except Exception:
            return None

    def _scheduler_up(self) -> bool:
        try:
            with socket.create_connection((self.s.host, self.s.dask_port), timeout=2):
                return True
        except OSError:
            return False

    def _start_scheduler(self) -> None:
        self._spawn("dask-scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", self.s.bind,
                                       "--port", str(self.s.dask_port), "--no-dashboard"],
                    self._env(DASK_LOGGING__DISTRIBUTED="warning"))
        self._wait("dask-scheduler", self._scheduler_up, 60)

    def _start_dask_workers(self) -> None:
        # a worker of another host gets exactly these: the scheduler's and the API's advertised addresses
        env = self._env(PREFECT_API_URL=self.s.api_url, PREFECT_LOGGING_TO_API_ENABLED="false",
                        DASK_LOGGING__DISTRIBUTED="warning")
        self._spawn("dask-workers", [sys.executable, "-m", "distributed.cli.dask_worker", self.s.dask_address,
                                     "--nworkers", str(self.s.dask_workers), "--nthreads", str(self.s.dask_threads),
                                     "--host", self.s.host, "--no-dashboard", "--name", f"trajforge-{socket.gethostname()}"],
                    env)
        self._wait("dask-workers", lambda: (self.dask_info() or {}).get("workers", 0) >= self.s.dask_workers, 90)

    # ---- the parts ------------------------------------------------------------------------------------
    def _parts(self) -> list[tuple[str, Callable[[], bool], Callable[[], None], bool]]:
        """(name, healthy, start, wanted) in start order."""
        return [
            ("postgres", self._pg_ready, self._start_postgres, True),
            ("prefect-server", self._api_healthy, self._start_server, True),
            ("work-pool", self._pool_exists, self._create_pool, True),
            ("prefect-worker", self._workers_online, self._start_workers, self.s.prefect_workers > 0),
            ("dask-scheduler", self._scheduler_up, self._start_scheduler, True),
            ("dask-workers", lambda: (self.dask_info() or {}).get("workers", 0) >= self.s.dask_workers,
             self._start_dask_workers, self.s.dask_workers > 0),
        ]

    def up(self) -> list[str]:
        """Start what is missing (idempotent); returns the names of the parts started."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "stack.json").write_text(self.s.model_dump_json(indent=2, exclude={"home"}))
        started = []
        for name, healthy, start, wanted in self._parts():
            if not wanted:
                continue
            process_part = name != "work-pool"
            if (not process_part or self._procs(name)) and healthy():
                continue
            if process_part and self._procs(name):  # running but unhealthy: restart it
                self.say(f"{name}: running but not healthy, restarting")
                self._stop(name, signal.SIGINT if name == "postgres" else signal.SIGTERM)
            elif process_part and healthy():
                raise StackError(f"{name}: something else already answers on its port; stop it or choose another "
                                 f"port (stack settings in {self.home / 'stack.json'})")
            self.say(f"starting {name} ...")
            start()
            started.append(name)
        return started

    def down(self, purge: bool = False) -> int:
        """Stop every part (reverse order) and their descendants; returns how many processes were stopped."""
        n = 0
        for name in reversed(PARTS):
            if name != "work-pool":
                n += self._stop(name, signal.SIGINT if name == "postgres" else signal.SIGTERM)
        if purge:
            link = self.home / "postgres"
            if link.is_symlink():
                shutil.rmtree(link.resolve(), ignore_errors=True)
            shutil.rmtree(self.home, ignore_errors=True)
        return n

    def processes(self) -> list[psutil.Process]:
        """Every live process of the stack (recorded ones and their descendants)."""
        out = []
        for name in PARTS:
            for p in self._procs(name):
                out.append(p)
                with contextlib.suppress(psutil.Error):
                    out.extend(p.children(recursive=True))
        return out

    def status(self) -> list[PartStatus]:
        """Each part of this home's stack; healthy = answers and runs as a process this home recorded."""
        urls = {"postgres": f"postgresql://127.0.0.1:{self.s.pg_port}/prefect", "prefect-server": self.s.ui_url,
                "work-pool": f"{self.s.ui_url}/work-pools/work-pool/{self.s.pool}",
                "dask-scheduler": self.s.dask_address, "dask-workers": self.s.dask_address}
        out, ours = [], {}
        for name, healthy, _, wanted in self._parts():
            procs = self._procs(name) if name != "work-pool" else []
            detail = "" if wanted else "not configured"
            if not wanted:
                ok = True
            elif name == "work-pool":  # only this stack's server counts (another one may have the pool)
                ok = ours.get("prefect-server", False) and healthy()
                if not ours.get("prefect-server", False):
                    detail = "this stack's Prefect server is not running"
            else:
                answers = healthy()
                ok = answers and bool(procs)
                if answers and not procs:
                    detail = (f"something answers at {urls.get(name, self.s.api_url)}, but no process of this "
                              f"stack ({self.home}) runs it: another stack's?")
            ours[name] = ok
            if name == "postgres" and wanted and not (PG_BIN / "pg_isready").exists():
                detail = f"not installed (no {PG_BIN}; `make setup` installs PostgreSQL 15)"
            if name == "dask-workers" and wanted and ours.get("dask-scheduler"):
                info = self.dask_info() or {}
                detail = f"{info.get('workers', 0)} worker(s), API {sorted(set(info.get('api_urls', {}).values()))}"
            out.append(PartStatus(name=name, running=bool(procs) or name == "work-pool" and ok, healthy=ok,
                                  pids=[p.pid for p in procs], url=urls.get(name, self.s.api_url), detail=detail))
        return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
