"""The environment catalogue: environments by id, wherever they come from, and their relatives.

- `load_envs(ctx, manifest, env_ids)`: a committed `synthesize` output, by env_id (what stages read;
  a shard names the ids it needs, so it never loads the whole catalogue);
- `resolve(ref, known, runs)`: a task folder (or a folder of them), a procedural id
  (`family-l<level>-s<seed>`, optionally with its content-hash suffix), an env_id in `known`, or an
  env_id committed in any build under `runs`; raises EnvNotFound naming what was tried;
- `load_paths(paths)`: environments from task folders or a JSONL of specs (`envs import --out`);
- `sibling_of(env)`: another instance of a procedural family; `source_kind`, `source_priority`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ...schemas.common import Reject
from ...schemas.environment import EnvSpec
from ..engine.store import RunStore
from .families import FAMILIES, get_family
from .formats import TaskFormatError, detect, find_tasks, import_task, markers, source_names

if TYPE_CHECKING:
    from ..engine.contract import Manifest, StageContext

PROCEDURAL_ID = re.compile(r"^(?P<family>[a-z_]+)-l(?P<level>\d+)-s(?P<seed>\d+)(?:-(?P<hash>[0-9a-f]{8}))?$")
ID_SHAPED = re.compile(r"-[0-9a-f]{8}(?:[0-9a-f]{8})?$")  # how every env id ends (a content hash prefix)


class EnvNotFound(ValueError):
    """A reference that names no environment; the message says what was tried."""


def load_envs(ctx: "StageContext", manifest: "Manifest", env_ids: Iterable[str] | None = None) -> dict[str, EnvSpec]:
    """The committed environments of a `synthesize` output by env_id: only `env_ids` when given (a
    shard's own: other rows are dropped while reading, row groups whose statistics exclude them are
    skipped), else all of them."""
    if env_ids is None:
        return {e.env_id: e for e in ctx.store.read_records(manifest.parts, EnvSpec)}
    wanted = sorted(set(env_ids))
    if not wanted:
        return {}
    return {e.env_id: e for e in ctx.store.read_records(manifest.parts, EnvSpec, filters=[("env_id", "in", wanted)])}


def source_kind(source: str) -> str:
    return source.split(":", 1)[0]


def source_priority(source: str) -> int:
    """Which of two near-duplicates is kept: procedural first, then imported task folders, then LLM."""
    origin = source_kind(source)
    if origin == "procedural":
        return 0
    if origin in source_names():
        return 1
    return 2 if origin == "llm" else 3


def sibling_of(env: EnvSpec, replay: bool = False) -> EnvSpec | None:
    """Another instance of a procedural family (instance-specificity check; with `replay`, only for
    families whose reference solution replays on any instance); None for other sources."""
    fam = FAMILIES.get(env.family)
    if fam is None or source_kind(env.source) != "procedural" or (replay and not fam.replay_invariant):
        return None
    return fam.sibling(env)


def procedural(ref: str) -> EnvSpec | None:
    """The procedural environment `ref` names, None if `ref` is not a procedural id. Raises
    EnvNotFound for an unknown family or level, or a hash suffix that does not match."""
    m = PROCEDURAL_ID.match(ref)
    if not m:
        return None
    try:
        env = get_family(m["family"]).generate(int(m["level"]), int(m["seed"]))
    except (KeyError, ValueError) as err:
        raise EnvNotFound(str(err).strip("'\"")) from None
    if m["hash"] is not None and env.env_id != ref:
        raise EnvNotFound(f"{ref}: this family generates {env.env_id} for that level and seed (another version)")
    return env


def committed(env_id: str, runs: str) -> EnvSpec | None:
    """The environment `env_id` as committed by any build of any dataset under `runs` (newest first)."""
    for dataset in RunStore.datasets(runs):
        store = RunStore(runs, dataset)
        for m in store.committed_manifests("synthesize"):
            for env in store.read_records(store.read_json(m)["parts"], EnvSpec, filters=[("env_id", "==", env_id)]):
                return env
    return None


def images_in_use(runs: str) -> set[str]:
    """Image tags of every environment committed under `runs`."""
    keep: set[str] = set()
    for dataset in RunStore.datasets(runs):
        store = RunStore(runs, dataset)
        for m in store.committed_manifests("synthesize"):
            table = store.read_table(store.read_json(m)["parts"], EnvSpec, columns=["image"])
            keep.update(i for i in table.column("image").to_pylist() if i)
    return keep


def from_folder(path: Path) -> tuple[list[tuple[Path, EnvSpec]], list[Reject]]:
    """(folder, environment) for every task folder at or below `path`; unreadable ones are rejects
    (`import_malformed`)."""
    envs, rejects = [], []
    for folder in find_tasks(path):
        try:
            envs.append((folder, import_task(folder)))
        except TaskFormatError as err:
            rejects.append(Reject(key=str(folder), reason="import_malformed", detail=str(err)))
    return envs, rejects


def resolve(ref: str, known: dict[str, EnvSpec] | None = None, runs: str | None = None) -> list[EnvSpec]:
    """The environment(s) `ref` names (see module docstring). A folder with no task in it, or a
    reference that matches nothing, raises EnvNotFound; an unreadable single task, TaskFormatError."""
    if known and ref in known:
        return [known[ref]]
    path = Path(ref)
    if path.exists():
        if detect(path):
            return [import_task(path)]
        found, _ = from_folder(path)
        if not found:
            raise EnvNotFound(f"{ref}: no readable task folder ({markers()}) there")
        return [env for _, env in found]
    try:
        env = procedural(ref)
    except EnvNotFound:  # e.g. an older version of a family: it may still be committed under `runs`
        found = committed(ref, runs) if runs else None
        if found is None:
            raise
        return [found]
    if env is not None:
        return [env]
    found = committed(ref, runs) if runs else None
    if found is None:
        raise EnvNotFound(f"{ref!r} is not a task folder, a procedural id (family-l<level>-s<seed>)"
                          + (f" or an environment committed under {runs}" if runs else ""))
    return [found]


def merge_candidates(rows: list[EnvSpec]) -> tuple[list[EnvSpec], list[Reject]]:
    """One candidate per env id, in order: the same content from two sources (or twice in a list) is one
    candidate; another content under an id already seen is an `env_id_conflict` reject naming both sources
    (the first is kept), never a silent merge."""
    seen: dict[str, EnvSpec] = {}
    rejects = []
    for e in rows:
        first = seen.setdefault(e.env_id, e)
        if first is not e and first.content_hash() != e.content_hash():
            rejects.append(Reject(key=e.env_id, reason="env_id_conflict", detail=(
                f"{e.source} gives env id {e.env_id} to other content than {first.source} does (the recorded id "
                "of an exported task folder whose content was changed, or the same environment imported next to "
                "its original): the first is kept")))
    return list(seen.values()), rejects


def load_paths(paths: list[str]) -> tuple[dict[str, EnvSpec], list[Reject]]:
    """Environments by env_id from task folders or JSONL files of specs, in order: another content under
    an id already loaded is an `env_id_conflict` reject (the first kept). A task folder is also found by
    its folder name, unless that name is shaped like an env id (ends in `-<8 hex>`, as every generated and
    imported id does, or names a procedural environment) or is some loaded environment's id: a folder named like an environment never stands
    in for it."""
    specs: list[EnvSpec] = []
    names: list[tuple[str, EnvSpec]] = []
    rejects: list[Reject] = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".jsonl":
            specs += [EnvSpec.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
            continue
        found, bad = from_folder(path)
        rejects += bad
        specs += [env for _, env in found]
        names += [(folder.name, env) for folder, env in found]
    kept, conflicts = merge_candidates(specs)
    envs = {e.env_id: e for e in kept}
    for name, env in names:
        if name not in envs and not ID_SHAPED.search(name) and PROCEDURAL_ID.match(name) is None \
                and env.env_id in envs and envs[env.env_id].content_hash() == env.content_hash():
            envs[name] = envs[env.env_id]
    return envs, rejects + conflicts
