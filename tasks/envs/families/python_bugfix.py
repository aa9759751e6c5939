"""A Python bug fix judged by unit tests: `mathtext.py` holds small utility functions, some with a
planted bug (a classic off-by-one, a wrong operator, a missing normalisation). Users report wrong
results; `check.py` shows a few examples. Hidden tests exercise every function on many inputs whose
expected values come from the correct implementations.

Knobs by level: functions in the module (3 / 5 / 7), bugs (1 / 2 / 3), and at level 3 a misleading
comment next to a correct function. The reference solution reverses the planted mutations.
"""

from __future__ import annotations

import json
import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

# name -> (correct source, (buggy snippet, correct snippet), input generator)
FUNCTIONS: dict[str, tuple[str, tuple[str, str], str]] = {
    "mean": ('''def mean(xs):
    """Arithmetic mean of a non-empty list."""
    return sum(xs) / len(xs)
''', ("return sum(xs) / (len(xs) - 1)", "return sum(xs) / len(xs)"), "lists"),
    "median": ('''def median(xs):
    """Median of a non-empty list (mean of the two middle values for even lengths)."""
    s = sorted(xs)
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2
''', ("return (s[mid] + s[mid + 1]) / 2", "return (s[mid - 1] + s[mid]) / 2"), "lists"),
    "clamp": ('''def clamp(x, lo, hi):
    """x limited to the closed interval [lo, hi]."""
    return max(lo, min(x, hi))
''', ("return min(lo, max(x, hi))", "return max(lo, min(x, hi))"), "clamps"),
    "word_count": ('''def word_count(text):
    """Number of whitespace-separated words."""
    return len(text.split())
''', ('return len(text.split(" "))', "return len(text.split())"), "texts"),
    "moving_average": ('''def moving_average(xs, k):
    """Means of every window of k consecutive values."""
    return [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)]
''', ("for i in range(len(xs) - k)]", "for i in range(len(xs) - k + 1)]"), "windows"),
    "is_palindrome": ('''def is_palindrome(s):
    """True if s reads the same backwards, ignoring case and non-alphanumerics."""
    t = [c.lower() for c in s if c.isalnum()]
    return t == t[::-1]
''', ("t = [c for c in s if c.isalnum()]", "t = [c.lower() for c in s if c.isalnum()]"), "phrases"),
    "parse_duration": ('''def parse_duration(s):
    """Seconds in a duration like '1h30m', '45s' or '2h5m10s'."""
    total, num = 0, ""
    for c in s:
        if c.isdigit():
            num += c
        else:
            total += int(num) * {"h": 3600, "m": 60, "s": 1}[c]
            num = ""
    return total
''', ('{"h": 3600, "m": 6, "s": 1}', '{"h": 3600, "m": 60, "s": 1}'), "durations"),
    "chunk": ('''def chunk(xs, n):
    """xs split into consecutive pieces of n items (the last may be shorter)."""
    return [xs[i:i + n] for i in range(0, len(xs), n)]
''', ("for i in range(0, len(xs) - n, n)]", "for i in range(0, len(xs), n)]"), "chunks"),
    "count_vowels": ('''def count_vowels(s):
    """Number of vowels (a, e, i, o, u in either case)."""
    return sum(1 for c in s if c in "aeiouAEIOU")
''', ('if c in "aeiou")', 'if c in "aeiouAEIOU")'), "texts1"),
    "percent": ('''def percent(part, total):
    """part as a percentage of total, rounded to one decimal."""
    return round(100 * part / total, 1)
''', ("return round(100 * part / total)", "return round(100 * part / total, 1)"), "percents"),
}

WORDS = ["alpha", "Bravo", "delta", "Echo", "kilo", "lima", "Oscar", "romeo"]


def _inputs(shape: str, rng: random.Random) -> list[list]:
    if shape == "lists":
        return [[[rng.randint(-50, 50) for _ in range(n)]] for n in (1, 2, 3, 4, 5, 6, 7, 10)]
    if shape == "clamps":
        return [[rng.randint(-20, 20), lo, lo + rng.randint(1, 10)] for lo in (-5, 0, 3, 7, -12, 1)]
    if shape in ("texts", "texts1"):
        return [[s] for s in ["", "one", "two  words", " lead and trail ", "tab\tsep\nline",
                              " ".join(rng.sample(WORDS, 4)), "AEIOU aeiou xyz"]]
    if shape == "windows":
        return [[[rng.randint(0, 20) for _ in range(n)], k] for n, k in ((5, 2), (6, 3), (4, 4), (7, 1), (8, 5))]
    if shape == "phrases":
        return [[s] for s in ["Racecar", "Never odd or even", "abc", "A man, a plan, a canal: Panama", "Ab", "x"]]
    if shape == "durations":
        return [[s] for s in ["45s", "1h", "1h30m", "2h5m10s", f"{rng.randint(1, 59)}m", "10m5s"]]
    if shape == "chunks":
        return [[list(range(n)), k] for n, k in ((10, 3), (9, 3), (4, 5), (0, 2), (7, 2))]
    if shape == "percents":
        return [[p, t] for p, t in ((1, 3), (2, 3), (50, 200), (7, 9), (rng.randint(1, 99), 100))]
    raise KeyError(shape)


def _run(src: str, name: str, args: list):
    ns: dict = {}
    exec(src, ns)  # the generator's own, correct implementation
    return ns[name](*json.loads(json.dumps(args)))


SOLUTION = r"""python3 - <<'PY'
import json, pathlib
path = pathlib.Path('mathtext.py')
src = path.read_text()
for bad, good in json.loads({patches!r}):
    src = src.replace(bad, good)
path.write_text(src)
PY"""

HARNESS = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("mathtext", "mathtext.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = {}
for name, calls in json.load(sys.stdin).items():
    fn, res = getattr(mod, name, None), []
    for args in calls:
        try:
            res.append(["ok", fn(*args)])
        except Exception as e:
            res.append(["error", repr(e)])
    out[name] = res
print("__RESULTS__" + json.dumps(out))
"""

# The agent's module is imported by the agent user (run_as_agent), never by the root test runner; it
# sees the arguments only, never the expected values.
TESTS = """
import math

_CACHE = {}

def _results():
    if not _CACHE:
        calls = {name: [args for args, _ in cases] for name, cases in EXPECTED["cases"].items()}
        r = run_as_agent(["python3", "-c", EXPECTED["harness"]], input=json.dumps(calls))
        assert "__RESULTS__" in r.stdout, (r.stdout + r.stderr)[-800:]
        _CACHE.update(json.loads(r.stdout.rsplit("__RESULTS__", 1)[1]))
    return _CACHE

def _same(a, b):
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    return a == b

def _check(name):
    got = _results()[name]
    bad = [(args, want, g) for (args, want), g in zip(EXPECTED["cases"][name], got)
           if g[0] != "ok" or not _same(g[1], want)]
    assert not bad, bad[:3]
"""


class PythonBugfix(Family):
    name = "python_bugfix"
    description = "fix the planted bugs in a small Python module; hidden unit tests check every function"
    replay_invariant = False

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_funcs, n_bugs = {1: (3, 1), 2: (5, 2), 3: (7, 3)}[level]
        names = sorted(rng.sample(sorted(FUNCTIONS), n_funcs))
        buggy = set(rng.sample(names, n_bugs))
        parts, patches, cases = ['"""Small helpers used by the reporting scripts."""\n'], [], {}
        for name in names:
            src, (bad, good), shape = FUNCTIONS[name]
            cases[name] = [[args, _run(src, name, args)] for args in _inputs(shape, rng)]
            if name in buggy:
                parts.append(src.replace(good, bad))
                patches.append([bad, good])
            elif level == 3 and rng.random() < 0.5:
                parts.append("# NOTE: suspected off-by-one here, see ticket 4411 (investigated: works as intended)\n" + src)
            else:
                parts.append(src)
        module = "\n\n".join(parts)
        example = sorted(buggy)[0]
        ex_args, ex_want = cases[example][-1]
        check = (f"from mathtext import {example}\n"
                 f"print({example!r}, {ex_args!r}, '->', {example}(*{ex_args!r}), '(expected {ex_want!r})')\n")
        body = TESTS + "".join(f"\ndef test_{n}():\n    _check({n!r})\n" for n in names)
        instruction = (
            f"Users report that some helpers in `mathtext.py` give wrong results (for example `{example}` — "
            "run `python3 check.py`). Find and fix every bug in the module so that each function does what "
            "its docstring says. Do not rename functions or change their signatures."
        )
        files = [FileSpec(path="mathtext.py", content=module), FileSpec(path="check.py", content=check)]
        return Draft(instruction, files, tests_module({"cases": cases, "harness": HARNESS}, body),
                     [SOLUTION.format(patches=json.dumps(patches))],
                     {"functions": n_funcs, "bugs": n_bugs, "buggy": sorted(buggy)}, protected=["check.py"])
