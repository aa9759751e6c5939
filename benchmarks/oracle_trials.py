"""Benchmark `oracle_trials` (performance target: reference-solution trials/s, episode + verification, ÷ a plain
shell script doing the same docker run / cp / exec / rm at the same parallelism; target ≥ 0.7).

Same environments (images built beforehand), same parallelism P, side by side in one run:
  (pipeline) the rollout stage's episode driver with the replay teacher (the reference solution through
             the agent harness: container started, protected inputs checksummed, commands, processes
             killed, protected paths checksummed again, work dir captured, then the hidden tests copied
             in and run as root in place) then the verify stage's code (hack detectors, quality,
             verdicts from the in-place results; `--isolated` tests each trial in a fresh container
             from its captured state instead, as `verify.isolated: true` does);
  (script)   bash + xargs -P: docker run -d, docker exec the solution, docker cp the tests, docker exec
             the runner as root, docker rm -f. One container per trial, no isolation of verification.

Usage: python benchmarks/oracle_trials.py [--parallel 8] [--trials 48]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import build_envs, print_table  # noqa: E402

from trajforge.schemas.config import parse_config  # noqa: E402
from trajforge.tasks.agent.driver import run_episodes  # noqa: E402
from trajforge.tasks.engine import StageContext  # noqa: E402
from trajforge.tasks.sandbox.verifier import RUNNER  # noqa: E402
from trajforge.tasks.verify import verify_rollouts  # noqa: E402

TRIAL = r"""
set -e
dir="$1"; image=$(cat "$dir/image"); workdir=$(cat "$dir/workdir")
c=$(docker run -d --network none --cap-drop ALL --cap-add SETUID --cap-add SETGID --pids-limit 256 \
     --memory 512m --init "$image" sleep infinity)
docker cp "$dir/solution.sh" "$c:/tmp/solution.sh" >/dev/null
docker exec -u 1000:1000 -w "$workdir" "$c" bash /tmp/solution.sh >/dev/null 2>&1 || true
docker cp "$dir/verifier" "$c:/verifier" >/dev/null
docker exec -u 0:0 -e WORK="$workdir" "$c" python3 -I /verifier/runner.py | grep -q __TF_RESULTS__
docker rm -f "$c" >/dev/null
"""


def script_side(envs, trials: int, parallel: int) -> float:
    root = Path(tempfile.mkdtemp(prefix="tf-oracle-"))
    dirs = []
    for i in range(trials):
        env = envs[i % len(envs)]
        d = root / f"t{i}"
        (d / "verifier" / "tests").mkdir(parents=True)
        (d / "image").write_text(env.image)
        (d / "workdir").write_text(env.workdir)
        (d / "verifier" / "runner.py").write_text(RUNNER)
        for t in env.tests:
            (d / "verifier" / "tests" / t.path).write_text(t.content)
        (d / "solution.sh").write_text("\n".join(env.solution) + "\n")
        dirs.append(str(d))
    script = root / "trial.sh"
    script.write_text(TRIAL)
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", f"printf '%s\\n' {' '.join(dirs)} | xargs -P {parallel} -n 1 bash {script}"],
                   check=True)
    return time.monotonic() - t0


def pipeline_side(runs: str, envs, trials: int, parallel: int, isolated: bool) -> tuple[float, float, float, int]:
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
    return t2 - t0, t1 - t0, t2 - t1, sum(v.passed for v in verified.rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--trials", type=int, default=48)
    args = ap.parse_args()
    runs = tempfile.mkdtemp(prefix="tf-bench-")
    _, envs = build_envs(runs, n_per_family=3)
    script_side(envs, args.parallel, args.parallel)  # warm-up: page cache, image layers
    s = script_side(envs, args.trials, args.parallel)
    p, p_roll, p_ver, passed = pipeline_side(runs, envs, args.trials, args.parallel, isolated=False)
    i, i_roll, i_ver, i_passed = pipeline_side(runs, envs, args.trials, args.parallel, isolated=True)
    print_table(f"oracle_trials: {args.trials} reference-solution trials, parallelism {args.parallel}, "
                f"{len(envs)} environments (8 families x 3)",
                ["run", "wall s", "trials/s", "÷ script (target ≥ 0.7)", "passed"],
                [["plain shell script (1 container per trial)", f"{s:.1f}", f"{args.trials / s:.2f}", "1.00",
                  "-"],
                 [f"pipeline, in place (default): episodes+tests {p_roll:.1f}s + verdicts {p_ver:.1f}s",
                  f"{p:.1f}", f"{args.trials / p:.2f}", f"{s / p:.2f}", f"{passed}/{args.trials}"],
                 [f"pipeline, verify.isolated: episodes {i_roll:.1f}s + fresh-container tests {i_ver:.1f}s",
                  f"{i:.1f}", f"{args.trials / i:.2f}", f"{s / i:.2f}", f"{i_passed}/{args.trials}"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
