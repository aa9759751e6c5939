"""Benchmark `oracle_trials` (performance target: reference-solution trials/s with every verification defence
on ÷ the faster of a plain shell script and a plain docker-SDK loop doing the same run / solution / tests / rm
at the same parallelism; target ≥ 0.7, goal 1.0).

Same environments (images built and warmed beforehand), same parallelism P, four sides in one run:
  (a) pipeline, in place (the default): the rollout stage's episode driver with the replay teacher (the
      reference solution through the agent harness: container started, protected inputs checksummed,
      commands, processes killed, protected paths checksummed again, work dir captured, then the hidden
      tests copied in and run as root in place) then the verify stage's code (hack detectors, quality,
      verdicts from the in-place results);
  (b) pipeline, `verify.isolated: true`: the same episodes, then each trial's tests in a fresh container
      restored from its captured state;
  (c) plain shell script, bash + xargs -P: docker run -d, docker cp + exec the solution, docker cp the
      tests, docker exec the runner as root, docker rm -f (the docker CLI per operation);
  (d) plain docker-SDK loop, a thread pool of P over one client: create + start (the same limits as (c)),
      one exec of the solution as the agent in the work dir (`bash -c`), put_archive of the runner and
      tests, one exec of the runner as root, the result marker checked, remove(force). The low-level API
      (`client.api`): `containers.create`/`exec_run` would add an inspect per call. No per-trial image
      check, no change sets, no checksums.
(c) and (d) keep one container per trial and no isolation of verification: the floors.

Each round runs the sides one after another, in the order a c d b, then b d c a (drift cancels); each
figure is the median over `--rounds` (2). CPU-s is the whole machine's busy CPU time while a side ran
(/proc/stat: dockerd, containerd, shims, runc, the containers and this process). The set-up runs every
environment's reference solution once (its change set, as the validator records it: page cache, image
layers and the sandbox's per-image listings warm), then a few untimed trials per side (`--warmup`, 4).

Usage: python benchmarks/oracle_trials.py [--trials 32] [--parallel 8] [--rounds 2] [--per-family 2] [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_quick, build_envs, host_lines, host_report, machine_busy_s, print_table, target  # noqa: E402

from trajforge.schemas.config import parse_config  # noqa: E402
from trajforge.tasks.agent.driver import run_episodes  # noqa: E402
from trajforge.tasks.engine import StageContext  # noqa: E402
from trajforge.tasks.judge.verifier import MARK, RUNNER  # noqa: E402
from trajforge.tasks.sandbox import docker_client  # noqa: E402
from trajforge.tasks.verify import verify_rollouts  # noqa: E402

LABEL = "trajforge.bench"
LABEL_VALUE = "oracle_trials"
MEMORY, PIDS = "512m", 256  # the floors' limits, as the sandbox's defaults
QUICK_FAMILIES = ["file_search", "log_report", "python_bugfix", "tickets"]  # terminal and tool environments

TRIAL = rf"""
dir="$1"; image=$(cat "$dir/image"); workdir=$(cat "$dir/workdir"); user=$(cat "$dir/user")
c=$(docker run -d --label {LABEL}={LABEL_VALUE} --network none --cap-drop ALL --cap-add SETUID --cap-add SETGID \
     --pids-limit {PIDS} --memory {MEMORY} --init "$image" sleep infinity) || {{ echo FAIL; exit 0; }}
docker cp "$dir/solution.sh" "$c:/tmp/solution.sh" >/dev/null
docker exec -u "$user" -w "$workdir" "$c" bash /tmp/solution.sh >/dev/null 2>&1
docker cp "$dir/verifier" "$c:/verifier" >/dev/null
out=$(docker exec -u 0:0 -e WORK="$workdir" "$c" python3 -I /verifier/runner.py 2>/dev/null)
docker rm -f "$c" >/dev/null
case "$out" in
  *'{MARK}'*) case "${{out##*{MARK}}}" in '[]'*|*'"passed": false'*) echo FAIL;; *) echo PASS;; esac;;
  *) echo FAIL;;
esac
"""


def uid(env) -> str:
    return "0:0" if env.agent_user == "root" else "1000:1000"


def passed_marker(out: str) -> bool:
    """All tests passed, from the runner's result line (what both floors check)."""
    _, sep, tail = out.rpartition(MARK)
    if not sep:
        return False
    try:
        results = json.loads(tail.strip().splitlines()[0])
    except (ValueError, IndexError):
        return False
    return bool(results) and all(r.get("passed") for r in results)


# ---------------------------------------------------------------------------------------------- (c) script
def script_prepare(envs, root: Path) -> list[str]:
    """One folder per environment: image, work dir, user, solution.sh, verifier/ (runner + tests)."""
    dirs = []
    for k, env in enumerate(envs):
        d = root / f"e{k}"
        (d / "verifier" / "tests").mkdir(parents=True)
        (d / "image").write_text(env.image)
        (d / "workdir").write_text(env.workdir)
        (d / "user").write_text(uid(env))
        (d / "verifier" / "runner.py").write_text(RUNNER)
        for t in env.tests:
            (d / "verifier" / "tests" / t.path).parent.mkdir(parents=True, exist_ok=True)
            (d / "verifier" / "tests" / t.path).write_text(t.content)
        (d / "solution.sh").write_text("\n".join(env.solution) + "\n")
        dirs.append(str(d))
    (root / "trial.sh").write_text(TRIAL)
    return dirs


def script_side(root: Path, dirs: list[str], trials: int, parallel: int) -> int:
    listing = root / f"trials-{trials}.txt"
    listing.write_text("".join(dirs[i % len(dirs)] + "\n" for i in range(trials)))
    out = subprocess.run(["bash", "-c", f"xargs -P {parallel} -n 1 bash {shlex.quote(str(root / 'trial.sh'))} "
                                        f"< {shlex.quote(str(listing))}"],
                         check=True, capture_output=True, text=True).stdout
    return out.split().count("PASS")


# ---------------------------------------------------------------------------------------------- (d) SDK loop
def verifier_tar(env) -> bytes:
    """/verifier (root, 0700) with runner.py and tests/, as put_archive takes it at /."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes | None, mode: int) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid = mode, 0, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        add("verifier", None, 0o700)
        add("verifier/tests", None, 0o700)
        add("verifier/runner.py", RUNNER.encode(), 0o600)
        for t in env.tests:
            add(f"verifier/tests/{t.path}", t.content.encode(), 0o600)
    return buf.getvalue()


class SdkLoop:
    def __init__(self, envs, parallel: int):
        self.client = docker_client(pool_size=2 * parallel + 4)  # one client, a pool for every worker thread
        self.api = self.client.api
        self.parallel = parallel
        self.host_config = self.api.create_host_config(
            network_mode="none", cap_drop=["ALL"], cap_add=["SETUID", "SETGID"], pids_limit=PIDS,
            mem_limit=MEMORY, init=True)
        # per environment, prepared once (the script's folders likewise): image, user, work dir, the
        # solution as one `bash -c`, the verifier's tar
        self.plans = [(env.image, uid(env), env.workdir, "\n".join(env.solution) + "\n", verifier_tar(env))
                      for env in envs]

    def trial(self, i: int) -> bool:
        api = self.api
        image, user, workdir, solution, tar = self.plans[i % len(self.plans)]
        cid = api.create_container(image, ["sleep", "infinity"], host_config=self.host_config,
                                   labels={LABEL: LABEL_VALUE})["Id"]
        try:
            api.start(cid)
            ex = api.exec_create(cid, ["bash", "-c", solution], user=user, workdir=workdir)
            api.exec_start(ex["Id"])
            api.put_archive(cid, "/", tar)
            ex = api.exec_create(cid, ["python3", "-I", "/verifier/runner.py"], user="0:0", workdir="/",
                                 environment={"WORK": workdir})
            out = api.exec_start(ex["Id"]).decode("utf-8", "replace")
        finally:
            api.remove_container(cid, force=True)
        return passed_marker(out)

    def run(self, trials: int) -> int:
        with ThreadPoolExecutor(self.parallel) as pool:
            return sum(pool.map(self.trial, range(trials)))


# ---------------------------------------------------------------------------------------------- (a), (b)
def pipeline_side(runs: str, envs, trials: int, parallel: int, isolated: bool) -> tuple[int, dict]:
    cfg = parse_config({"dataset": "oracle", "runs": runs, "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "replay"},
                        "rollout": {"concurrency": parallel, "max_turns": 8, "verify_in_place": not isolated},
                        "verify": {"concurrency": parallel, "replay_on_sibling": False, "isolated": isolated}})
    ctx = StageContext.create(cfg, "oracle")
    by_id = {e.env_id: e for e in envs}
    episodes = [(envs[i % len(envs)].env_id, i // len(envs)) for i in range(trials)]
    t0 = time.monotonic()
    result = run_episodes(ctx, by_id, episodes)
    t1 = time.monotonic()
    verified = verify_rollouts(ctx, by_id, result.rows)
    t2 = time.monotonic()
    return sum(v.passed for v in verified.rows), {"episodes": t1 - t0, "verdicts": t2 - t1}


def measure(fn, *args) -> tuple[float, float, object]:
    """(wall s, machine busy CPU-s, fn(*args))."""
    c0, t0 = machine_busy_s(), time.monotonic()
    out = fn(*args)
    return time.monotonic() - t0, machine_busy_s() - c0, out


def cleanup(client) -> None:
    for c in client.api.containers(all=True, filters={"label": f"{LABEL}={LABEL_VALUE}"}, quiet=True):
        try:
            client.api.remove_container(c["Id"], force=True)
        except Exception:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=32, help="trials per side and round")
    ap.add_argument("--parallel", type=int, default=8, help="P: trials at once, every side")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side (alternating order); the median counts")
    ap.add_argument("--per-family", type=int, default=2, help="environments per task family")
    ap.add_argument("--warmup", type=int, default=4, help="untimed trials per side first (the set-up already ran "
                    "every environment once: its image's layers and the sandbox's per-image listings are warm)")
    add_quick(ap, f"one environment of each of {', '.join(QUICK_FAMILIES)}, --trials 8 --parallel 4 --rounds 1 "
                  "--warmup 0")
    args = ap.parse_args()
    if args.quick:
        args.per_family, args.trials, args.parallel, args.rounds, args.warmup = 1, 8, 4, 1, 0
    host_report("start", args.quick)
    warmup = args.warmup
    t_setup = time.monotonic()
    runs = tempfile.mkdtemp(prefix="tf-bench-")
    _, envs = build_envs(runs, n_per_family=args.per_family, families=QUICK_FAMILIES if args.quick else None)
    families = len({e.family for e in envs})
    root = Path(tempfile.mkdtemp(prefix="tf-oracle-"))
    dirs = script_prepare(envs, root)
    sdk = SdkLoop(envs, args.parallel)
    sides = {
        "a": lambda n: pipeline_side(runs, envs, n, args.parallel, isolated=False),
        "c": lambda n: (script_side(root, dirs, n, args.parallel), {}),
        "d": lambda n: (sdk.run(n), {}),
        "b": lambda n: pipeline_side(runs, envs, n, args.parallel, isolated=True),
    }
    got: dict[str, list[tuple[float, float, int, dict]]] = {k: [] for k in sides}
    try:
        if warmup:
            for k in "acdb":
                sides[k](warmup)
        t_setup = time.monotonic() - t_setup
        before = host_lines()  # the load the timed rounds start in
        for r in range(args.rounds):
            for k in ("acdb" if r % 2 == 0 else "bdca"):
                wall, cpu, (passed, phases) = measure(sides[k], args.trials)
                got[k].append((wall, cpu, passed, phases))
                print(f"... round {r + 1} side ({k}): {wall:.1f}s, {args.trials / wall:.2f} trials/s, "
                      f"{cpu:.1f} CPU-s, {passed}/{args.trials} passed; load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        cleanup(sdk.client)

    def med(k: str, f) -> float:
        return statistics.median(f(x) for x in got[k])

    rate = {k: med(k, lambda x: args.trials / x[0]) for k in sides}
    floor = max(rate["c"], rate["d"])
    floor_name = "(c)" if rate["c"] >= rate["d"] else "(d)"
    labels = {
        "a": "(a) pipeline, in place (default, every defence on)",
        "b": "(b) pipeline, verify.isolated: true",
        "c": "(c) plain shell script (docker CLI per operation)",
        "d": "(d) plain docker-SDK loop (thread pool, one client)",
    }
    rows = []
    for k in "abcd":
        phases = ""
        if got[k][0][3]:
            phases = " + ".join(f"{name} {statistics.median(x[3][name] for x in got[k]):.1f}s"
                                for name in got[k][0][3])
        passed = "/".join(str(x[2]) for x in got[k])
        wall, cpu = med(k, lambda x: x[0]), med(k, lambda x: x[1])
        rows.append([labels[k], f"{wall:.1f}", f"{rate[k]:.2f}", f"{rate[k] / floor:.2f}", f"{cpu:.1f}",
                     f"{cpu / args.trials:.2f}", f"{cpu / (wall * (os.cpu_count() or 1)):.0%}", passed, phases])
    print_table(f"oracle_trials: {args.trials} reference-solution trials per side and round, parallelism "
                f"{args.parallel}, {len(envs)} environments ({families} families x {args.per_family}), median of {args.rounds} rounds "
                f"(order a c d b / b d c a), {warmup} warm-up trials per side",
                ["side", "wall s", "trials/s", f"÷ floor {floor_name}", "machine CPU-s", "CPU-s/trial",
                 "CPU busy", "passed (per round)", "pipeline phases (wall)"], rows)
    print(f"(a)/max(c,d) = {rate['a'] / floor:.2f} (target ≥ 0.7, goal 1.0); (b)/max(c,d) = {rate['b'] / floor:.2f}; "
          f"floor = {floor_name} at {floor:.2f} trials/s; (d)/(c) = {rate['d'] / rate['c']:.2f}")
    print("timed rounds, start: " + "; ".join(before))
    print("timed rounds, end:   " + "; ".join(host_lines()))
    print(f"set-up (images, oracle change sets, warm-up) {t_setup:.0f}s")
    failed = {k: args.trials - min(x[2] for x in got[k]) for k in "abcd" if any(x[2] < args.trials for x in got[k])}
    if failed:
        print("reference solutions that did not pass (fewest passes of a round), by side: "
              + ", ".join(f"({k}) {n} of {args.trials}" for k, n in failed.items()))
    peers = f"(c) script {rate['c']:.2f}, (d) SDK loop {rate['d']:.2f} trials/s"
    code = target("(a) pipeline trials/s ÷ the faster floor max((c), (d))", rate["a"] / floor, ">=", 0.7, args.quick,
                  peer=peers)
    return code


if __name__ == "__main__":
    sys.exit(main())
