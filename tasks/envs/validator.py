"""The environment validator: one gate every source goes through (procedural, LLM, imported).

Checks, in order, each with the reason code a failing environment is rejected with:
- `image_build_failed`: the image does not build (the reject carries the log tail);
- `noop_passes`: the hidden tests pass on the untouched environment (a fresh container), or once the
  environment's own code has run before any action (a tool environment's server started and listed its
  tools: a server whose start solves the task);
- `tests_leaked` / `solution_leaked`: a file inside the image has the content of a hidden test or of
  the reference solution (the agent could read it during the episode);
- `tools_broken` (`tools` environments): the tool server does not start in the built image, or does
  not list exactly the tools of `.tools/tools.json`, each with a valid object schema (the reject
  carries the server's output tail);
- `solution_fails`: the reference solution errors, hangs past its timeout, or does not pass;
- `tools_write_outside_store` (`tools` environments): the reference solution's tool calls changed a file
  other than the store (`store.db`);
- `engine_managed_change`: the reference solution changes a file the engine writes into every container
  (`/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`): no judging container holds that change, so every honest
  agent would fail;
- `nondeterministic_tests`: the tests give different per-test results when run twice;
- `not_instance_specific`: where the answer is a file, the solved work dir of this instance also
  passes the tests of a sibling instance (same family and level, another seed): a hard-coded answer
  would pass too;
- `weak_tests`: the test audit (`tasks/envs/audit.py`) found a wrong state derived from the reference
  solution's outputs (a mutant: emptied, a line added, a number moved, code stubbed, ...) that the tests
  pass; the reject names the mutant, its file, what changed and the test output (`synthesize.audit: flag`
  keeps it, recorded `flag`; `off` skips it); the audit is `EnvSpec.audit`;
- `verifier_error`: the tests themselves crash or print no result on the solved state (or the audit's own
  code failed: trajforge's fault, never a silent keep);
- `validation_infra`: Docker failed while checking (infrastructure, not the environment).
`near_duplicate` groups are found before (see `dedup`), over all candidates of a build; the stage keeps
the first of a group that passes these checks.

Without a reference solution (`oracle: absent`) every check that needs no oracle runs: the image
builds, the tests are not in it, the untouched environment fails its tests and they give the same
per-test results on it twice (`nondeterministic_tests`); tests that crash or print no result on it
are `verifier_error`. `solution_passes`, `instance_specific` and `test_audit` are `skip`.

The checks are the ordered table `CHECKS` (like judging's, tasks/judge/checks.py): to add one, write
`def name(case) -> Validation | None` and add one `Check(...)` line where it belongs.
"""

from __future__ import annotations

import hashlib
import shlex
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

from ...schemas.common import Reject
from ...schemas.config import SandboxConfig, SynthesizeConfig
from ...schemas.environment import EnvSpec, TestAudit
from ..judge.changes import reference_changes, sensitive_class
from ..judge.exposure import tests_run_agent_code
from ..judge.guard import agent_dirs, guard_timeout, guardable, pytest_files, run_guarded
from ..judge.script_guard import may_run_scripts, run_script_guard, script_guardable
from ..judge.verifier import IMPORT_FAILED, VERIFIER_CAPS, TestRun, run_hidden_tests
from ..sandbox import Sandbox, SandboxError
from ..sandbox.walk import DECISION_CAP, inside
from . import start_code
from .audit import AuditSettings, describe
from .audit import audit as run_audit
from .images import BuildOptions, ImageBuildError, ensure_image
from .kinds import of as kind_of

# where a leaked test or solution could hide; system folders are skipped (they come from the base image)
# files the engine bind-mounts into every container (never in its writable layer, a commit or a change set)
ENGINE_FILES = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
LEAK_SCAN = (r"find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /lib -o "
             r"-path /lib64 -o -path /bin -o -path /sbin -o -path /var/lib -o -path /var/cache -o -path /etc "
             r"-o -path /verifier \) -prune -o -type f -size -2M -print0 2>/dev/null | xargs -0 -r sha256sum")


@dataclass
class Validation:
    env_id: str
    reject: Reject | None = None
    checks: dict[str, str] = field(default_factory=dict)  # check -> pass | fail | skip
    built: bool = False
    seconds: float = 0.0
    build_cause: str | None = None  # why the image did not build (ImageBuildError.cause)

    @property
    def ok(self) -> bool:
        return self.reject is None

    def fail(self, check: str, reason: str, detail: str) -> "Validation":
        self.checks[check] = "fail"
        self.reject = Reject(key=self.env_id, reason=reason, detail=detail[:1500])
        return self


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def validate_env(client, env: EnvSpec, sandbox: SandboxConfig, base_image: str, aliases: dict[str, str],
                 command_timeout_s: float, test_timeout_s: float,
                 sibling: Callable[[EnvSpec], EnvSpec | None] | None = None, labels: dict | None = None,
                 build: BuildOptions | None = None, log_sink: Callable[[str, str], None] | None = None,
                 audit: AuditSettings | None = None) -> Validation:
    """Build `env`'s image (sets `env.image`) and run every check; never raises for the environment's
    own faults (they become the reject), only `validation_infra` wraps Docker failures. A failed build's
    cause code is `Validation.build_cause` and leads the reject's detail."""
    import time

    t0 = time.monotonic()
    v = Validation(env.env_id)
    try:
        env.image, v.built = ensure_image(client, base_image, env, aliases, limits=sandbox, options=build,
                                          log_sink=log_sink)
        v.checks["image"] = "pass"
    except ImageBuildError as err:
        v.build_cause = err.cause
        v.seconds = round(time.monotonic() - t0, 3)
        return v.fail("image", "image_build_failed",
                      f"[{err.cause}] {err.args[0].splitlines()[0]}\n{err.log_tail[-1200:]}")
    try:
        return _checks(client, env, v, sandbox, command_timeout_s, test_timeout_s, sibling, labels or {},
                       audit or AuditSettings())
    except SandboxError as err:
        return v.fail("infra", "validation_infra", str(err))
    finally:
        v.seconds = round(time.monotonic() - t0, 3)


def validate_configured(client, env: EnvSpec, s: SynthesizeConfig, sandbox: SandboxConfig, *,
                        build: BuildOptions | None = None, audit: AuditSettings | None = None,
                        **extra) -> Validation:
    """`validate_env` with a build config's settings, as a build runs it: `s` gives the aliases,
    the solution and test timeouts, the image build options and the audit (each overridable: `build`, `audit`), and
    every environment is checked against its catalogue sibling. `extra`: `labels`, `log_sink`. The one place these
    settings are spelled out (a build, `envs import`, `envs validate`, `envs audit`, the benchmarks)."""
    from .catalogue import sibling_of

    return validate_env(client, env, sandbox, sandbox.base_image, s.image_aliases, s.solution_timeout_s,
                        s.test_timeout_s, sibling=sibling_of, build=build or BuildOptions.from_config(s.build),
                        audit=audit or AuditSettings(s.audit, s.audit_mutants), **extra)


@dataclass
class Case:
    """One environment under validation: what the checks so far found. `sb` is the container the current
    check runs in (a fresh one when the check says `fresh`); `noop` the untouched environment's test run,
    `first`/`second` the reference solution's two."""

    env: EnvSpec
    v: Validation
    box: Callable[[], Sandbox]
    command_timeout_s: float
    test_timeout_s: float
    sibling: Callable[[EnvSpec], EnvSpec | None] | None
    audit: AuditSettings = field(default_factory=AuditSettings)
    sb: Sandbox | None = None
    noop: TestRun | None = None
    first: TestRun | None = None
    second: TestRun | None = None
    extra: dict = field(default_factory=dict)  # what a registered check wants to keep (e.g. the audit's record)


@dataclass(frozen=True)
class Check:
    """One row of `CHECKS`: `run` returns the failed `Validation` (via `Validation.fail`) or None (then it is
    recorded `pass` unless it recorded something itself). `oracle`: the environments it applies to
    (`present`, `absent`, `any`); one that does not apply is recorded `skip` unless a check of the same
    name already recorded it. `fresh`: it runs in a new container (the ones after it share that one)."""

    name: str
    reasons: tuple[str, ...]  # the reject reasons it may give
    run: Callable[[Case], Validation | None]
    oracle: str = "any"
    fresh: bool = False
    recorded: bool = True  # False: it records its own names (the kind's checks)


def noop_fails(case: Case) -> Validation | None:
    """Doing nothing must fail, also once the environment's own code has run (a tool server started)."""
    env, v, sb, t = case.env, case.v, case.sb, case.test_timeout_s
    noop = case.noop = run_hidden_tests(sb, env, t)
    if noop.passed:
        return v.fail("noop_fails", "noop_passes", "the hidden tests pass on the untouched environment")
    if env.oracle == "absent" and (noop.error or not noop.results):  # nothing else shows the tests work
        return v.fail("noop_fails", "verifier_error",
                      f"the tests give no result on the untouched environment: {noop.error}\n{noop.output[-600:]}")
    checks = kind_of(env).checks  # they run the environment's own code (tools: its server starts, lists)
    if checks and not any(c.run(sb, env, case.command_timeout_s) for c in checks) \
            and run_hidden_tests(sb, env, t).passed:  # broken ones are named below, in a clean box
        return v.fail("noop_fails", "noop_passes", "the hidden tests pass once the environment's own code "
                      f"has run ({', '.join(c.name for c in checks)}: a tool server started and listed its "
                      "tools), before any action")


def no_leak(case: Case) -> Validation | None:
    """No file of the image holds a hidden test or the reference solution."""
    env = case.env
    secrets = {_sha(t.content): f"test file {t.path}" for t in env.tests if len(t.content) > 40}
    solution_text = "\n".join(env.solution)
    if len(solution_text) > 40:
        secrets[_sha(solution_text)] = "the reference solution"
        secrets.update({_sha(c): "a reference solution command" for c in env.solution if len(c) > 40})
    scan = case.sb.exec(LEAK_SCAN, 120, user="root", workdir="/", output_limit=4 << 20, readonly=True)
    for line in scan.output.splitlines():
        digest, _, path = line.partition("  ")
        if digest in secrets:
            reason = "solution_leaked" if "solution" in secrets[digest] else "tests_leaked"
            return case.v.fail("no_leak", reason, f"{path} in the image holds {secrets[digest]}")


def kind_checks(case: Case) -> Validation | None:
    """What the environment's kind adds (tools: `tools_serve`), each recorded under its own name."""
    for check in kind_of(case.env).checks:
        broken = check.run(case.sb, case.env, case.command_timeout_s)
        if broken:
            return case.v.fail(check.name, check.reason, broken)
        case.v.checks[check.name] = "pass"


def untouched_deterministic(case: Case) -> Validation | None:
    """Without a reference solution: the untouched environment's per-test results are the same twice."""
    case.env.audit = TestAudit(status="skip", reason="no reference solution")
    v = _without_oracle(case.sb, case.env, case.v, case.noop, case.test_timeout_s)
    return None if v.ok else v


def _engine_files(sb: Sandbox) -> dict[str, str]:
    """{path: digest} of the files the engine writes into every container (`ENGINE_FILES`)."""
    out = sb.exec("sha256sum " + " ".join(ENGINE_FILES) + " 2>/dev/null", 30, user="root", workdir="/").output
    return {path: digest for digest, _, path in (line.partition("  ") for line in out.splitlines()) if path}


def _record_changes(sb: Sandbox, env: EnvSpec) -> None:
    """What the solved container changed, as the reference's changes: their paths (`expected_changes`) and each
    one's kind and, where it is content-bound, content (`expected_kinds`)."""
    changes = sb.changes()
    env.expected_changes = sorted(changes.paths())
    env.expected_kinds = reference_changes(sb, changes, env)


def solution_passes(case: Case) -> Validation | None:
    """The reference solution runs cleanly, changes only what its kind allows and no file the engine manages, and
    its state passes."""
    env, v, sb = case.env, case.v, case.sb
    managed = _engine_files(sb)
    for cmd in env.solution:
        res = sb.exec(cmd, case.command_timeout_s)
        if res.timed_out:
            return v.fail("solution_passes", "solution_fails",
                          f"reference solution timed out after {case.command_timeout_s:g}s")
        if res.exit_code != 0:
            return v.fail("solution_passes", "solution_fails",
                          f"reference solution exited {res.exit_code}: {res.output[-600:]}")
    # a file the engine bind-mounts into every container is in no change set and in no judging container: a task
    # whose answer is there fails every honest agent in judging, though its reference passes here
    moved = sorted(p for p, d in _engine_files(sb).items() if managed.get(p) != d)
    if moved:
        return v.fail("solution_passes", "engine_managed_change", (
            f"the reference solution changes {', '.join(moved)}, which the engine writes into every container: "
            "no container the tests judge in holds that change"))
    # what the reference solution changes: an agent's change that is not among these is unexpected
    _record_changes(sb, env)
    confined = kind_of(env).confined
    stray = confined(env, env.expected_changes) if confined else None
    if stray:
        return v.fail("solution_passes", "tools_write_outside_store", stray)
    first, was = run_hidden_tests(sb, env, case.test_timeout_s, trace=True), env.tests_import_from_cwd
    first = case.first = _from_working_folder(sb, env, first, case.test_timeout_s)
    if env.tests_import_from_cwd and not was:  # (doing nothing must still fail so, in a clean box)
        with case.box() as clean:
            untouched = case.noop = run_hidden_tests(clean, env, case.test_timeout_s)
        if untouched.passed:
            return v.fail("solution_passes", "noop_passes", "the hidden tests pass on the untouched environment "
                          "once its working folder is on the import path (as `python3 -m` puts it)")
    if first.error or first.fallback:
        return v.fail("solution_passes", "verifier_error", f"{first.error or first.fallback}\n{first.output[-600:]}")
    if not first.passed:
        failed = [f"{r.name}: {r.message}" for r in first.results if not r.passed]
        return v.fail("solution_passes", "solution_fails", "failed tests: " + "; ".join(failed)[:1200])


def _from_working_folder(sb: Sandbox, env: EnvSpec, run: TestRun, test_timeout_s: float) -> TestRun:
    """The reference's test run to keep: `run`, or, where it failed on an import and the same run with the working
    folder on the path passes (a Harbor-style `cd /app && python3 -m pytest` whose tests import the answer's module
    from there, `cd /tests && python3 -m unittest`), that run, with `EnvSpec.tests_import_from_cwd` set."""
    if run.passed or run.error or run.fallback or env.tests_import_from_cwd or not IMPORT_FAILED.search(run.output):
        return run
    env.tests_import_from_cwd = True
    again = run_hidden_tests(sb, env, test_timeout_s, trace=True)
    if again.passed:
        return again
    env.tests_import_from_cwd = False
    return run


def deterministic(case: Case) -> Validation | None:
    """The reference state's per-test results are the same twice; then what a pass must show is recorded."""
    env, first = case.env, case.first
    second = case.second = run_hidden_tests(case.sb, env, case.test_timeout_s, trace=True)
    if second.error or second.outcome() != first.outcome():
        return case.v.fail("deterministic", "nondeterministic_tests",
                           f"first run {first.outcome()}, second run {second.outcome() or second.error}")
    # what a pass must show besides its reward: every test the reference runs reported passed, no process left
    # running by the tests unless they leave one here too, and the guarded run when the tests import agent code
    _record_reference(case.sb, env, case.test_timeout_s, first, second, untouched=case.noop)


def instance_specific(case: Case) -> Validation | None:
    """Where a sibling instance exists, the solved state fails its tests (no hard-coded answer fits both)."""
    other = case.sibling(case.env) if case.sibling else None
    if other is None:
        case.v.checks["instance_specific"] = "skip"
        return None
    if run_hidden_tests(case.sb, other, case.test_timeout_s).passed:
        return case.v.fail("instance_specific", "not_instance_specific",
                           f"the solved state of {case.env.env_id} also passes the tests of {other.env_id}")


def audit_tests(case: Case) -> Validation | None:
    """Wrong states derived from the reference's outputs fail the tests (tasks/envs/audit.py): a survivor is
    `weak_tests` (with `synthesize.audit: flag`, recorded `flag` and kept); a fault of trajforge's audit code
    is `verifier_error`, never a keep or a drop."""
    env, v, settings = case.env, case.v, case.audit
    if settings.mode == "off":
        env.audit = TestAudit(status="off", reason="synthesize.audit: off")
        v.checks["test_audit"] = "skip"
        return None
    try:
        env.audit = run_audit(case.sb, env, case.test_timeout_s, settings.mutants,
                              first_survivor_ends=settings.mode == "reject", progress=settings.progress)
    except SandboxError:
        raise
    except Exception as err:  # trajforge's own fault: named, never a silent keep or drop
        return v.fail("test_audit", "verifier_error", f"the test audit failed: {type(err).__name__}: {err}")
    if env.audit.status == "skip":
        v.checks["test_audit"] = "skip"
    elif env.audit.survivors:
        if settings.mode == "flag":
            v.checks["test_audit"] = "flag"
            return None
        first = env.audit.survivors[0]
        more = len(env.audit.survivors) - 1
        return v.fail("test_audit", "weak_tests", describe(first) + (f" (+{more} more survivors)" if more else ""))


CHECKS: tuple[Check, ...] = (
    Check("noop_fails", ("noop_passes", "verifier_error"), noop_fails, fresh=True),
    Check("no_leak", ("tests_leaked", "solution_leaked"), no_leak, fresh=True),
    Check("kind", (), kind_checks, recorded=False),  # recorded under each kind check's own name (tools: `tools_serve`)
    Check("deterministic", ("nondeterministic_tests",), untouched_deterministic, oracle="absent"),
    Check("solution_passes", ("solution_fails", "tools_write_outside_store", "engine_managed_change", "verifier_error",
                              "noop_passes"),
          solution_passes,
          oracle="present"),
    Check("deterministic", ("nondeterministic_tests",), deterministic, oracle="present"),
    Check("instance_specific", ("not_instance_specific",), instance_specific, oracle="present"),
    Check("test_audit", ("weak_tests", "verifier_error"), audit_tests, oracle="present"),
)
"""The order of validation after the image builds (`image`, in `validate_env`); see the module docstring."""


def check_names() -> tuple[str, ...]:
    """Every name a validation may record, in order (the kinds' checks where `kind` runs)."""
    from .kinds import KINDS

    names = ["image"]
    for c in CHECKS:
        names += [k.name for kind in KINDS.values() for k in kind.checks] if not c.recorded else [c.name]
    return tuple(dict.fromkeys(names))


def _checks(client, env, v, sandbox, command_timeout_s, test_timeout_s, sibling, labels, audit) -> Validation:
    """Run `CHECKS` in order: the first that fails ends the validation."""
    def box() -> Sandbox:
        return Sandbox(client, env.image, sandbox, workdir=env.workdir, cap_add=VERIFIER_CAPS,
                       labels={"trajforge.role": "validate", **labels}, agent=env.agent_user)

    case = Case(env, v, box, command_timeout_s, test_timeout_s, sibling, audit)
    applies = [c for c in CHECKS if c.oracle in ("any", env.oracle)]
    with ExitStack() as stack:
        for check in CHECKS:
            if check not in applies:
                if check.name not in {c.name for c in applies}:
                    v.checks.setdefault(check.name, "skip")
                continue
            if check.fresh or case.sb is None:
                stack.close()
                case.sb = stack.enter_context(box())
            failed = check.run(case)
            if failed is not None:
                return failed
            if check.recorded:
                v.checks.setdefault(check.name, "pass")
    return v


def _without_oracle(sb: Sandbox, env: EnvSpec, v: Validation, noop, test_timeout_s: float) -> Validation:
    """The checks left when no reference solution exists: the untouched environment's per-test results
    are the same in a second fresh container."""
    again = run_hidden_tests(sb, env, test_timeout_s)
    if again.error or again.passed or again.outcome() != noop.outcome():
        return v.fail("deterministic", "nondeterministic_tests",
                      f"untouched environment: first run {noop.outcome()}, second run {again.outcome() or again.error}")
    v.checks.update(solution_passes="skip", deterministic="pass", instance_specific="skip")
    # no oracle to say what a solution changes: an agent may change the image's own files in the work dir
    # that cannot change how the tests run; anything else it changes is unexpected (counterfactual checks)
    found = sb.exec(f"find {shlex.quote(env.workdir)} -xdev -type f 2>/dev/null | head -n 2000", 60,
                    user="root", workdir="/", output_limit=1 << 20)
    env.expected_changes = sorted(p for p in found.output.splitlines()
                                  if p.startswith("/") and sensitive_class(p, env.workdir) is None)
    env.tests_run_agent_code = _exposure(sb, env)
    env.tests_leave_processes = noop.leftovers > 0 or again.leftovers > 0
    return v


def _exposure(sb: Sandbox, env: EnvSpec) -> str:
    """`EnvSpec.tests_run_agent_code` on the container's current (solved) state: its work dir's files with their
    executable bit, and what the reference solution changed elsewhere."""
    found = sb.exec(f"find {shlex.quote(env.workdir)} -xdev -type f -printf '%m %p\\0' 2>/dev/null", 60,
                    user="root", workdir="/", output_limit=4 << 20, readonly=True)
    solved = {}
    for entry in found.output.split("\0")[:DECISION_CAP]:
        mode, _, path = entry.strip("\n").partition(" ")
        if path.startswith("/") and mode.isdigit():
            solved[path] = bool(int(mode, 8) & 0o111)
    root = env.workdir.rstrip("/") + "/"
    elsewhere = [p for p in env.expected_changes if not p.startswith(root)]
    return start_code.mark(sb, env, tests_run_agent_code(env.tests, env.test_command, env.workdir, solved, elsewhere))


def profile_reference(client, env: EnvSpec, sandbox: SandboxConfig, command_timeout_s: float, test_timeout_s: float,
                      labels: dict | None = None) -> bool:
    """What the validator records of the reference solution (`EnvSpec.VALIDATED` fields: its change set, what its
    test run reports and leaves, whether the tests run agent code, the guarded run), for environments that did not
    go through the validator, in a fresh container of the built image. False (nothing recorded but the exposure of
    the untouched work dir) when the solution does not run cleanly, or there is none (`oracle: absent`)."""
    with Sandbox(client, env.image, sandbox, workdir=env.workdir, cap_add=VERIFIER_CAPS,
                 labels={"trajforge.role": "oracle", **(labels or {})}, agent=env.agent_user) as sb:
        def runs_cleanly(cmd: str) -> bool:
            res = sb.exec(cmd, command_timeout_s)
            return not res.timed_out and res.exit_code == 0

        if env.oracle == "absent" or not all(runs_cleanly(c) for c in env.solution):
            env.tests_run_agent_code = _exposure(sb, env)
            return False
        _record_changes(sb, env)
        _record_reference(sb, env, test_timeout_s)
        return True


def _record_reference(sb: Sandbox, env: EnvSpec, test_timeout_s: float, *runs: TestRun,
                      untouched: TestRun | None = None) -> None:
    """On the reference solution's state in `sb`: whether the tests run agent code, what their passing runs
    (`runs`, else one made here) report and leave, the reward files they and the `untouched` environment's run
    wrote, and the guarded run's outcome when the tests import agent code."""
    env.tests_run_agent_code = _exposure(sb, env)
    if not runs:
        runs = (_from_working_folder(sb, env, run_hidden_tests(sb, env, test_timeout_s, trace=True), test_timeout_s),)
    every = (*runs, *([untouched] if untouched else []))
    env.reward_files = sorted({f for r in every for f in r.reward_files})
    env.test_writes = None if any(r.wrote is None for r in every) else sorted(
        {p.lstrip("+") for r in every for p in r.wrote})
    env.test_reads = None if any(r.reads is None for r in runs) else sorted({p for r in runs for p, _ in r.reads})
    passing = [r for r in runs if r.passed]
    if passing:
        env.expected_tests = sorted(set.intersection(*({t.name for t in r.reported if t.passed} for r in passing)))
    env.tests_leave_processes = any(r.leftovers > 0 for r in runs)
    guarded = None
    if pytest_files(env) and env.tests_run_agent_code != "in_process" and _python_changed(env):
        # the tests' text names no module of the work dir, but the reference changed Python code: what the guarded
        # session really imports decides (a src layout, a package installed elsewhere)
        guarded = run_guarded(sb, env, guard_timeout(env, test_timeout_s), agent_dirs(env.expected_changes, env.workdir))
        if any(_changed_by_reference(f, env) for f in guarded.loaded):
            env.tests_run_agent_code = "in_process"
    if guardable(env):  # the tests import agent code: what trajforge's guarded run shows on the reference
        # (the import trace's session is that run when it made the environment `in_process`)
        guarded = guarded or run_guarded(sb, env, guard_timeout(env, test_timeout_s),
                                         agent_dirs(env.expected_changes, env.workdir))
        # the reference's own run replacing what assertions run through (a test suite that patches TestCase): every
        # pass would be flagged for it, so the guard asks nothing of this environment
        patching = any(e.startswith("replaced ") for e in guarded.audit)
        env.guard_tests = guarded.good() if not (guarded.error or patching) else []
        env.guard_types = guarded.types()
        env.guard_reads = sorted(guarded.reads)
        env.guard_audit = sorted(k for k in guarded.audit if not k.startswith("replaced "))
        env.guard_modules = None if guarded.error else sorted(set(guarded.modules))
    scripted = None
    if may_run_scripts(env) and env.tests_run_agent_code != "in_process" and _python_changed(env):
        # (the same question for test scripts: what the guarded script run's processes really loaded)
        scripted = run_script_guard(sb, env, guard_timeout(env, test_timeout_s),
                                    agent_dirs(env.expected_changes, env.workdir))
        if any(_changed_by_reference(f, env) for f in scripted.as_guard_run().loaded):
            env.tests_run_agent_code = "in_process"
    if script_guardable(env):  # the tests' scripts import agent code: how each ends under the guard on the reference
        scripted = scripted or run_script_guard(sb, env, guard_timeout(env, test_timeout_s),
                                                agent_dirs(env.expected_changes, env.workdir))
        seen = scripted.as_guard_run()
        env.guard_scripts = scripted.passing() if not scripted.error else []
        env.guard_types = sorted(set(env.guard_types) | set(seen.types()))
        env.guard_reads = sorted(set(env.guard_reads) | set(seen.reads))
        env.guard_audit = sorted(set(env.guard_audit) | {k for k in seen.audit if not k.startswith("replaced ")})
        if scripted.error:
            env.guard_modules = None
        elif seen.modules:
            env.guard_modules = sorted(set(env.guard_modules or []) | set(seen.modules))


def _python_changed(env: EnvSpec) -> bool:
    """Whether the reference solution changed or added Python code anywhere (a source, byte code, an extension
    module, a `.pth`)."""
    return any(p.endswith((".py", ".pyc", ".so", ".pth")) for p in env.expected_changes)


def _changed_by_reference(path: str, env: EnvSpec) -> bool:
    """Whether a module file the tests loaded is agent code: in the work dir, or changed by the reference."""
    return inside(path, env.workdir) or any(inside(path, p) for p in env.expected_changes)


# ------------------------------------------------------------------------------------------------
# trajforge's own files, the same in every environment of a kind: they say nothing about the environment
SHARED_FILES = frozenset({".tools/server.py"})


def shingles(env: EnvSpec, k: int = 5) -> set[str]:
    """Word 5-grams of the instruction and the work files (what a near-duplicate shares), without
    `SHARED_FILES`."""
    words = " ".join([env.instruction, *(f"{f.path} {f.content}" for f in env.files if f.path not in SHARED_FILES),
                      *env.setup]).split()
    return {" ".join(words[i:i + k]) for i in range(max(1, len(words) - k + 1))}


def dedup(envs: list[EnvSpec], threshold: float, num_perm: int = 128) -> dict[str, str]:
    """{env_id: id of the earlier environment it nearly duplicates} for MinHash-estimated Jaccard
    similarity >= threshold (datasketch's LSH; `envs` order decides which one is kept)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    dups: dict[str, str] = {}
    for env in envs:
        m = MinHash(num_perm=num_perm, seed=1)
        for s in shingles(env):
            m.update(s.encode())
        hits = lsh.query(m)
        if hits:
            dups[env.env_id] = sorted(hits)[0]
        else:
            lsh.insert(env.env_id, m)
    return dups
