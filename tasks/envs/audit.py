"""The test audit: attack an environment's hidden tests with wrong states before it is admitted.

On the reference solution's solved container (the validator's, after every other check), each *output* is
mutated (`mutants.MUTATORS`, in registry order, round-robin over the outputs, at most `budget` run), the
hidden tests run on that state the way the validator runs them (`run_hidden_tests`), and the file is put
back as the reference left it. A mutant the tests pass is a survivor: evidence of weak tests.

Outputs: files the reference solution changed (`EnvSpec.expected_changes`) inside the work dir that the
instruction or the tests name (by path relative to the work dir, or by file name), outside `.git/` and
`__pycache__/`. A file nobody names (a scratch file, a helper the reference ran once) is no answer: a
mutant of it would "survive" without saying anything about the tests. A named output outside the work
dir, or whose name is not UTF-8, is a `not_built` mutant with that cause; binary or huge outputs are only
emptied or deleted.

Why one container for every mutant is sound: the validator's `deterministic` check ran the tests twice on
the solved state with the same per-test results, so a test run leaves nothing that changes the next; each
mutant is undone (the original file's tar, owner and mode included, put back by the engine) before another
file is mutated. Cost: where the tests never run agent code (`tests_run_agent_code: no`) no agent process
can exist between runs, so the kill that precedes a test run is skipped (`Sandbox.settled`). A test run that hangs or crashes on a mutant kills it (the cause is recorded). A Docker failure is
`SandboxError` (the validator's `validation_infra`, retried); any other exception here is trajforge's
fault: the validator rejects `verifier_error`, never keeping or dropping the environment silently.
"""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
import time
from dataclasses import dataclass
from typing import Callable

from ...schemas.environment import EnvSpec, Mutant, TestAudit
from ..judge.verifier import TestRun, run_hidden_tests
from ..sandbox import Sandbox
from ..sandbox.errors import FinalStateUnavailable
from .mutants import DELETE, MAX_TEXT, MUTATORS, Inputs, equivalent, output_class

SKIP_PARTS = (".git", "__pycache__")
MODES = ("reject", "flag", "off")
DEFAULT_MUTANTS = 4


@dataclass(frozen=True)
class AuditSettings:
    """`synthesize.audit` and `synthesize.audit_mutants`: what a survivor does (`reject`: `weak_tests`;
    `flag`: kept, marked in `EnvSpec.audit`; `off`: no audit) and how many mutants run at most."""

    mode: str = "reject"
    mutants: int = DEFAULT_MUTANTS
    progress: Callable[[Mutant], None] | None = None  # called after each mutant (`trajforge envs audit`)


@dataclass
class Output:
    path: str
    rel: str
    tar: bytes  # get_archive of it: one member, owner and mode as the reference left them
    content: bytes
    cls: str


def _named(rel: str, env: EnvSpec) -> bool:
    text = env.instruction + "\n".join(t.content for t in env.tests)
    base = posixpath.basename(rel)
    return rel in text or (len(base) > 2 and base in text)


def outputs(sb: Sandbox, env: EnvSpec) -> tuple[list[Output], list[Mutant]]:
    """The reference solution's outputs in `sb` (see the module docstring) and the mutants that cannot be built."""
    root = env.workdir.rstrip("/") + "/"
    found, unbuilt = [], []
    for path in env.expected_changes:
        inside = path.startswith(root)
        rel = path[len(root):] if inside else path
        if any(part in SKIP_PARTS or part.endswith(".pyc") for part in rel.split("/")) or not _named(rel, env):
            continue
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            unbuilt.append(Mutant(mutator="*", path=path.encode("utf-8", "replace").decode(), what="any mutant",
                                  outcome="not_built", cause="the file name is not UTF-8"))
            continue
        if not inside:
            unbuilt.append(Mutant(mutator="*", path=path, what="any mutant", outcome="not_built",
                                  cause="outside the work dir (the audit mutates the work dir's outputs only)"))
            continue
        try:
            tar = sb.get_archive(path, MAX_TEXT * 4)
        except FinalStateUnavailable as err:
            unbuilt.append(Mutant(mutator="*", path=path, what="any mutant", outcome="not_built",
                                  cause=f"unreadable: {str(err)[:200]}"))
            continue
        except Exception:  # gone (the reference deleted it) or not a file: nothing to mutate
            continue
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            member = t.next()
            if member is None or not member.isfile():
                continue
            content = t.extractfile(member).read()
        found.append(Output(path, rel, tar, content, output_class(path, content, env.instruction)))
    return found, unbuilt


def _with_content(tar: bytes, content: bytes, serial: int) -> bytes:
    """`tar`'s one member with `content` instead (same name, owner, mode), its mtime moved on by `serial`
    seconds so no bytecode cached from another version of it (`__pycache__`, keyed by mtime and size) is
    taken for this one."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        member = t.next()
    member.size = len(content)
    member.mtime = int(time.time()) + 1 + serial
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        out.addfile(member, io.BytesIO(content))
    return buf.getvalue()


def _change(before: str, after) -> str:
    if after is DELETE:
        return "deleted"
    a, b = before.splitlines(), after.splitlines()
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else "<none>"), (b[i] if i < len(b) else "<none>")
        if x != y:
            return f"line {i + 1}: {x[:80]!r} -> {y[:80]!r}"
    return "trailing whitespace"


def candidates(found: list[Output], env: EnvSpec) -> list[tuple[str, Output, object, str]]:
    """(mutator, output, mutated content or DELETE, equivalence reason or '') in attack order: mutator-major,
    so a small budget still tries the strongest mutators on every output."""
    root = env.workdir.rstrip("/") + "/"
    outs = {o.path for o in found}
    texts = {}
    for f in env.files:  # the untouched text inputs (what `inputs_echoed` copies)
        if root + f.path not in outs:
            texts[f.path] = f.content
    inputs = Inputs(env.instruction, texts)
    made = []
    for m in MUTATORS.values():
        for o in found:
            if o.cls not in m.applies_to:
                continue
            text = o.content.decode("utf-8") if o.cls != "binary" else ""
            mutated = m.make(o.rel, text, inputs)
            if mutated is None:
                continue
            why = "" if mutated is DELETE or o.cls == "binary" else (equivalent(m.name, text, mutated, inputs) or "")
            made.append((m.name, o, mutated, why))
    return made


def audit(sb: Sandbox, env: EnvSpec, test_timeout_s: float, budget: int, first_survivor_ends: bool = False,
          progress: Callable[[Mutant], None] | None = None) -> TestAudit:
    """Run at most `budget` mutants of the reference's outputs in `sb` (its solved container) against the hidden
    tests; `first_survivor_ends`: stop at the first survivor (a reject needs one). `progress(mutant)` is called
    after each (for the CLI). Each output is put back as the reference left it before another file is
    mutated, and at the end. Raises SandboxError on Docker failures."""
    t0 = time.monotonic()
    if env.oracle == "absent":
        return TestAudit(status="skip", reason="no reference solution")
    found, mutants = outputs(sb, env)
    if not found:
        why = ("its outputs cannot be mutated (see the not_built mutants)" if mutants else
               "the reference solution wrote no file the instruction or tests name")
        return TestAudit(status="skip", reason=why, mutants=mutants, seconds=round(time.monotonic() - t0, 3))
    tried = runs = 0
    # tests that never run agent code leave no agent process: the validator's test runs killed every one, and
    # only trajforge's own commands run here, so the kill before each test run is skipped (`settled`)
    quiet = env.tests_run_agent_code == "no"
    dirty: Output | None = None  # the output a mutant changed (the next mutant of the same file overwrites it)
    try:
        for name, o, mutated, why in candidates(found, env):
            m = MUTATORS[name]
            text = o.content.decode("utf-8", "replace") if o.cls != "binary" else ""
            what = f"{m.what}: {_change(text, mutated) if o.cls != 'binary' else 'binary content'}"
            if why:
                mutants.append(Mutant(mutator=name, path=o.path, what=what, outcome="equivalent", cause=why))
            elif tried >= budget or (first_survivor_ends and any(x.outcome == "survived" for x in mutants)):
                break
            else:
                tried += 1
                if dirty is not None and dirty is not o:
                    sb.put_archive(posixpath.dirname(dirty.path), dirty.tar)
                dirty = o
                if mutated is DELETE:
                    sb.exec(f"rm -f -- {shlex.quote(o.path)}", 30, workdir="/")  # as the work dir's owner
                else:
                    data = mutated if isinstance(mutated, bytes) else mutated.encode("utf-8")
                    sb.put_archive(posixpath.dirname(o.path), _with_content(o.tar, data, tried))
                if quiet:
                    sb.settled = True
                run = run_hidden_tests(sb, env, test_timeout_s)
                runs += 1
                mutants.append(_judged(name, o.path, what, run))
            if progress:
                progress(mutants[-1])
    finally:
        sb.settled = False
        if dirty is not None:
            sb.put_archive(posixpath.dirname(dirty.path), dirty.tar)
    survivors = [m for m in mutants if m.outcome == "survived"]
    killed = sum(m.outcome == "killed" for m in mutants)
    return TestAudit(status="weak" if survivors else "strong", tried=tried, killed=killed, survivors=survivors,
                     mutants=mutants, test_runs=runs, seconds=round(time.monotonic() - t0, 3))


def _judged(name: str, path: str, what: str, run: TestRun) -> Mutant:
    """A mutant's outcome from its test run: any run that is not a pass (failed tests, a crash, a hang) kills it."""
    if run.passed:
        return Mutant(mutator=name, path=path, what=what, outcome="survived",
                      cause=f"every test passed ({', '.join(r.name for r in run.results)[:300]}); "
                            f"output: {run.output[-400:].strip()}")
    failed = [f"{r.name}: {r.message[:160]}" for r in run.results if not r.passed]
    cause = run.error or run.fallback or ("; ".join(failed) if failed else f"the test command exited {run.exit_code}")
    return Mutant(mutator=name, path=path, what=what, outcome="killed", cause=cause[:500])


def describe(m: Mutant) -> str:
    """One survivor as a reject's detail names it."""
    return f"mutant `{m.mutator}` of {m.path} survived ({m.what}); {m.cause}"
