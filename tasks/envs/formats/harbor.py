"""Format `harbor`: `task.toml`, `instruction.md`, `environment/Dockerfile` (+ build context),
`tests/test.sh` (+ files), `solution/solve.sh`; the reward is read from
`/logs/verifier/reward.json|txt`. Export writes any EnvSpec as a Harbor task folder (Dockerfile on
the local base image, the trajforge test runner writing `reward.json` with per-test results,
`solve.sh`), which imports back to the same environment and verdicts.

Identity: an exported terminal environment's `task.toml` records its env id (`trajforge_env_id`) and a
digest of the folder (`trajforge_digest`: every file but task.toml by path and content, plus task.toml's
fields without the digest; file modes are left out, which a Hub snapshot does not keep). Import gives
back that env id when the digest matches, so a folder that went through the Hub comes back as the
same environment; an edited folder (or one without the record) gets an id of its own content, as any
imported task does. The digest guards against accidental edits, not forgery (anyone can recompute
it): a recorded id is a claim. So where ids meet, content decides: `propose` keeps one candidate per id
and rejects another content under it (`env_id_conflict`), and the import journal reuses an outcome only
for the same content (`Journal.holds`).
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

from ....schemas.common import FileSpec
from ....schemas.config import safe_name
from ....schemas.environment import Blob, EnvSpec
from ...judge.verifier import RUNNER
from ..blobs import BlobStore
from ..images import render
from . import base
from .base import TaskFormat, TaskFormatError, check_links, folder_digest


def _agent_user(meta: dict, where: Path) -> str:
    """Harbor tasks assume a root agent; an environment trajforge exported keeps the user it had."""
    user = meta.get("metadata", {}).get("trajforge_agent_user", "root")
    if user not in ("agent", "root"):
        raise TaskFormatError(where, f"[metadata].trajforge_agent_user must be 'agent' or 'root', got {user!r}")
    return user


ENV_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def export_digest(folder: Path, meta: dict) -> str:
    """The digest `trajforge_digest` records (see the module docstring)."""
    h = hashlib.sha256()
    fields = {k: v for k, v in meta.get("metadata", {}).items() if k != "trajforge_digest"}
    h.update(json.dumps({**meta, "metadata": fields}, sort_keys=True, default=str).encode())
    for p in sorted(Path(folder).rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel == "task.toml":
            continue
        if p.is_symlink():
            h.update(b"\0L" + rel.encode() + b"\0" + str(p.readlink()).encode())
        elif p.is_file():
            h.update(b"\0F" + rel.encode() + b"\0%d\0" % p.stat().st_size + p.read_bytes())
    return h.hexdigest()[:32]


def recorded_env_id(folder: Path, meta: dict) -> str | None:
    """The env id an unmodified trajforge export records, else None."""
    fields = meta.get("metadata", {})
    env_id, digest = fields.get("trajforge_env_id"), fields.get("trajforge_digest")
    if not isinstance(env_id, str) or not isinstance(digest, str) or not ENV_ID.match(env_id):
        return None
    return env_id if export_digest(folder, meta) == digest else None


def import_harbor(folder: Path) -> EnvSpec:
    folder = Path(folder)
    toml_path = folder / "task.toml"
    meta = base.parse_meta(toml_path, tomllib.loads, tomllib.TOMLDecodeError, "TOML")
    for section in ("agent", "verifier", "environment", "metadata"):
        if section in meta and not isinstance(meta[section], dict):
            raise TaskFormatError(toml_path, f"[{section}] must be a table")
    environment = meta.get("environment", {})
    instruction = base.read_file(folder / "instruction.md", "the task instruction").strip()
    if not instruction:
        raise TaskFormatError(folder / "instruction.md", "empty instruction")
    check_links(folder)
    blobs: list[Blob] = []
    if environment.get("docker_image"):
        dockerfile, context = f"FROM {environment['docker_image']}\n", []
    else:
        dockerfile = base.read_file(folder / "environment" / "Dockerfile", "the environment's Dockerfile")
        context = base.file_specs(folder / "environment", blobs=BlobStore(), carried=blobs)
    tests = base.file_specs(folder / "tests")
    if not any(t.path == "test.sh" for t in tests):
        raise TaskFormatError(folder / "tests" / "test.sh", "missing (the verifier entry point)")
    # published corpora often ship tasks without a reference solution: kept, marked `oracle: absent`
    has_solve = (folder / "solution" / "solve.sh").exists()
    solve = base.read_file(folder / "solution" / "solve.sh", "the reference solution") if has_solve else None
    difficulty = str(meta.get("metadata", {}).get("difficulty", "medium")).lower()
    return EnvSpec(
        # every file of the folder counts (build-context data and binary files too): a changed file is another id
        env_id=recorded_env_id(folder, meta) or base.folder_env_id("harbor", folder, [folder_digest(folder)]),
        oracle="present" if has_solve else "absent", blobs=blobs,
        build_timeout_s=base.number(environment.get("build_timeout_sec"), toml_path, "[environment].build_timeout_sec"),
        family=f"harbor:{safe_name(str(meta.get('metadata', {}).get('category', 'task')))}",
        level=base.LEVELS.get(difficulty, 2), seed=0, source="harbor", instruction=instruction,
        dockerfile=dockerfile, context=context,
        workdir=base.workdir_of(dockerfile, environment.get("workdir"), toml_path), agent_user=_agent_user(meta, toml_path),
        tests=tests, verifier="script", test_command="bash /tests/test.sh", solution=[solve] if solve is not None else [],
        agent_timeout_s=base.number(meta.get("agent", {}).get("timeout_sec"), toml_path, "[agent].timeout_sec"),
        test_timeout_s=base.number(meta.get("verifier", {}).get("timeout_sec"), toml_path, "[verifier].timeout_sec"),
        knobs_json=f'{{"imported_from": "{folder.name}"}}')


def export_harbor(env: EnvSpec, dest: Path, base_image: str = "trajforge/base:latest") -> Path:
    """Write `env` as a Harbor task folder `dest/<env_id>`; returns it."""
    import tomli_w

    out = Path(dest) / env.env_id
    for sub in ("environment", "tests", *(("solution",) if env.oracle == "present" else ())):
        (out / sub).mkdir(parents=True, exist_ok=True)
    difficulty = {1: "easy", 2: "medium"}.get(env.level, "hard")
    meta = {"version": "1.0",
            "metadata": {"difficulty": difficulty, "category": env.family.split(":")[0],
                         "tags": ["trajforge", env.source], "trajforge_env_id": env.env_id,
                         "trajforge_agent_user": env.agent_user},
            "verifier": {"timeout_sec": float(env.test_timeout_s or 120)},
            "agent": {"timeout_sec": float(env.agent_timeout_s or 600)},
            "environment": {"workdir": env.workdir,
                            **({"build_timeout_sec": env.build_timeout_s} if env.build_timeout_s else {})}}
    (out / "task.toml").write_text(tomli_w.dumps(meta))
    (out / "instruction.md").write_text(env.instruction + "\n")
    dockerfile, context = render(env, base_image, {})
    if env.dockerfile is not None:  # imported before: keep its own Dockerfile (handover is re-added on import)
        dockerfile = env.dockerfile
        context = list(env.context)
        if env.setup:
            raise ValueError(f"{env.env_id}: cannot export setup commands on top of a custom Dockerfile")
    (out / "environment" / "Dockerfile").write_text(dockerfile)
    for f in context:
        _write(out / "environment" / f.path, f)
    store = BlobStore() if env.blobs else None
    for b in env.blobs:
        (out / "environment" / b.path).parent.mkdir(parents=True, exist_ok=True)
        (out / "environment" / b.path).write_bytes(store.get(b.sha256))
        (out / "environment" / b.path).chmod(b.mode)
    if env.verifier == "functions":
        _write(out / "tests" / "runner.py", FileSpec(path="runner.py", content=RUNNER))
        for t in env.tests:
            _write(out / "tests" / t.path, t)
        _write(out / "tests" / "test.sh", FileSpec(path="test.sh", mode=0o755, content=(
            "#!/bin/bash\n# trajforge's test runner: per-test results and the reward in /logs/verifier/reward.json\n"
            "mkdir -p /logs/verifier\n"
            f"TESTS_DIR=/tests WORK={env.workdir} REWARD_JSON=/logs/verifier/reward.json "
            "exec python3 -I /tests/runner.py\n")))
    else:
        for t in env.tests:
            _write(out / "tests" / t.path, t)
    if env.oracle == "present":
        script = env.solution[0] if len(env.solution) == 1 else "\n".join(env.solution)
        _write(out / "solution" / "solve.sh", FileSpec(path="solve.sh", content=script + "\n", mode=0o755))
    if env.kind == "terminal":  # other kinds have no Harbor form that imports back as them: no identity claimed
        meta["metadata"]["trajforge_digest"] = export_digest(out, tomllib.loads((out / "task.toml").read_text()))
        (out / "task.toml").write_text(tomli_w.dumps(meta))
    return out


def _write(path: Path, f: FileSpec) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f.content)
    path.chmod(f.mode)


class Harbor(TaskFormat):
    name = "harbor"
    marker = "task.toml"

    def read(self, folder: Path) -> EnvSpec:
        return import_harbor(folder)

    def write(self, env: EnvSpec, dest: Path, base_image: str = "trajforge/base:latest") -> Path:
        return export_harbor(env, dest, base_image)
