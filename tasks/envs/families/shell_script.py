"""Write a shell script with specified behaviour; hidden tests build fixtures and run the script as the
agent user on several cases (never as root).

Levels are different tools with more behaviour to get right:
1. `<name>.sh FILE` prints one summary line of FILE (lines, words, name) in a seed-chosen format;
2. `<name>.sh DIR N` keeps the N newest dated logs (date in the file name), moves the rest into an
   archive folder, and rejects bad arguments with exit code 2 and a usage line on stderr;
3. `<name>.sh DIR` prints groups of files with identical content (nested folders, spaces in names),
   sorted, with a seed-chosen separator; exit 2 when DIR is not a directory.
"""

from __future__ import annotations

import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

FORMATS = ["{name}: {lines} lines, {words} words", "lines={lines} words={words} file={name}",
           "{name} | {lines} | {words}"]

SOL_1 = r"""cat > {script} <<'EOF'
#!/usr/bin/env bash
f="$1"
lines=$(wc -l < "$f" | tr -d ' ')
words=$(wc -w < "$f" | tr -d ' ')
name=$(basename "$f")
printf '%s\n' "{fmt}"
EOF
chmod +x {script}"""

SOL_2 = r"""cat > {script} <<'EOF'
#!/usr/bin/env bash
usage() {{ echo "usage: $0 DIR N" >&2; exit 2; }}
[ $# -eq 2 ] || usage
dir="$1"; n="$2"
[ -d "$dir" ] || usage
[[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
mkdir -p "$dir/{archive}"
ls "$dir" | grep -E '^{prefix}-[0-9]{{8}}\.log$' | sort -r | tail -n +$((n + 1)) | while read -r f; do
  mv "$dir/$f" "$dir/{archive}/"
done
EOF
chmod +x {script}"""

SOL_3 = r"""cat > {script} <<'EOF'
#!/usr/bin/env bash
[ -d "$1" ] || {{ echo "usage: $0 DIR" >&2; exit 2; }}
cd "$1" || exit 2
python3 - <<'PY'
import collections, hashlib, os
groups = collections.defaultdict(list)
for root, dirs, files in os.walk('.'):
    for f in files:
        p = os.path.join(root, f)[2:]
        groups[hashlib.sha256(open(p, 'rb').read()).hexdigest()].append(p)
for g in sorted(sorted(v) for v in groups.values() if len(v) > 1):
    print({sep!r}.join(g))
PY
EOF
chmod +x {script}"""

TESTS_COMMON = """
import os, shutil, stat, tempfile

def _fixture(files):
    d = tempfile.mkdtemp(prefix="tf-case-", dir="/tmp")
    os.chmod(d, 0o777)
    for rel, content in files.items():
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        for parent in [os.path.dirname(p)]:
            os.chmod(parent, 0o777)
        with open(p, "w") as f:
            f.write(content)
        os.chmod(p, 0o666)
    return d

def _run(*args):
    return run_as_agent(["bash", str(W / EXPECTED["script"]), *args])

def test_script_exists():
    assert (W / EXPECTED["script"]).is_file()
"""

TESTS_1 = """
def test_summary_lines():
    for case in EXPECTED["cases"]:
        d = _fixture({case["name"]: case["content"]})
        r = _run(os.path.join(d, case["name"]))
        assert r.stdout.strip() == case["want"], (case["name"], r.stdout, r.stderr[-300:])
"""

TESTS_2 = """
def test_keeps_newest_and_archives_the_rest():
    for case in EXPECTED["cases"]:
        d = _fixture({f: "log\\n" for f in case["files"]})
        r = _run(d, str(case["n"]))
        assert r.returncode == 0, r.stderr[-300:]
        kept = sorted(f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
        archived = sorted(os.listdir(os.path.join(d, EXPECTED["archive"])))
        assert kept == case["kept"] and archived == case["archived"], (kept, archived)

def test_bad_arguments_exit_2_with_usage():
    d = _fixture({})
    for args in ([], [d], [d, "0"], [d, "x"], [os.path.join(d, "missing"), "3"]):
        r = _run(*args)
        assert r.returncode == 2 and "usage" in r.stderr.lower(), (args, r.returncode, r.stderr)
"""

TESTS_3 = """
def test_duplicate_groups():
    for case in EXPECTED["cases"]:
        d = _fixture(case["files"])
        r = _run(d)
        assert r.returncode == 0, r.stderr[-300:]
        assert [l for l in r.stdout.splitlines() if l.strip()] == case["want"], r.stdout

def test_not_a_directory_exits_2():
    r = _run("/nonexistent/dir")
    assert r.returncode == 2
"""


class ShellScript(Family):
    name = "shell_script"
    description = "write a bash tool with specified behaviour (output format, arguments, exit codes)"
    replay_invariant = False

    def draft(self, level: int, rng: random.Random) -> Draft:
        script = rng.choice(["tool", "run", "report", "tidy", "scan"]) + f"_{rng.randint(10, 99)}.sh"
        if level == 1:
            fmt = rng.choice(FORMATS)
            cases = []
            for i in range(3):
                text = "\n".join(" ".join(rng.choice(["a", "bb", "ccc", "dd"]) for _ in range(rng.randint(0, 6)))
                                 for _ in range(rng.randint(1, 8))) + "\n"
                name = rng.choice(["notes", "my file", "data"]) + f"-{i}.txt"
                want = fmt.format(name=name, lines=text.count("\n"), words=len(text.split()))
                cases.append({"name": name, "content": text, "want": want})
            spec = (f"`{script} FILE` prints exactly one line, `{fmt}`, where `{{lines}}` and `{{words}}` are what "
                    "`wc -l` and `wc -w` count and `{name}` is the file's base name (names may contain spaces).")
            bash_fmt = fmt.replace("{name}", "$name").replace("{lines}", "$lines").replace("{words}", "$words")
            solution = SOL_1.format(script=script, fmt=bash_fmt)
            expected = {"script": script, "cases": cases}
            tests = TESTS_COMMON + TESTS_1
            samples = [FileSpec(path="samples/example.txt", content=cases[0]["content"])]
        elif level == 2:
            prefix, archive = rng.choice(["app", "api", "worker"]), rng.choice(["archive", "old", "attic"])
            cases = []
            for _ in range(3):
                dates = sorted({f"2026{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}" for _ in range(rng.randint(3, 8))})
                files = [f"{prefix}-{d}.log" for d in dates]
                n = rng.randint(1, len(files))
                kept = sorted(files[-n:])
                noise = [f"{prefix}-notes.txt", f"other-{dates[0]}.log"]
                cases.append({"files": files + noise, "n": n, "kept": sorted(kept + noise),
                              "archived": sorted(set(files) - set(kept))})
            spec = (f"`{script} DIR N` keeps the N newest logs named `{prefix}-YYYYMMDD.log` directly in DIR (newest by "
                    f"the date in the name) and moves the older ones into `DIR/{archive}/` (create it if needed); "
                    "other files are left alone. With a missing argument, N that is not a positive integer, or DIR "
                    "not a directory, it prints a line containing `usage` to stderr and exits with code 2.")
            solution = SOL_2.format(script=script, prefix=prefix, archive=archive)
            expected = {"script": script, "cases": cases, "archive": archive}
            tests = TESTS_COMMON + TESTS_2
            samples = [FileSpec(path=f"samples/{f}", content="log\n") for f in cases[0]["files"]]
        else:
            sep = rng.choice([" | ", ",", " :: "])
            cases = []
            for _ in range(3):
                files: dict[str, str] = {}
                contents = [f"payload {rng.randint(0, 5)}\n" for _ in range(rng.randint(4, 9))]
                for i, c in enumerate(contents):
                    folder = rng.choice(["", "sub/", "sub/deeper/", "with space/"])
                    files[f"{folder}file {i}.dat"] = c
                groups: dict[str, list[str]] = {}
                for path, c in files.items():
                    groups.setdefault(c, []).append(path)
                want = [sep.join(g) for g in sorted(sorted(v) for v in groups.values() if len(v) > 1)]
                cases.append({"files": files, "want": want})
            spec = (f"`{script} DIR` finds files under DIR (recursively) with identical content and prints one line "
                    f"per group of duplicates: the group's paths relative to DIR, sorted, joined by `{sep}`; lines "
                    "sorted. Files without a duplicate are not printed; names may contain spaces. It exits 0, or 2 "
                    "when DIR is not a directory.")
            solution = SOL_3.format(script=script, sep=sep)
            expected = {"script": script, "cases": cases}
            tests = TESTS_COMMON + TESTS_3
            samples = [FileSpec(path=f"samples/{p}", content=c) for p, c in cases[0]["files"].items()]
        instruction = f"Write a bash script `{script}` in the work directory. {spec}"
        return Draft(instruction, samples, tests_module(expected, tests), [solution],
                     {"tool": level, "script": script})
