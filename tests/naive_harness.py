"""A deliberately naive verification harness for imported Harbor / Terminal-Bench task folders.

It does what a plain harness does, nothing more: build the task's image (FROM mapped to the local
base image, legacy builder, no network), start a container, run the trajectory's commands as root
in the work dir, copy the tests to /tests (merged into whatever is there), run the task's test
script as root, and read the reward the usual way:

- Harbor: `mkdir -p /logs/verifier` (an existing folder is NOT reset), `bash /tests/test.sh` in the
  work dir, then `/logs/verifier/reward.json` (`{"reward": x}` or a bare number) if present, else
  `reward.txt`, else 0.0.
- Terminal-Bench 1.x: `cd <workdir> && TEST_DIR=/tests bash /tests/run-tests.sh`; if the output has
  pytest `PASSED` / `FAILED` / `ERROR` result lines, 1.0 when every test's last status is PASSED,
  else 0.0; with no such lines, 1.0 when the exit code is 0.

It is the baseline the integrity fixtures (tests/fixtures/integrity) are measured against: every
hack trajectory there scores 1.0 with it. `reset_verifier_dirs=True` makes it do the one hardening
step most harnesses have (`rm -rf /tests /logs/verifier` before the tests), to show which hacks
survive it. One image per task folder is built per process (`tf-naive/<task>:<random>`), shared by
the runs in flight on that folder and removed when the last of them returns: two concurrent builds of
one folder share the engine's cached layers, so removing one run's image while another build hits
that cache fails the other ("failed to get digest"); its untagged parents stay (other folders' builds may
be using them as cache). Containers are removed after each run
(`cleanup()` removes anything a crashed run left behind).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import tempfile
import threading
import tomllib
import uuid
from pathlib import Path

import docker
import docker.errors

from trajforge.tasks.envs import images

BASE_IMAGE = "trajforge/base:latest"
LABEL = {"tf-naive": "1"}
WORKDIR_LINE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.I | re.M)
RESULT_LINE = re.compile(r"^(PASSED|FAILED|ERROR)\s+(\S+)", re.M)
COMMAND_TIMEOUT_S = 120
TEST_TIMEOUT_S = 180
_IMAGES_LOCK = threading.Lock()
_IMAGES: dict[Path, list] = {}  # task folder -> [tag, runs using it, build lock, built]


def task_format(task_dir: Path) -> str:
    task_dir = Path(task_dir)
    if (task_dir / "task.toml").exists():
        return "harbor"
    if (task_dir / "task.yaml").exists():
        return "tbench"
    raise ValueError(f"{task_dir}: neither task.toml (Harbor) nor task.yaml (Terminal-Bench)")


def map_from(dockerfile: str, base: str = BASE_IMAGE) -> str:
    """Every `FROM image` that is not an earlier build stage becomes the local base image (the plain
    rewrite every harness does: trajforge's with one catch-all alias)."""
    return images.map_from(dockerfile, {"*": "{base}"}, base)


def workdir_of(task_dir: Path) -> str:
    """Harbor: task.toml [environment].workdir, else the Dockerfile's last WORKDIR, else /app.
    Terminal-Bench: the Dockerfile's last WORKDIR, else /."""
    task_dir = Path(task_dir)
    if task_format(task_dir) == "harbor":
        meta = tomllib.loads((task_dir / "task.toml").read_text())
        explicit = (meta.get("environment") or {}).get("workdir")
        if explicit:
            return explicit
        found = WORKDIR_LINE.findall((task_dir / "environment" / "Dockerfile").read_text())
        return found[-1] if found else "/app"
    found = WORKDIR_LINE.findall((task_dir / "Dockerfile").read_text())
    return found[-1] if found else "/"


def _tests_tar(task_dir: Path, kind: str) -> bytes:
    """A tar whose root is `tests/`: Harbor's tests/ folder; Terminal-Bench's run-tests.sh + tests/."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        root = tarfile.TarInfo("tests")
        root.type, root.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(root)
        sources: list[tuple[Path, str]] = []
        if kind == "tbench":
            sources.append((task_dir / "run-tests.sh", "tests/run-tests.sh"))
        tests = task_dir / "tests"
        if tests.is_dir():
            for p in sorted(tests.rglob("*")):
                sources.append((p, "tests/" + p.relative_to(tests).as_posix()))
        for path, name in sources:
            if path.is_dir():
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif path.is_file():
                data = path.read_bytes()
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o755 if path.stat().st_mode & 0o111 else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _build(client: docker.DockerClient, task_dir: Path, kind: str, tag: str) -> None:
    context = task_dir / "environment" if kind == "harbor" else task_dir
    with tempfile.TemporaryDirectory(prefix="tf-naive-") as tmp:
        ctx = Path(tmp) / "ctx"
        shutil.copytree(context, ctx, symlinks=True)
        (ctx / ".naive.Dockerfile").write_text(map_from((context / "Dockerfile").read_text()))
        log = []
        try:
            for chunk in client.api.build(path=str(ctx), dockerfile=".naive.Dockerfile", tag=tag, rm=True,
                                          forcerm=True, network_mode="none", labels=LABEL, decode=True):
                if "stream" in chunk:
                    log.append(chunk["stream"])
                if "error" in chunk:
                    raise RuntimeError(f"build of {task_dir} failed: {chunk['error']}\n{''.join(log)[-2000:]}")
        except docker.errors.APIError as err:
            raise RuntimeError(f"build of {task_dir} failed: {err}\n{''.join(log)[-2000:]}") from None


def _exec(container, cmd: str, workdir: str, timeout_s: int) -> tuple[int, str]:
    res = container.exec_run(["timeout", "-k", "5", str(timeout_s), "bash", "-c", cmd], user="root",
                             workdir=workdir, demux=False)
    return res.exit_code, (res.output or b"").decode("utf-8", "replace")


def tbench_reward(output: str, exit_code: int) -> float:
    """Last status per test name wins; 1.0 when all are PASSED. No result lines: the exit code."""
    last: dict[str, str] = {}
    for status, name in RESULT_LINE.findall(output):
        last[name] = status
    if last:
        return 1.0 if all(s == "PASSED" for s in last.values()) else 0.0
    return 1.0 if exit_code == 0 else 0.0


def _harbor_reward(container) -> float:
    code, text = _exec(container, "cat /logs/verifier/reward.json", "/", 10)
    if code == 0 and text.strip():
        try:
            data = json.loads(text)
            value = float(data["reward"] if isinstance(data, dict) else data)
            return min(1.0, max(0.0, value))
        except (ValueError, TypeError, KeyError):
            return 0.0
    code, text = _exec(container, "cat /logs/verifier/reward.txt", "/", 10)
    if code == 0 and text.strip():
        try:
            return min(1.0, max(0.0, float(text.split()[0])))
        except ValueError:
            return 0.0
    return 0.0


def run_task(task_dir: Path, commands: list[str], *, reset_verifier_dirs: bool = False,
             client: docker.DockerClient | None = None) -> dict:
    """Run `commands` then the task's tests; returns {"reward", "output", "exit_code", "steps"}."""
    task_dir = Path(task_dir).resolve()
    kind = task_format(task_dir)
    workdir = workdir_of(task_dir)
    client = client or docker.from_env(timeout=300)
    name = re.sub(r"[^a-z0-9._-]+", "-", task_dir.name.lower()).strip("-.") or "task"
    tag = _acquire_image(client, task_dir, kind, name)
    container = None
    try:
        container = client.containers.run(tag, ["sleep", "infinity"], detach=True, network_mode="none",
                                          user="root", labels=LABEL, name=f"tf-naive-{name}-{uuid.uuid4().hex[:8]}")
        _exec(container, f"mkdir -p {workdir}", "/", 10)
        steps = [_exec(container, cmd, workdir, COMMAND_TIMEOUT_S) for cmd in commands]
        if reset_verifier_dirs:
            _exec(container, "rm -rf /tests /logs/verifier", "/", 10)
        container.put_archive("/", _tests_tar(task_dir, kind))
        if kind == "harbor":
            code, output = _exec(container, "mkdir -p /logs/verifier && bash /tests/test.sh", workdir, TEST_TIMEOUT_S)
            reward = _harbor_reward(container)
        else:
            code, output = _exec(container, f"cd {workdir} && TEST_DIR=/tests bash /tests/run-tests.sh", workdir,
                                 TEST_TIMEOUT_S)
            reward = tbench_reward(output, code)
        return {"reward": reward, "output": output, "exit_code": code, "steps": steps}
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
        _release_image(client, task_dir)


def _acquire_image(client: docker.DockerClient, task_dir: Path, kind: str, name: str) -> str:
    """The folder's image, built by the first run that needs it; every caller must release it."""
    with _IMAGES_LOCK:
        entry = _IMAGES.setdefault(task_dir, [f"tf-naive/{name}:{uuid.uuid4().hex[:10]}", 0, threading.Lock(), False])
        entry[1] += 1
    tag, _, build_lock, _ = entry
    try:
        with build_lock:
            if not entry[3]:
                _build(client, task_dir, kind, tag)
                entry[3] = True
    except BaseException:
        _release_image(client, task_dir)
        raise
    return tag


def _release_image(client: docker.DockerClient, task_dir: Path) -> None:
    with _IMAGES_LOCK:
        entry = _IMAGES[task_dir]
        entry[1] -= 1
        if entry[1]:
            return
        del _IMAGES[task_dir]
        try:  # under the lock: a new build of this folder must not start while its cached image goes;
            # noprune: its untagged parents are other folders' build cache too (a shared Dockerfile prefix), and
            # deleting them under a build that hit them fails it ("unknown parent image ID")
            client.images.remove(entry[0], force=True, noprune=True)
        except docker.errors.APIError:
            pass


def naive_reward(task_dir: Path, commands: list[str], **kwargs) -> float:
    """The reward a plain root harness gives `commands` on the task folder `task_dir`."""
    return run_task(task_dir, commands, **kwargs)["reward"]


def cleanup(client: docker.DockerClient | None = None) -> None:
    """Remove every container and image this module created (by label / tag), e.g. after a crash."""
    client = client or docker.from_env(timeout=300)
    for c in client.containers.list(all=True, filters={"label": "tf-naive=1"}):
        try:
            c.remove(force=True)
        except docker.errors.APIError:
            pass
    for img in client.images.list(filters={"label": "tf-naive=1"}):
        for tag in img.tags:
            if tag.startswith("tf-naive/"):
                try:
                    client.images.remove(tag, force=True)
                except docker.errors.APIError:
                    pass
