"""Log analysis with a JSON report: count ERROR lines per service across rotated logs.

Knobs by level: number of log files, lines per file, services, and distractors (WARN/ERRORS lines,
an `error` word inside INFO messages, a compressed-looking archive that must be ignored).
"""

from __future__ import annotations

import hashlib
import random

from ....schemas.common import FileSpec
from .base import Draft, Family, tests_module

SERVICES = ["auth", "billing", "search", "gateway", "cache", "mailer", "scheduler", "storage"]
MESSAGES = ["request handled", "connection reset", "timeout talking to upstream", "cache miss",
            "user login", "retrying job", "disk usage high", "slow query", "error budget report"]

SOLUTION = r"""python3 - <<'PY'
import collections, glob, json
counts = collections.Counter()
for path in sorted(glob.glob('logs/*.log')):
    for line in open(path):
        parts = line.split()
        if len(parts) >= 4 and parts[2] == 'ERROR':
            counts[parts[1]] += 1
json.dump({'errors_by_service': dict(sorted(counts.items())), 'total_errors': sum(counts.values())},
          open('report.json', 'w'), indent=2)
PY"""

TESTS = """
WORK = pathlib.Path(os.environ.get("WORK", "/home/agent/work"))

def _report():
    return json.loads((WORK / "report.json").read_text())

def test_report_exists():
    assert (WORK / "report.json").is_file(), "report.json missing"

def test_total_errors():
    assert _report().get("total_errors") == EXPECTED["total_errors"]

def test_errors_by_service():
    got = {k: v for k, v in _report().get("errors_by_service", {}).items() if v}
    assert got == EXPECTED["errors_by_service"], got

def test_logs_untouched():
    import hashlib
    for name, digest in EXPECTED["log_sha256"].items():
        assert hashlib.sha256((WORK / "logs" / name).read_bytes()).hexdigest() == digest, name
"""


class LogReport(Family):
    name = "log_report"
    description = "count ERROR lines per service across log files into a JSON report"

    def draft(self, level: int, rng: random.Random) -> Draft:
        n_files, n_lines, n_services = {1: (1, 20, 2), 2: (3, 60, 4), 3: (6, 150, 6)}[level]
        services = rng.sample(SERVICES, n_services)
        files, counts = [], {}
        log_sha = {}
        for i in range(n_files):
            lines = []
            for j in range(n_lines):
                svc = rng.choice(services)
                lvl = rng.choices(["INFO", "WARN", "ERROR", "DEBUG"], [6, 2, 2, 1])[0]
                if level >= 2 and rng.random() < 0.05:
                    lvl = "ERRORS"  # distractor: not an ERROR line
                msg = rng.choice(MESSAGES)
                lines.append(f"2026-11-{1 + i:02d}T{j // 60:02d}:{j % 60:02d}:00Z {svc} {lvl} {msg}")
                if lvl == "ERROR":
                    counts[svc] = counts.get(svc, 0) + 1
            name = f"app-{i}.log"
            content = "\n".join(lines) + "\n"
            files.append(FileSpec(path=f"logs/{name}", content=content))
            log_sha[name] = hashlib.sha256(content.encode()).hexdigest()
        if level >= 3:
            files.append(FileSpec(path="logs/old/app-archive.txt",
                                  content=f"2026-10-01T00:00:00Z {services[0]} ERROR archived, do not count\n"))
        expected = {"total_errors": sum(counts.values()), "errors_by_service": dict(sorted(counts.items())),
                    "log_sha256": log_sha}
        instruction = (
            "Our services write logs under `logs/` (the `*.log` files directly in that folder; anything "
            "else is archived and must not be counted). Each line is `<timestamp> <service> <LEVEL> <message>`. "
            "Write `report.json` in the work directory with `errors_by_service` (an object mapping each service "
            "to its number of lines whose level is exactly ERROR) and `total_errors` (their sum). "
            "Do not modify the logs."
        )
        return Draft(instruction, files, tests_module(expected, TESTS), [SOLUTION],
                     {"files": n_files, "lines_per_file": n_lines, "services": n_services},
                     protected=["logs/**"])
