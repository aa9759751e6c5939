"""Hidden-test verification that the agent cannot influence.

Order of operations (each one an invariant): every agent process is killed; the verifier folders
(`/verifier` for trajforge's runner, `/tests` and `/logs/verifier` for script verifiers) are created
fresh, owned by root, mode 0700, *after* that; the tests are copied in; they run as root under a
hard timeout with `python3 -I` (no PYTHON* variables, no user site, no cwd on sys.path) or the
task's own command; anything but a parseable result is a failed run (`error`).

Functions verifier: `test_*` functions of each test file, per-test results; the module globals
`WORK` (the work dir) and `run_as_agent(cmd, **subprocess_kwargs)` (runs agent code as the agent
user, never as root; verifier containers keep SETUID/SETGID for exactly this).
Script verifier (imported tasks), hardened whatever the task's script does: it runs with a clean
environment (fixed PATH, HOME=/root, `PYTHONSAFEPATH=1` so `python3 -m pytest` never imports from its
cwd unless the reference passes only so, `EnvSpec.tests_import_from_cwd`; no PYTHONPATH/PYTHONHOME/PYTHONSTARTUP, no
user site); `/logs/verifier` is created fresh and the
reset is checked (root-owned, mode 0700, empty, no symlink on the way): if it cannot be trusted the run
reports a `fallback` and the verify stage tests in a fresh container instead. The reward comes from
`/logs/verifier/reward.json` (`{"reward": x}`, optionally `"tests": [{"name", "passed"}]`) or
`reward.txt` (regular files only: in the fresh folder they can only have been written by the test
run), else pytest's `PASSED`/`FAILED` result lines (from its summary section when there is one), else
the exit code. A non-zero exit of the test command is never a pass, whatever the output says.
"""

from __future__ import annotations

import base64
import io
import json
import os
import posixpath
import re
import secrets
import shlex
import stat
import tarfile
import time
from dataclasses import dataclass, field

from ...schemas.common import FileSpec
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import InPlaceTests
from ...schemas.verdict import TestResult
from ..sandbox.container import Sandbox
from ..sandbox.errors import SandboxError
from ..sandbox.walk import DECISION_CAP
from .trace import Tracer
from .trace import available as tracing_available

MARK = "__TF_RESULTS__ "
EXIT_MARK = "__TF_TESTS_ENDED__ "
VERIFIER_CAPS = ("SETUID", "SETGID")

RUNNER = r'''
import json, os, runpy, subprocess, sys
WORK = os.environ["WORK"]

def run_as_agent(cmd, **kw):
    """Run agent-written code as the agent user (uid 1000), in the work dir by default."""
    kw.setdefault("cwd", WORK)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 30)
    kw.setdefault("env", {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/agent", "LANG": "C.UTF-8"})
    return subprocess.run(cmd, user=1000, group=1000, extra_groups=[], **kw)

TESTS = os.environ.get("TESTS_DIR", "/verifier/tests")
results = []
for name in sorted(os.listdir(TESTS)):
    if not (name.startswith("test") and name.endswith(".py")):
        continue
    try:
        ns = runpy.run_path(os.path.join(TESTS, name),
                            init_globals={"WORK": WORK, "run_as_agent": run_as_agent})
    except BaseException as e:
        results.append({"name": name, "passed": False, "message": "import failed: %r" % (e,)})
        continue
    for fn_name, fn in list(ns.items()):
        if fn_name.startswith("test_") and callable(fn):
            try:
                fn()
                results.append({"name": fn_name, "passed": True, "message": ""})
            except BaseException as e:
                msg = "%s: %s" % (type(e).__name__, e)
                results.append({"name": fn_name, "passed": False, "message": msg[:500]})
sys.stdout.write("\n__TF_RESULTS__ " + json.dumps(results) + "\n")
if os.environ.get("REWARD_JSON"):  # Harbor's convention, for environments exported as task folders
    reward = sum(r["passed"] for r in results) / len(results) if results else 0.0
    with open(os.environ["REWARD_JSON"], "w") as f:
        json.dump({"reward": reward, "tests": results}, f)
'''
PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR)\s+(\S+)(?:\s+-\s+(.*))?$", re.M)
SUMMARY = re.compile(r"^=+ short test summary info =+$", re.M)
SAFE_ENV = ("env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "
            "PYTHONSAFEPATH=1 PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 TEST_DIR=/tests")


def safe_env(env: EnvSpec) -> str:
    """The clean environment a task's test command runs in: `SAFE_ENV`, without `PYTHONSAFEPATH` for tests that
    import from their working folder as Harbor runs them (`EnvSpec.tests_import_from_cwd`, set by the validator only
    when the reference passes only so)."""
    return SAFE_ENV.replace("PYTHONSAFEPATH=1 ", "") if env.tests_import_from_cwd else SAFE_ENV


IMPORT_FAILED = re.compile(r"\b(ModuleNotFoundError|ImportError)\b")


# (whatever the episode left at /logs, a file, a link or a FIFO, goes: the reset is trajforge's, never the agent's to break)
RESET = ("rm -rf /tests; { [ -d /logs ] && [ ! -L /logs ]; } || rm -f /logs; rm -rf /logs/verifier; "
         "mkdir -p /logs/verifier && chmod 700 /logs /logs/verifier "
         "&& [ ! -L /logs ] && [ ! -L /logs/verifier ] && [ \"$(stat -c '%u %a' /logs/verifier)\" = '0 700' ] "
         "&& [ -z \"$(ls -A /logs/verifier)\" ] && echo TF_RESET_OK")


@dataclass
class TestRun:
    __test__ = False
    results: list[TestResult]
    output: str
    duration_s: float
    error: str | None = None  # set when the tests produced no parseable result
    explicit_reward: float | None = None
    exit_code: int | None = None  # of the test command (script verifiers): non-zero is never a pass
    fallback: str | None = None  # the in-place results cannot be trusted: test in a fresh container
    integrity: list[str] = field(default_factory=list)  # the test run itself was tampered with (read from outside)
    # pytest's per-test lines in the output, whatever channel gave the reward (script verifiers): evidence only,
    # never a pass by itself (agent code the tests run can print lines too; it cannot unprint a reference test)
    reported: list[TestResult] = field(default_factory=list)
    leftovers: int = 0  # processes the test command left running when it ended (killed then)
    reward_files: list[str] = field(default_factory=list)  # the reward files the run left (script verifiers)
    # files the run wrote outside /tests and /logs, `+` first when the file existed before it (None: no host view)
    wrote: list[str] | None = None
    # [path, program] of each read of verifier material by agent code the tests ran (trace.py; None: not traced)
    reads: list[list[str]] | None = None
    # files the episode wrote that only agent code opened or ran during the tests (trace.py; None: not traced)
    agent_only: list[str] | None = None

    @property
    def reward(self) -> float:
        if self.error:
            return 0.0
        if self.explicit_reward is not None:
            return min(1.0, max(0.0, self.explicit_reward))
        return sum(r.passed for r in self.results) / len(self.results) if self.results else 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and self.fallback is None and not self.integrity and self.exit_code in (None, 0) \
            and bool(self.results) and all(r.passed for r in self.results) and self.reward >= 1.0

    @property
    def contradicts_exit_code(self) -> bool:
        """Every reported result passed, yet the test command failed: the results were forged (e.g.
        printed by agent code the tests ran) or the run was cut short after printing them."""
        return self.error is None and bool(self.results) and all(r.passed for r in self.results) \
            and self.reward >= 1.0 and self.exit_code not in (None, 0)

    def outcome(self) -> dict[str, bool]:
        return {r.name: r.passed for r in self.results}

    def to_record(self) -> InPlaceTests:
        return InPlaceTests(results=self.results, output=self.output, duration_s=round(self.duration_s, 3),
                            error=self.error, explicit_reward=self.explicit_reward, exit_code=self.exit_code,
                            fallback=self.fallback, integrity=self.integrity, reported=self.reported,
                            leftovers=self.leftovers, wrote=self.wrote, reads=self.reads,
                            agent_only=self.agent_only)

    @classmethod
    def from_record(cls, rec: InPlaceTests) -> "TestRun":
        return cls(list(rec.results), rec.output, rec.duration_s, rec.error, rec.explicit_reward, rec.exit_code,
                   rec.fallback, list(rec.integrity), list(rec.reported), rec.leftovers,
                   wrote=None if rec.wrote is None else list(rec.wrote),
                   reads=None if rec.reads is None else [list(x) for x in rec.reads],
                   agent_only=None if rec.agent_only is None else list(rec.agent_only))


INLINE_LIMIT = 64 << 10  # base64 bytes of tests carried in the exec's environment (one variable may be 128 KiB)
INLINE_VAR = "TF_VERIFIER_FILES"
# Writes the files of a base64 JSON {path: [mode, text]} (in INLINE_VAR) below the cwd, creating each one
# (never through a link).
UNPACK = r"""
import base64, json, os
for path, (mode, text) in json.loads(base64.b64decode(os.environ.pop("TF_VERIFIER_FILES"))).items():
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
"""


def _inline(files: list[FileSpec]) -> str | None:
    """`files` as UNPACK's input (INLINE_VAR); None if larger than INLINE_LIMIT or a path leaves the folder."""
    if any(f.path.startswith("/") or ".." in f.path.split("/") for f in files):
        return None
    data = base64.b64encode(json.dumps({f.path: [f.mode, f.content] for f in files}).encode()).decode()
    return data if len(data) <= INLINE_LIMIT else None


def run_hidden_tests(sandbox: Sandbox, env: EnvSpec, timeout_s: float | None = None, trace: bool = False) -> TestRun:
    """Kill the agent's processes, create the verifier folders fresh, copy the tests in, run them as
    root under `timeout_s` (the environment's own timeout wins). Works in a fresh container and in the
    episode's own (in-place); the container needs VERIFIER_CAPS for `run_as_agent`. `trace`: a script verifier's
    run is traced from the engine's host where it can be (trace.py: `TestRun.reads`)."""
    timeout_s = env.test_timeout_s or timeout_s or 60
    sandbox.kill_agent_processes()
    if env.verifier == "script":
        return _run_script(sandbox, env, timeout_s, trace)
    # `/verifier` made fresh in the exec that runs the tests: whatever a root agent left there is gone
    # or the run never starts. Small tests travel in that exec's environment (one exec; the engine's
    # archive upload costs about as much CPU again), never in its command line, which the agent's code
    # the tests run could read in /proc; the variable is unset before the runner starts. Larger ones
    # are copied in by the engine under a name nobody could predict and moved there in the same exec.
    files = [FileSpec(path="runner.py", content=RUNNER, mode=0o600)]
    files += [FileSpec(path=f"tests/{t.path}", content=t.content, mode=0o600) for t in env.tests]
    inline = _inline(files)
    if inline is not None:
        fill = (f"mkdir -m 700 /verifier && cd /verifier && /usr/bin/python3 -I -c {shlex.quote(UNPACK)} && "
                f"unset {INLINE_VAR}")
    else:
        staging = f"/.tf-verifier-{secrets.token_hex(8)}"
        sandbox.put_files(files, parent="/", root=staging.lstrip("/"), uid=0, dir_mode=0o700)
        fill = f"mv -T {staging} /verifier && cd /verifier"
    t0 = time.monotonic()
    res = sandbox.exec(f"rm -rf /verifier && [ ! -e /verifier ] && {fill} && "
                       f"WORK={shlex.quote(env.workdir)} exec /usr/bin/python3 -I /verifier/runner.py",
                       timeout_s=timeout_s, user="root", workdir="/", output_limit=1 << 20,
                       env={INLINE_VAR: inline} if inline is not None else None)
    duration = time.monotonic() - t0
    _, sep, tail = res.output.rpartition(MARK)
    if res.timed_out:
        return TestRun([], res.output[-2000:], duration, f"test run timed out after {timeout_s:g}s")
    if not sep:
        return TestRun([], res.output[-2000:], duration, f"test runner gave no result (exit {res.exit_code})")
    try:
        results = [TestResult(**r) for r in json.loads(tail.strip().splitlines()[0])]
    except (ValueError, TypeError, IndexError) as err:
        return TestRun([], res.output[-2000:], duration, f"unparseable test result: {err}")
    if not results:
        return TestRun([], res.output[-2000:], duration, "the hidden tests define no test_* function")
    return TestRun(results, res.output[:-len(tail) - len(MARK)][-2000:], duration)


def _run_script(sandbox: Sandbox, env: EnvSpec, timeout_s: float, trace: bool = False) -> TestRun:
    reset = sandbox.exec(RESET, timeout_s=10, user="root", workdir="/")
    if "TF_RESET_OK" not in reset.output:
        return TestRun([], reset.output[-500:], 0.0, None,
                       fallback="/logs/verifier could not be reset to a fresh root-owned empty folder")
    # who may outlive the tests: the init and its `sleep` (a root agent's are known; else read before any test runs)
    keep = sorted(sandbox.keep_pids if sandbox.agent == "root" else {1} | sandbox._init_children())
    copy_tests(sandbox, env)
    copied_in = time.time()
    before = _upper_state(sandbox)  # what the writable layer holds as the tests start (host side; None: no view)
    t0 = time.monotonic()
    command = env.test_command or "bash /tests/test.sh"
    # the moment the test command ends, the same shell notes the time and kills every process it left (agent code
    # the tests ran may have started one to rewrite the reward or the tests afterwards): nothing is written
    # after that moment but by the kernel's clock, which `_read_outside` checks
    # (the tests' own short-lived children, e.g. a process substitution's, get up to 0.2 s to end before the count;
    # a reward written meanwhile is still after `t`, which the ctime checks read)
    reap = (f'rc=$?; t=$EPOCHREALTIME; n=0; keep=" {" ".join(map(str, keep))} $$ $PPID "; '
            'for i in 1 2 3 4 5 6 7 8 9 10; do x=; for d in /proc/[0-9]*; do p=${d#/proc/}; '
            'case "$keep$pre" in *" $p "*) ;; *) x=1; break;; esac; done; [ -z "$x" ] && break; /bin/sleep 0.02; done; '
            'for d in /proc/[0-9]*; do '
            'p=${d#/proc/}; case "$keep" in *" $p "*) continue;; esac; s=; read -r s 2>/dev/null < "$d/stat"; s=${s##*) }; '
            'kill -9 "$p" 2>/dev/null && [ "${s%% *}" != Z ] && case "$pre" in *" $p "*) ;; *) n=$((n+1));; esac; done; '
            f'printf "\\n{EXIT_MARK}%s %s\\n" "$t" "$n"; exit $rc')
    # (processes already there when the tests start, e.g. a harness exec still ending, are killed but not counted:
    # `leftovers` counts what the tests started)
    pre = 'pre=" "; for d in /proc/[0-9]*; do pre="$pre${d#/proc/} "; done; '
    tracer = Tracer(sandbox) if trace and tracing_available(sandbox) else None
    if tracer is not None:
        tracer.start()
    try:
        res = sandbox.exec(f"{tracer.prefix() if tracer else ''}{pre}{safe_env(env)} bash -c {shlex.quote(command)}; {reap}",
                           timeout_s=timeout_s, user="root", workdir=env.workdir, output_limit=1 << 20)
    finally:
        traced = tracer.finish() if tracer is not None else None
    duration = time.monotonic() - t0
    body, mark, stamp = res.output.rpartition(EXIT_MARK)
    words = stamp.split() if mark else []
    ended = float(words[0]) if words and _is_float(words[0]) else time.time()
    left = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    output = body if mark else res.output
    out, code = output[-4000:], res.exit_code
    if res.timed_out:
        return TestRun([], out, duration, f"test run timed out after {timeout_s:g}s", exit_code=code)
    reported = _reported(output)
    # what the run left is read from outside, the container frozen (a process the tests started cannot change
    # it meanwhile, and no program of the container, perhaps replaced by agent code the tests ran, reads it)
    files, integrity, after = _read_outside(sandbox, env, copied_in, ended)
    run = _judge_script_run(env, files, integrity, out, duration, code, reported)
    run.reported, run.leftovers = reported, left
    run.reward_files = sorted(n for n in REWARD_FILES if n in files)
    # (in a fresh container every file of the episode's commit existed before the run too)
    run.wrote = _written_during(before, after, sandbox.baseline | sandbox.carried)
    if run.wrote:
        copied = _copied_up_only(sandbox, [p[1:] for p in run.wrote if p.startswith("+") and before is not None
                                           and p[1:] not in before])
        run.wrote = [p for p in run.wrote if p[1:] not in copied or not p.startswith("+")]
    if traced is not None and before is not None:
        # what the episode wrote: this container's writable layer as the tests started (restored state, in place
        # the episode's own) and the episode's commit (venue `fresh`), never the tests' own folders
        # (exactly these names: a program the test run itself made, e.g. a venv its test.sh creates in the work dir,
        # is the tests', never the agent's)
        written = (set(before) | sandbox.carried) - {p for p in set(before) if p.startswith(("/tests", "/logs"))}
        ours = written.__contains__
        run.reads = [[p, prog] for p, prog in traced.agent_reads(ours)]
        rewritten = {p.lstrip("+") for p in run.wrote or [] if not p.endswith("/")}
        run.agent_only = sorted(traced.agent_only(ours, written | rewritten))[:DECISION_CAP]
    return run


def copy_tests(sandbox: Sandbox, env: EnvSpec) -> None:
    """The hidden tests into `/tests` (a folder that must not exist yet), root-owned, mode 0700, by the engine."""
    sandbox.put_files([FileSpec(path=t.path, content=t.content, mode=t.mode | 0o500) for t in env.tests],
                      parent="/", root="tests", uid=0, dir_mode=0o700)


def _upper_state(sandbox: Sandbox) -> dict[str, tuple[int, int, int]] | None:
    """{path: (inode, ctime ns, mode)} of every entry of the container's writable layer, read on the engine's
    host without following links; None when the layer cannot be read there (a remote engine)."""
    upper = sandbox._upper_dir()
    if upper is None:
        return None
    out: dict[str, tuple[int, int, int]] = {}
    for root, dirs, names in os.walk(upper):  # never follows links
        for name in dirs + names:
            host = os.path.join(root, name)
            try:
                st = os.lstat(host)
            except FileNotFoundError:
                continue
            out[host[len(upper):]] = (st.st_ino, st.st_ctime_ns, st.st_mode)
    return out


def _written_during(before: dict | None, after: dict | None, image: frozenset[str]) -> list[str] | None:
    """Files the test run created, rewrote, replaced or deleted, outside `/tests` and `/logs`, each marked `+` when
    it existed before the run (in the writable layer or the image), and the program folders (PROGRAM_DIRS) whose
    entries changed, with a trailing `/`; None without a host view."""
    if before is None or after is None:
        return None
    out = []
    for p, now in after.items():
        if before.get(p) == now or p.startswith(("/tests/", "/logs/")):
            continue
        if stat.S_ISDIR(now[2]):  # a folder: only those programs are looked up in (a shim made and removed)
            if p in PROGRAM_DIRS:
                out.append(p + "/")
            continue
        out.append(("+" if p in before or p in image else "") + p)
    return sorted(out)[:DECISION_CAP]


COPY_UP_LIMIT = 256 << 20  # bytes compared of one file the run may only have copied up


def _copied_up_only(sandbox: Sandbox, paths: list[str]) -> set[str]:
    """Of `paths` (files the writable layer gained during the run that an image layer, or the episode's commit,
    holds), those whose bytes, mode and owner are the lower layer's: copied up by the kernel on a read-write open
    (sqlite opens its database so for a SELECT), never changed. Read on the engine's host; none without a view."""
    upper = sandbox._upper_dir()
    data = ((sandbox.container.attrs.get("GraphDriver") or {}).get("Data") or {})
    lowers = [x for x in (data.get("LowerDir") or "").split(":") if x]
    if upper is None or not lowers or not paths:
        return set()
    same = set()
    for p in paths:
        try:
            mine = os.lstat(upper + p)
            theirs = next((st, low) for low in lowers if (st := _lstat(low + p)) is not None)
        except (OSError, StopIteration):
            continue
        st, low = theirs
        if not (stat.S_ISREG(mine.st_mode) and stat.S_ISREG(st.st_mode)) or mine.st_size > COPY_UP_LIMIT or \
                (mine.st_mode, mine.st_uid, mine.st_gid, mine.st_size) != (st.st_mode, st.st_uid, st.st_gid, st.st_size):
            continue
        if _same_bytes(upper + p, low + p):
            same.add(p)
    return same


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:  # (regular files: lstat said so, and nothing runs meanwhile)
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


# folders whose entries a test run looks programs up in (SAFE_ENV's PATH): an entry made there during the run,
# even one removed again, changes the folder
PROGRAM_DIRS = frozenset({"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"})


def _reported(output: str) -> list[TestResult]:
    """pytest's per-test result lines, from its first summary section on when there is one (a test's own
    output before it is not read). A name reported both passed and failed counts as failed: pytest reports
    each test once, so a second, passing line was printed by someone else (e.g. agent text the test command
    prints after pytest, headed by a forged summary)."""
    summary = SUMMARY.search(output)
    results: dict[str, TestResult] = {}
    for status, name, msg in PYTEST_LINE.findall(output[summary.end():] if summary else output):
        seen = results.get(name)
        if seen is not None and (seen.passed != (status == "PASSED") or seen.message.startswith(CONFLICT)):
            results[name] = TestResult(name=name, passed=False, message=CONFLICT)
        else:
            results[name] = TestResult(name=name, passed=status == "PASSED", message=(msg or "")[:500])
    return list(results.values())


CONFLICT = "reported both passed and failed"


def conflicting(run: TestRun) -> list[str]:
    """Tests whose pytest lines disagree (`_reported`): lines printed by someone other than pytest."""
    return [t.name for t in run.reported if t.message == CONFLICT]


def _judge_script_run(env: EnvSpec, files: dict[str, str], integrity: list[str], out: str, duration: float,
                      code: int | None, reported: list[TestResult]) -> TestRun:
    """The result of a finished script test run: reward files read from outside, else pytest's lines, else the
    exit code. The reward channel is the one the reference solution's runs used (`EnvSpec.reward_files`, set by
    the validator), else the files the tests' text names: any other reward file is tampering."""
    rewards: dict[str, float] = {}
    tests: list[TestResult] = []
    for name in REWARD_FILES:
        if name not in files:
            continue
        text = files[name]
        try:
            if name == "reward.json":
                data = json.loads(text)
                rewards[name] = float(data["reward"] if isinstance(data, dict) else data)
                tests = [TestResult(**t) for t in data.get("tests", [])] if isinstance(data, dict) else []
            else:
                rewards[name] = float(text.strip().split()[0])
        except (ValueError, TypeError, KeyError, IndexError) as err:
            if not integrity:
                return TestRun([], out, duration, f"unparseable /logs/verifier/{name}: {err}", exit_code=code)
    written = set(env.reward_files) or {n for n in REWARD_FILES if any(n in t.content for t in env.tests)}
    for name in sorted(rewards):
        if name not in written:
            integrity.append(f"/logs/verifier/{name} was written although the task's tests only write "
                             f"{' and '.join(sorted(written)) or 'none'}")
    if len(set(rewards.values())) > 1:
        integrity.append("the reward files disagree: " + ", ".join(f"{n} = {v:g}" for n, v in sorted(rewards.items())))
    if integrity:
        value = min(rewards.values()) if rewards else 0.0
        return TestRun([TestResult(name="reward", passed=False, message="; ".join(integrity)[:500])], out, duration,
                       None, value, code, integrity=integrity)
    if "reward.json" in rewards:
        value = rewards["reward.json"]
        return TestRun(tests or [TestResult(name="reward", passed=value >= 1.0)], out, duration, None, value, code)
    if "reward.txt" in rewards:
        value = rewards["reward.txt"]
        return TestRun([TestResult(name="reward", passed=value >= 1.0)], out, duration, None, value, code)
    if reported:
        return TestRun(list(reported), out, duration, exit_code=code)
    return TestRun([TestResult(name="exit_code", passed=code == 0, message=f"exit {code}")], out, duration,
                   exit_code=code)


REWARD_LIMIT = 1 << 20
REWARD_FILES = ("reward.json", "reward.txt")  # in the order they are read


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _ctime_problems(env: EnvSpec, after: dict[str, tuple[int, int, int]] | None, copied_in: float,
                    ended: float) -> list[str]:
    """From the writable layer as the run left it (`_upper_state`, read on the engine's host): a hidden test
    file whose inode changed after it was copied in (a write, a rename onto it, a restore of the same bytes:
    the ctime, which no process can set back, says so), and a reward file that changed after the test command
    ended. Nothing without a host view."""
    if after is None:
        return []
    problems = []
    for t in env.tests:
        entry = after.get(posixpath.normpath(f"/tests/{t.path}"))
        if entry is None:
            problems.append(f"/tests/{t.path} was removed during the test run")
        elif entry[1] / 1e9 > copied_in:
            problems.append(f"/tests/{t.path} was changed during the test run")
    for name in REWARD_FILES:
        entry = after.get(f"/logs/verifier/{name}")
        if entry is not None and entry[1] / 1e9 > ended:
            problems.append(f"/logs/verifier/{name} was written after the test command ended")
    return problems


def _read_outside(sandbox: Sandbox, env: EnvSpec, copied_in: float, ended: float
                  ) -> tuple[dict[str, str], list[str], dict | None]:
    """After a script test run, from outside the container (the engine's archive of its filesystem, the
    writable layer on the engine's host, the container frozen meanwhile): the reward files of
    `/logs/verifier` ({name: text}, regular files only) and what is wrong with the run itself: the hidden
    tests not as they were copied in or changed since, a reward written after the test command ended or
    not a regular file in a real folder; and the writable layer's entries (`_upper_state`) as the run left them."""
    problems: list[str] = []
    files: dict[str, str] = {}
    sandbox.pause()
    try:
        after = _upper_state(sandbox)
        problems += _ctime_problems(env, after, copied_in, ended)
        try:
            data = sandbox.get_archive("/tests", 64 << 20)
        except SandboxError as err:
            data, problems = None, [f"the hidden tests could not be read back after the run: {err}"]
        if data is not None:
            found = {}
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                first = tar.next()
                if first is None or not first.isdir():
                    problems.append("/tests is no longer a folder after the test run")
                else:
                    for m in tar.getmembers():
                        rel = m.name.split("/", 1)[1] if "/" in m.name else ""
                        if m.isfile():
                            found[rel] = tar.extractfile(m).read()
                        elif rel:
                            found[rel] = None
            for t in env.tests:
                if found.get(t.path) != t.content.encode() and f"/tests/{t.path} was changed during the test run" \
                        not in problems:
                    problems.append(f"/tests/{t.path} was changed during the test run")
        for folder in ("/logs", "/logs/verifier"):  # real folders: the reward files are read below them
            if sandbox.path_kind(folder) != "dir":
                problems.append(f"{folder} is no longer a folder after the test run")
        if problems and any(p.startswith("/logs") for p in problems):
            return files, problems, after
        for name in ("reward.json", "reward.txt"):
            kind = sandbox.path_kind(f"/logs/verifier/{name}")
            if kind is None:
                continue
            if kind != "file":
                problems.append(f"/logs/verifier/{name} is a {kind}, not a regular file")
                continue
            try:
                files[name] = sandbox.get_archive_file(f"/logs/verifier/{name}", REWARD_LIMIT).decode(
                    "utf-8", errors="replace")
            except SandboxError as err:
                problems.append(f"/logs/verifier/{name} could not be read: {str(err)[:200]}")
    finally:
        sandbox.unpause()
    return files, problems, after


def restore_state(sandbox: Sandbox, final_state: bytes) -> None:
    """Replace the work dir with the tar captured at the end of an episode (`get_archive` of it)."""
    parent = sandbox.workdir.rstrip("/").rsplit("/", 1)[0] or "/"
    # as the agent (it owns the work dir; root without the agent's root file powers has no
    # CAP_DAC_OVERRIDE), then the daemon extracts
    sandbox.exec(f"find {shlex.quote(sandbox.workdir)} -mindepth 1 -delete", timeout_s=30, workdir="/")
    sandbox.put_archive(parent, final_state)
