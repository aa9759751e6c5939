"""Which tasks a repository source tries (issue 43): its commit candidates (`history.scan`) and its planted bugs
(`bugs.plant` over the code files of `bug_revision`), as small JSON items a stage shard carries.

Invariants:
- Deterministic: the same repository, config and seed give the same items in the same order (commits oldest
  first, then bugs in their sampled order).
- Deduplicated across both kinds: two tasks whose reference solutions are the same change (`history.diff_key`
  of the patch) are one, the first kept.
- At most `commits` commit tasks (a seeded sample of the candidates, kept in commit order), `bugs` planted-bug
  tasks of `bugs_per_task` plants each (`bugs.sample`, one per path x function x operator first), and
  `max_per_repo` in all.
- A bug item names its plants by (path, index in `plant(source, path)`), which `make.py` plants again.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from ....schemas.config import RepoSourceConfig
from .bugs import BugPlantingError, Plant, combine, inverse_patch, plant, sample
from .fetch import repository_path
from .history import checkout, diff_key, is_test_path, open_repository, resolve, scan


def code_sources(tree: Path, paths: list[str]) -> dict[str, str]:
    """The non-test `.py` files of `tree` bugs may be planted in (`paths` when given), path -> UTF-8 text."""
    wanted = paths or sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.py")
                             if not p.is_symlink() and not is_test_path(p.relative_to(tree).as_posix()))
    out = {}
    for rel in wanted:
        try:
            out[rel] = (tree / rel).read_bytes().decode("utf-8").lstrip("\ufeff")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def plants_of(sources: dict[str, str]) -> list[tuple[str, int, Plant]]:
    """(path, index, plant) of every candidate bug of every file (a file that does not parse gives none)."""
    out = []
    for path, text in sources.items():
        try:
            out += [(path, i, p) for i, p in enumerate(plant(text, path))]
        except BugPlantingError:
            continue
    return out


def items(index: int, cfg: RepoSourceConfig) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(the items of repository number `index` of `synthesize.repos`, counts of what was skipped and why)."""
    repo = open_repository(repository_path(cfg.path, cfg.pypi, cfg.versions))
    skipped: dict[str, int] = {}
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    kept, dropped = scan(repo, cfg.revisions, max_code_lines=cfg.max_code_lines) if cfg.commits else ([], [])
    for s in dropped:
        skipped[f"commit_{s.kind}"] = skipped.get(f"commit_{s.kind}", 0) + 1
    chosen = sorted(random.Random(cfg.seed).sample(range(len(kept)), min(cfg.commits, len(kept))))
    for i in chosen:
        key = diff_key(kept[i].code_diff)
        if key not in seen:
            seen.add(key)
            out.append({"kind": "repo", "repo": index, "task": "commit", "sha": kept[i].sha})
    if cfg.bugs and repo.head is not None:
        rev = resolve(repo, cfg.bug_revision)
        with tempfile.TemporaryDirectory(prefix="trajforge-plant-") as tmp:
            tree = checkout(repo, rev, Path(tmp) / "tree")
            found = plants_of(code_sources(tree, cfg.bug_paths))
        by_id = {id(p): (path, i) for path, i, p in found}
        drawn = sample([p for _, _, p in found], cfg.bugs * cfg.bugs_per_task, cfg.seed)
        for j in range(0, len(drawn) - cfg.bugs_per_task + 1, cfg.bugs_per_task):
            group = drawn[j:j + cfg.bugs_per_task]
            try:
                key = diff_key(inverse_patch(combine(group) if len(group) > 1 else group[0]))
            except BugPlantingError:
                skipped["bug_overlap"] = skipped.get("bug_overlap", 0) + 1
                continue
            if key in seen:
                skipped["duplicate"] = skipped.get("duplicate", 0) + 1
                continue
            seen.add(key)
            out.append({"kind": "repo", "repo": index, "task": "planted_bug", "rev": rev,
                        "plants": [list(by_id[id(p)]) for p in group]})
    if len(out) > cfg.max_per_repo:
        skipped["over_cap"] = len(out) - cfg.max_per_repo
    return out[:cfg.max_per_repo], skipped
