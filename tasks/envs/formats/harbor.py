"""Format `harbor`: `task.toml`, `instruction.md`, `environment/Dockerfile` (+ build context),
`tests/test.sh` (+ files), `solution/solve.sh`; the reward is read from
`/logs/verifier/reward.json|txt`. Export writes any EnvSpec as a Harbor task folder (Dockerfile on
the local base image, the trajforge test runner writing `reward.json` with per-test results,
`solve.sh`), which imports back to the same environment and verdicts.

Identity: a procedural environment's export records where it comes from (`trajforge_env_id`,
`trajforge_family`, `trajforge_level`, `trajforge_seed` in `[metadata]`). Import believes that record only
when it can check it: it regenerates the environment (family x level x seed, with this trajforge) and
exports it again (without the reference solution when the folder has none); when every file is the
same, byte for byte (file modes aside: a Hub snapshot does not keep them), the folder IS that
environment and imports as it, same env id and content. Anything else (an edited or forged folder, a
family that changed since, an environment of another source) gets an id of its own content, as any
imported task does: an id is never taken on a file's word.
"""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path

from ....schemas.common import FileSpec
from ....schemas.config import safe_name
from ....schemas.environment import MAX_AGENT_TIMEOUT_S, MAX_BUILD_TIMEOUT_S, MAX_TEST_TIMEOUT_S, Blob, EnvSpec
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


def _files(folder: Path) -> dict[str, bytes] | None:
    """Every file of a folder by relative path (None when it holds a symlink: no export writes one)."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_symlink():
            return None
        if p.is_file():
            out[p.relative_to(folder).as_posix()] = p.read_bytes()
    return out


def regenerated(folder: Path, meta: dict) -> EnvSpec | None:
    """The procedural environment a folder's `[metadata]` names, when regenerating and exporting it gives
    exactly this folder (see the module docstring); else None."""
    from ..families import FAMILIES

    fields = meta.get("metadata", {})
    family, level, seed = (fields.get(k) for k in ("trajforge_family", "trajforge_level", "trajforge_seed"))
    if family not in FAMILIES or FAMILIES[family].kind != "terminal" or not isinstance(level, int) \
            or not isinstance(seed, int):
        return None
    try:
        env = FAMILIES[family].generate(level, seed)
    except Exception:  # a level or seed the family does not make
        return None
    if env.env_id != fields.get("trajforge_env_id") or env.kind != "terminal":
        return None
    if env.oracle == "present" and not (folder / "solution").exists():  # published without solutions
        env = env.model_copy(update={"solution": [], "oracle": "absent"})
    dockerfile = folder / "environment" / "Dockerfile"
    first = dockerfile.read_text(errors="replace").split("\n", 1)[0] if dockerfile.is_file() else ""
    if not first.startswith("FROM "):
        return None
    with tempfile.TemporaryDirectory(prefix="trajforge-regen-") as tmp:
        again = _files(export_harbor(env, Path(tmp), first[5:].strip()))
    return env if again is not None and again == _files(folder) else None


def import_harbor(folder: Path) -> EnvSpec:
    folder = Path(folder)
    toml_path = folder / "task.toml"
    meta = base.parse_meta(toml_path, tomllib.loads, tomllib.TOMLDecodeError, "TOML")
    for section in ("agent", "verifier", "environment", "metadata"):
        if section in meta and not isinstance(meta[section], dict):
            raise TaskFormatError(toml_path, f"[{section}] must be a table")
    check_links(folder)
    same = regenerated(folder, meta)
    if same is not None:
        return same
    environment = meta.get("environment", {})
    instruction = base.read_file(folder / "instruction.md", "the task instruction").strip()
    if not instruction:
        raise TaskFormatError(folder / "instruction.md", "empty instruction")
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
        env_id=base.folder_env_id("harbor", folder, [folder_digest(folder)]),
        oracle="present" if has_solve else "absent", blobs=blobs,
        build_timeout_s=base.number(environment.get("build_timeout_sec"), toml_path, "[environment].build_timeout_sec",
                                     MAX_BUILD_TIMEOUT_S),
        family=f"harbor:{safe_name(str(meta.get('metadata', {}).get('category', 'task')))}",
        level=base.LEVELS.get(difficulty, 2), seed=0, source="harbor", instruction=instruction,
        dockerfile=dockerfile, context=context,
        workdir=base.workdir_of(dockerfile, environment.get("workdir"), toml_path), agent_user=_agent_user(meta, toml_path),
        tests=tests, verifier="script", test_command="bash /tests/test.sh", solution=[solve] if solve is not None else [],
        agent_timeout_s=base.number(meta.get("agent", {}).get("timeout_sec"), toml_path, "[agent].timeout_sec", MAX_AGENT_TIMEOUT_S),
        test_timeout_s=base.number(meta.get("verifier", {}).get("timeout_sec"), toml_path, "[verifier].timeout_sec", MAX_TEST_TIMEOUT_S),
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
                         "trajforge_agent_user": env.agent_user,
                         **({"trajforge_family": env.family, "trajforge_level": env.level, "trajforge_seed": env.seed}
                            if env.source == f"procedural:{env.family}" else {})},
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
