"""A build's environments as a Harbor task tree beside its data: what `trajforge publish --environments`
adds to the repository, in the same commit as the data.

    tasks/<name>/task.toml, instruction.md, environment/, tests/, solution/ (only with solutions)
    tasks/manifest.json   {"format": "harbor", "build_id", "selection", "solutions",
                           "tasks": [{"name", "env_id", "files": {<path in the task folder>: <sha256>}}]}

Selections: `rl` = the environments of the export's `rl` config (none when it has no rows), `kept` = every
environment the build's `synthesize` stage kept, `none` = no tree.

Invariants: `<name>` is the env id made folder-safe (`safe_name`), unique in the tree; each folder
imports back (`trajforge envs import`, `import_harbor`) to its env id, and Harbor sees that id as the
task name. The reference solution is written only when `export.rl.include_solutions` is set (the rl
config's contamination rule, `rl_spec_json`). Only terminal environments have a Harbor form: any other
kind, or an environment the exporter refuses, is an EnvTreeError naming it (nothing is published). The
tree holds no path a config's `data_files` pattern (`<config>/<file>.parquet`) names outside `tasks/`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...schemas.config import safe_name
from ...schemas.environment import EnvSpec
from ..engine.store import RunStore
from ..envs.formats import export_harbor
from ..redaction.secrets import Scanner

TREE = "tasks"
MANIFEST = f"{TREE}/manifest.json"
SELECTIONS = ("none", "rl", "kept")
HEADING = "## Environments"


class EnvTreeError(ValueError):
    """The environments cannot be published as a task tree; the message names the environment and why."""


@dataclass
class EnvTree:
    """The tree to publish, on disk: `files` (repo path -> the file under the folder it was written to,
    the manifest included), empty for `none`. Files are written once and read one at a time (scan,
    hash, upload), never held in memory together."""

    selection: str
    files: dict[str, Path] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    def stale(self, path: str, remote: Any) -> bool:
        """Whether the repository's `path` is a file of an earlier tree that this one does not hold
        (only under `tasks/` of a repository whose tree trajforge wrote: it has `tasks/manifest.json`)."""
        return path.startswith(TREE + "/") and MANIFEST in remote and path not in self.files

    def declare(self, card: str, repo_id: str) -> str:
        """`card` with a section declaring the tree (before "## Provenance", else at the end)."""
        if not self.files:
            return card
        tasks = self.manifest["tasks"]
        lines = [HEADING, "",
                 f"`{TREE}/` holds {len(tasks)} environment(s) of this build ("
                 + ("those of the `rl` config" if self.selection == "rl" else "every environment it kept")
                 + ") as Harbor task folders: `task.toml`, `instruction.md`, `environment/`, `tests/`"
                 + (", `solution/`" if self.manifest["solutions"] else " (no reference solutions)")
                 + f". `{MANIFEST}` lists each folder's env id and the sha256 of its files. The folder name "
                 "is the env id; `trajforge envs import` of a folder gives back that env id.", "",
                 "```bash",
                 f"hf download {repo_id} --repo-type dataset --include 'tasks/*' --local-dir ds",
                 "trajforge envs import ds/tasks      # or a Harbor run: harbor run -p ds/tasks/<name> -a <agent>",
                 "```", "",
                 "The tree is not a `datasets` config: `load_dataset` reads only the configs above.", ""]
        section = "\n".join(lines)
        anchor = card.find("\n## Provenance")
        return card.rstrip("\n") + "\n\n" + section if anchor < 0 else card[:anchor + 1] + section + "\n" + card[anchor + 1:]


def select(store: RunStore, build_id: str, selection: str) -> list[EnvSpec]:
    """The committed environments of `build_id` that `selection` names, sorted by env id."""
    if selection not in SELECTIONS:
        raise EnvTreeError(f"environments: {selection!r} is not one of {', '.join(SELECTIONS)}")
    rec = store.read_build(build_id)
    if selection == "none" or rec is None:
        return []
    synth = rec.committed("synthesize")
    if not synth or not store.exists(posixpath.join(synth, "manifest.json")):
        raise EnvTreeError(f"build {build_id} has no committed synthesize stage: no environments to publish")
    parts = store.read_json(posixpath.join(synth, "manifest.json"))["parts"]
    wanted = None
    if selection == "rl":
        import pyarrow.parquet as pq

        export = rec.committed("export") or ""
        files = sorted(store.fs.glob(posixpath.join(export, "rl", "*.parquet"))) if export else []
        wanted = sorted({i for f in files for i in pq.read_table(store.fs.open(f, "rb"), columns=["env_id"])
                        .column(0).to_pylist()})
        if not wanted:
            return []
    envs = store.read_records(parts, EnvSpec, filters=[("env_id", "in", wanted)] if wanted else None)
    missing = sorted(set(wanted or []) - {e.env_id for e in envs})
    if missing:
        raise EnvTreeError(f"build {build_id}: the rl config names environments synthesize did not keep: "
                           f"{', '.join(missing[:5])}")
    return sorted({e.env_id: e for e in envs}.values(), key=lambda e: e.env_id)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_tree(envs: list[EnvSpec], dest: Path, *, build_id: str, selection: str, solutions: bool,
               base_image: str = "trajforge/base:latest") -> dict[str, Any]:
    """Write `envs` under `dest/tasks/` (one Harbor folder each) plus the manifest; returns the manifest."""
    root = Path(dest) / TREE
    root.mkdir(parents=True, exist_ok=True)
    tasks, used = [], set()
    for env in envs:
        if env.kind != "terminal":
            raise EnvTreeError(f"environment {env.env_id}: kind {env.kind!r} has no Harbor task form "
                               "(publish with --environments none, or a selection without it)")
        name = safe_name(env.env_id)
        while name in used or name == "manifest.json":
            name += "-" + hashlib.sha256(env.env_id.encode()).hexdigest()[:6]
        used.add(name)
        if not solutions and env.oracle == "present":  # the rl config's contamination rule
            env = env.model_copy(update={"solution": [], "oracle": "absent"})
        with tempfile.TemporaryDirectory(dir=root, prefix=".export-") as tmp:
            try:
                folder = export_harbor(env, Path(tmp), base_image)
            except Exception as err:
                raise EnvTreeError(f"environment {env.env_id} cannot be exported as a Harbor task: "
                                   f"{err.__class__.__name__}: {err}") from None
            shutil.move(str(folder), str(root / name))
        files = {p.relative_to(root / name).as_posix(): _sha256(p.read_bytes())
                 for p in sorted((root / name).rglob("*")) if p.is_file()}
        tasks.append({"name": name, "env_id": env.env_id, "family": env.family, "source": env.source,
                      "oracle": env.oracle, "files": files})
    manifest = {"format": "harbor", "generator": "trajforge", "build_id": build_id, "selection": selection,
                "solutions": solutions, "base_image": base_image, "tasks": tasks}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def environment_tree(store: RunStore, build_id: str, selection: str | None, dest: Path) -> EnvTree:
    """The tree `selection` (`none`, `rl`, `kept`; None = `none`) makes of a committed build, written under
    `dest` (which the caller removes) and secret-scanned file by file."""
    selection = selection or "none"
    envs = select(store, build_id, selection)
    if not envs:
        return EnvTree(selection)
    config = store.read_build(build_id).config or {}
    solutions = bool((((config.get("export") or {}).get("rl") or {}).get("include_solutions", False)))
    base_image = (config.get("sandbox") or {}).get("base_image") or "trajforge/base:latest"
    manifest = write_tree(envs, Path(dest), build_id=build_id, selection=selection, solutions=solutions,
                          base_image=base_image)
    files = {p.relative_to(dest).as_posix(): p for p in sorted(Path(dest).rglob("*")) if p.is_file()}
    detectors = (((config.get("export") or {}).get("secrets") or {}).get("detectors"))
    refuse_secrets(files, Scanner(detectors))
    return EnvTree(selection, files, manifest)


def _texts(data: bytes, depth: int = 0) -> Iterator[str]:
    """What a file says, as the secret scan reads it: UTF-8 or UTF-16 (by its byte-order mark or its NULs),
    with shell / Dockerfile line continuations joined too; the members of a gzip, tar or zip archive
    (what Docker's ADD unpacks), two levels deep and 64 MiB at most."""
    text = data.decode("utf-8", errors="replace")
    yield text
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(data) > 1 and data.count(b"\0") * 3 > len(data)):
        yield data.decode("utf-16", errors="replace")
    if "\\\n" in text:
        yield re.sub(r"\\\n[ \t]*", "", text)
    if depth >= 2:
        return
    try:
        if data[:2] == b"\x1f\x8b":
            with gzip.open(io.BytesIO(data)) as f:
                yield from _texts(f.read(64 << 20), depth + 1)
        elif tarfile.is_tarfile(io.BytesIO(data)):
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.size <= 64 << 20:
                        yield from _texts(tar.extractfile(m).read(), depth + 1)
        elif zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for info in z.infolist():
                    if not info.is_dir() and info.file_size <= 64 << 20:
                        yield from _texts(z.read(info), depth + 1)
    except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile):
        return  # a damaged archive: its bytes were scanned as text above


def refuse_secrets(files: dict[str, bytes | Path], scanner: Scanner) -> None:
    """EnvTreeError naming each file of the tree (its bytes, or the file holding them: read one at a time)
    where the export's secret scan finds a secret (its detector, never the value): the data is scanned by
    the export, the tree is scanned here, and a tree with a secret is not published (nothing is redacted
    in a task's files: it would change what runs)."""
    found = []
    for path, data in sorted(files.items()):
        data = data.read_bytes() if isinstance(data, Path) else data
        detectors = sorted({d for text in _texts(data) for d, _ in scanner.find(text)})
        if detectors:
            found.append(f"{path} ({', '.join(detectors)})")
    if found:
        raise EnvTreeError(f"the environment tree holds secrets the export's scan finds: {'; '.join(found[:5])}"
                           f"{' …' if len(found) > 5 else ''}; remove them from the environments (or publish "
                           "with --environments none)")


def check_tree(root: Path) -> list[str]:
    """Problems of a downloaded tree (`root` = the `tasks/` folder) against its manifest: files missing,
    changed (sha256) or not listed, task folders (or files) the manifest does not list, task names that
    are not plain folder names (nothing outside `root` is read); empty when it is intact."""
    root = Path(root)
    manifest = json.loads((root / "manifest.json").read_text())
    problems = []
    names = [t.get("name") for t in manifest.get("tasks", [])]
    listed = {n for n in names if isinstance(n, str) and n == safe_name(n) and n not in (".", "..", "manifest.json")}
    problems += [f"manifest: task name {n!r} is not a folder name of this tree" for n in names if n not in listed]
    problems += [f"{p.name}: not in the manifest" for p in sorted(root.iterdir())
                 if p.name != "manifest.json" and p.name not in listed]
    for task in manifest.get("tasks", []):
        if task.get("name") not in listed:
            continue
        folder = root / task["name"]
        have = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()
        for rel, sha in task["files"].items():
            if rel not in have:
                problems.append(f"{task['name']}/{rel}: missing")
            elif _sha256((folder / rel).read_bytes()) != sha:
                problems.append(f"{task['name']}/{rel}: content differs from the manifest")
        problems += [f"{task['name']}/{rel}: not in the manifest" for rel in sorted(have - set(task["files"]))]
    return problems


__all__ = ["EnvTree", "EnvTreeError", "HEADING", "MANIFEST", "SELECTIONS", "TREE", "check_tree", "environment_tree",
           "select", "write_tree"]
