"""Benchmark `corpus_import` (issue 17): importing a published-style task corpus at scale.

Reports parse rate (all folders), then for a seeded sample: build success by cause, validation outcomes by
reason, images/min, disk used by the images (shared layers counted once, beside the naive sum) and wall
time. Target: >= 95% of the tasks whose Dockerfiles only need the package registries build and validate
(kept with or without oracle); every failure has a reason code and a build log.

    python benchmarks/corpus_import.py DIR --sample 50 [--jobs 2] [--ca-bundle /etc/ssl/certs/ca-certificates.crt]
    python benchmarks/corpus_import.py DIR --generate 220      # first write a fixture corpus there
    python benchmarks/corpus_import.py                         # the repo's tests/fixtures/corpus (`make bench`)
    python benchmarks/corpus_import.py --quick                 # the same, one task (`make bench-quick`)

Without DIR: the repo's own fixture corpus (`tests/fixtures/corpus`, two published-style tasks, what
tests/test_import_corpus.py imports), or with `--generate N` a fresh temporary folder.

The generated corpus is Harbor-shaped like published ones: most tasks share one Dockerfile shape (`FROM
ghcr.io/<org>/ubuntu-24-04:<date>`, `apt-get install` of one of three small Debian packages, a gzip data
file), ship no `solution/` (every tenth does), and test with a pytest-style `test.sh` writing `reward.txt`.
Every 25 folders, five are broken on purpose: no instruction (malformed), a binary file among the tests
(malformed), a package that does not exist (`package_not_found`), an unmapped private registry image
(`base_image_missing`), tests that pass untouched (`noop_passes`); every 50, one shipped solution is
wrong (`solution_fails`).
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, host_report, print_table, target  # noqa: E402

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig  # noqa: E402
from trajforge.tasks.envs.corpus import Journal, admit, discover, parse, tally  # noqa: E402

FIXTURE_CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus"
PACKAGES = ("bc", "tree", "dc")
BROKEN = {7: "malformed", 11: "binary_test", 13: "package_not_found", 17: "base_image_missing", 21: "noop_passes"}
PERIOD = 25  # in every 25 folders, one of each broken kind
TEST_SH = (FIXTURE_CORPUS / "tally-words" / "tests" / "test.sh").read_text()  # the pytest-style verifier


def generate(root: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for i in range(n):
        d = root / f"task-{i:04d}"
        (d / "environment").mkdir(parents=True, exist_ok=True)
        (d / "tests").mkdir(exist_ok=True)
        kind = BROKEN.get(i % PERIOD, "ok")
        nums = [rng.randint(-50, 500) for _ in range(rng.randint(5, 40))]
        pkg = PACKAGES[i % len(PACKAGES)]
        (d / "task.toml").write_text('version = "1.0"\n\n[metadata]\ndifficulty = "medium"\ncategory = "data"\n\n'
                                     '[verifier]\ntimeout_sec = 60.0\n\n[environment]\nbuild_timeout_sec = 300.0\n')
        if kind != "malformed":
            (d / "instruction.md").write_text(f"Task {i}: /app/numbers.gz (gzip) holds one integer per line. Write "
                                              f"their sum times {i % 7 + 1} to /app/answer.txt, just the number.\n")
        base = "registry.example.com/private/toolchain:7" if kind == "base_image_missing" else \
            "ghcr.io/example-org/ubuntu-24-04:20250601"
        package = "nosuchpackage-trajforge" if kind == "package_not_found" else pkg
        (d / "environment" / "Dockerfile").write_text(
            f"FROM {base}\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            f"--no-install-recommends {package} && rm -rf /var/lib/apt/lists/*\n"
            "WORKDIR /app\nCOPY numbers.gz /app/numbers.gz\n")
        (d / "environment" / "numbers.gz").write_bytes(gzip.compress("\n".join(map(str, nums)).encode() + b"\n",
                                                                     mtime=0))
        answer = sum(nums) * (i % 7 + 1)
        check = "True" if kind == "noop_passes" else f"Path('/app/answer.txt').read_text().strip() == '{answer}'"
        (d / "tests" / "test.sh").write_text(TEST_SH)
        (d / "tests" / "test.sh").chmod(0o755)
        (d / "tests" / "test_outputs.py").write_text(
            f"import shutil\nfrom pathlib import Path\n\n\ndef test_tool_installed():\n    assert shutil.which('{pkg}')\n\n\n"
            f"def test_answer():\n    assert {check}\n")
        if kind == "binary_test":
            (d / "tests" / "expected.bin").write_bytes(bytes(range(256)))
        if i % 10 == 0:
            (d / "solution").mkdir(exist_ok=True)
            wrong = i % 50 == 40
            (d / "solution" / "solve.sh").write_text(
                "#!/bin/bash\n" + ("echo 0 > /app/answer.txt\n" if wrong else
                                   f"zcat /app/numbers.gz | awk '{{s += $1}} END {{print s * {i % 7 + 1}}}' > /app/answer.txt\n"))


def kind(folder: Path) -> str:
    """What a generated task was made to be (`ok`, or how it is broken)."""
    try:
        i = int(folder.name.split("-")[-1])
    except ValueError:
        return "ok"
    return "solution_fails" if i % 50 == 40 else BROKEN.get(i % PERIOD, "ok")


def disk(client, tags: list[str]) -> tuple[int, int]:
    """(bytes with every layer counted once, bytes summing each image's full size)."""
    seen: dict[str, int] = {}
    naive = 0
    for tag in tags:
        naive += client.images.get(tag).attrs["Size"]
        for h in client.api.history(tag):
            key = h["Id"] if h["Id"] != "<missing>" else f"{h['CreatedBy']}|{h['Created']}|{h['Size']}"
            seen[key] = h["Size"]
    return sum(seen.values()), naive


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, nargs="?", default=None,
                    help=f"a corpus folder (default: {FIXTURE_CORPUS}, or a temporary folder with --generate)")
    ap.add_argument("--sample", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--generate", type=int, default=0, help="first write a fixture corpus of N folders in DIR")
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the generated data (another seed: new images)")
    ap.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    add_quick(ap, "--sample 1")
    args = ap.parse_args()
    if args.quick:
        args.sample = 1
    host_report("start", args.quick)
    if args.dir is None:  # never generate into the repo's fixtures
        args.dir = Path(tempfile.mkdtemp(prefix="corpus-")) if args.generate else FIXTURE_CORPUS
        print(f"corpus: {args.dir}", flush=True)
    if args.generate:
        generate(args.dir, args.generate, args.data_seed)
    from trajforge.tasks.sandbox import docker_client

    t0 = time.monotonic()
    every = discover(args.dir)
    everything, bad_all = parse(every)
    t_parse = time.monotonic() - t0
    folders = discover(args.dir, args.sample, args.seed)
    envs, malformed = parse(folders)
    s = SynthesizeConfig(imports=[str(args.dir)], build={"ca_bundle": args.ca_bundle})
    client = docker_client(pool_size=2 * args.jobs + 4)
    logs = Path(tempfile.mkdtemp(prefix="corpus-logs-"))
    t1 = time.monotonic()
    outcomes = admit([e for _, e in envs], s, SandboxConfig(), args.jobs, Journal(None), log_dir=logs, client=client)
    t_admit = time.monotonic() - t1
    wall = time.monotonic() - t0
    built = sum(o.built for o in outcomes)
    by_folder = {e.env_id: f for f, e in envs}
    intended = [o for o in outcomes if kind(by_folder[o.key]) == "ok"]
    builds = Counter(o.cause or "?" if o.outcome == "image_build_failed" else "built" for o in outcomes)
    validation = Counter(o.outcome for o in outcomes if o.outcome != "image_build_failed")
    tags = sorted({o.image for o in outcomes if o.image})
    once, naive = disk(client, tags)
    print_table(f"corpus import: {args.dir} ({len(every)} folders, sample {args.sample}, seed {args.seed}, "
                f"{args.jobs} builds at once)", ["figure", "value"], [
        ["parse: folders / readable / malformed", f"{len(every)} / {len(everything)} / {len(bad_all)}"],
        ["parse rate (all folders)", f"{len(every) / max(t_parse, 1e-9):.0f} folders/s ({t_parse:.2f}s)"],
        ["sample: readable / malformed", f"{len(envs)} / {len(malformed)}"],
        ["builds by outcome", ", ".join(f"{k}={v}" for k, v in builds.most_common())],
        ["validation by outcome", ", ".join(f"{k}={v}" for k, v in validation.most_common())],
        ["kept: with oracle / without", f"{sum(o.kept and o.oracle == 'present' for o in outcomes)} / "
                                        f"{sum(o.kept and o.oracle == 'absent' for o in outcomes)}"],
        ["buildable-by-design tasks kept", f"{sum(o.kept for o in intended)}/{len(intended)} = "
                                           f"{sum(o.kept for o in intended) / max(len(intended), 1):.1%} (target >= 95%)"],
        ["images built now / reused", f"{built} / {len(outcomes) - built}"],
        ["images/min (built now, build+validate phase)", f"{built / max(t_admit / 60, 1e-9):.1f}"],
        ["environments checked/min", f"{len(outcomes) / max(t_admit / 60, 1e-9):.1f}"],
        ["disk of kept/built images: layers once / naive sum", f"{once / 1e6:.0f} MB / {naive / 1e6:.0f} MB"],
        ["build logs", f"{len(list(logs.glob('*.log')))} in {logs}"],
        ["wall time", f"{wall:.1f}s (parse {t_parse:.1f}s, build+validate {t_admit:.1f}s)"],
    ])
    print("yield per source:", tally([*outcomes, *malformed]))
    for o in outcomes:
        if not o.kept:
            print(f"  {o.key}: {o.outcome}: {o.detail.splitlines()[0][:160] if o.detail else ''}")
    kept = sum(o.kept for o in intended) / len(intended) if intended else float("nan")
    code = target("buildable-by-design tasks kept", kept, ">=", 0.95, args.quick)
    host_report("end")
    return code


if __name__ == "__main__":
    sys.exit(main())
