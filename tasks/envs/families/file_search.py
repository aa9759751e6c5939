"""File search and reorganisation: find the files that contain a marker and list them, sorted.

Knobs by level: tree depth, number of files, near-miss distractors (marker with a different
suffix, the marker in a file name rather than in the content, hidden directories).
"""

from __future__ import annotations

import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

WORDS = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "romeo", "sierra", "tango", "zulu"]

SOLUTION = r"""python3 - <<'PY'
import pathlib, re
marker = re.search(r'`([A-Z]+-[0-9]+)`', pathlib.Path('TASK.md').read_text()).group(1)
pattern = re.compile(re.escape(marker) + r'(?![0-9])')
hits = sorted(str(p.relative_to('data')) for p in pathlib.Path('data').rglob('*')
              if p.is_file() and pattern.search(p.read_text(errors='ignore')))
pathlib.Path('matches.txt').write_text(''.join(h + '\n' for h in hits))
PY"""

TESTS = """
WORK = pathlib.Path(os.environ.get("WORK", "/home/agent/work"))

def _lines():
    return [l.strip() for l in (WORK / "matches.txt").read_text().splitlines() if l.strip()]

def test_matches_file_exists():
    assert (WORK / "matches.txt").is_file(), "matches.txt missing"

def test_all_matches_found():
    missing = sorted(set(EXPECTED["matches"]) - set(_lines()))
    assert not missing, f"missing {missing}"

def test_no_false_matches():
    extra = sorted(set(_lines()) - set(EXPECTED["matches"]))
    assert not extra, f"unexpected {extra}"

def test_sorted():
    assert _lines() == sorted(_lines()), "not sorted"

def test_each_match_once():
    lines = _lines()
    assert len(lines) == len(set(lines)), "a file is listed twice"
"""


class FileSearch(Family):
    name = "file_search"
    description = "find every file under data/ whose content mentions a ticket id; list them sorted"

    def draft(self, level: int, rng: random.Random) -> Draft:
        depth, n_files, n_hits = {1: (1, 8, 2), 2: (3, 25, 4), 3: (5, 60, 7)}[level]
        marker = f"{rng.choice(['OPS', 'SEC', 'DATA', 'INFRA'])}-{rng.randint(100, 999)}"
        paths: set[str] = set()
        while len(paths) < n_files:
            parts = [rng.choice(WORDS) for _ in range(rng.randint(0, depth - 1))]
            if level >= 3 and rng.random() < 0.1:
                parts.insert(0, ".archive")
            paths.add("/".join(parts + [f"{rng.choice(WORDS)}-{rng.randint(0, 99)}.txt"]))
        ordered = sorted(paths)
        rng.shuffle(ordered)
        hits = set(ordered[:n_hits])
        files, expected = [], []
        for i, p in enumerate(sorted(paths)):
            body = [f"note {rng.choice(WORDS)} {rng.randint(0, 9999)}" for _ in range(rng.randint(2, 6))]
            if p in hits:
                body.insert(rng.randrange(len(body) + 1), f"see ticket {marker} for details")
                expected.append(p)
            elif level >= 2 and rng.random() < 0.3:
                body.append(f"unrelated ticket {marker}{rng.randint(0, 9)}")  # near miss
            files.append(FileSpec(path=f"data/{p}", content="\n".join(body) + "\n"))
        if level >= 2:
            files.append(FileSpec(path=f"data/{marker}-readme.txt", content="the name mentions it, the content does not\n"))
        files.append(FileSpec(path="TASK.md", content=f"Ticket: `{marker}`\n"))
        instruction = (
            f"Somewhere under `data/` are notes that mention ticket `{marker}` (the exact id, not a longer "
            "number that starts with it; hidden folders count too). Write `matches.txt` in the work "
            "directory listing every such file, one path per line relative to `data/`, sorted. "
            "A file only counts if its content mentions the ticket."
        )
        return Draft(instruction, files, tests_module({"matches": sorted(expected)}, TESTS), [SOLUTION],
                     {"depth": depth, "files": n_files, "matches": n_hits, "marker": marker},
                     protected=["data/**", "TASK.md"])
