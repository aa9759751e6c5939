"""A repository task item (`plan.items`) made an environment, or rejected with its reason (issue 43).

The task's starting state is the commit's parent (commit tasks) or the tree with the bugs planted (planted-bug
tasks); its reference solution is the commit's code diff or the bugs' inverse patch, applied with `git apply`;
its hidden tests are the project's test files at the solved revision, put back in the work dir by `test.sh`, and
`grade.py` runs the fail-to-pass and pass-to-pass lists with the project's own test command: the reward is
SWE-style (all of them pass), with per-test results.

Reasons (the first that applies): `repo_unusable` (the revision cannot be read, the tree is no testable Python
project), `binary_test_file`, `image_build_failed` (`[cause] log tail`: a dependency that cannot install is
`package_not_found` or `build_step_failed`), `solution_fails` (the reference does not apply), `tests_do_not_run`
(the solved state runs no test: the output's tail), `tests_hang` (the suite on the starting state runs past
`probe.hang_budget` of the solved state's own suite time: a busy machine slows both, so it is never read as a
hang; a solved state's suite past `test_timeout_s` is `probe.SuiteTooSlow`, infrastructure), `flaky_suite`,
`does_not_import` (a planted bug breaks the import of test modules that import after the fix), `no_fail_to_pass`
(a commit whose tests never fail before it), `bug_not_seen` (a planted bug no test sees). Docker failing raises `SandboxError` (infrastructure: the caller's).

Cost: a commit task's probe runs the suite three times (before, and twice after its diff); the planted bugs of one
revision share the two runs of the revision itself (`solved_runs`, built as its own image once), so each bug's probe
runs the suite once and checks that its inverse patch gave back the revision's files, byte for byte.

Invariants: the instruction is written from the commit's message, the changed code files' names, its change notes
and the signatures and docstrings it adds or alters (`api.py`), and the failing tests' names and first error lines,
never from the tests' code; the env id hashes the environment's content. Rows
name where they come from: `source` is `repo:<repository>@<revision>`, `family` `repo:commit` or
`repo:planted_bug`, and `knobs_json` holds both with the lists' sizes and the planted bugs.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from ....schemas.common import FileSpec, Reject
from ....schemas.config import RepoSourceConfig, SandboxConfig, safe_name
from ....schemas.environment import DEFAULT_WORKDIR, EnvSpec
from ...sandbox.checksums import file_digest
from ..images import BuildOptions, ImageBuildError, ensure_image
from ..tools.layer import lock_text, pip_wheel, wheelhouse
from . import testlists
from .api import change_notes, interface
from .bugs import BugPlantingError, combine, inverse_patch, plant
from .fetch import repository_path
from .history import RepositoryError, checkout, open_repository, scan
from .image import import_names, recipe, split, src_layout
from .issue import tests_to_pass, write_issue
from .probe import HANG_FACTOR, HANG_FLOOR_S, Run, check_hang, hang_budget, probe
from .project import ProjectError, detect, test_command

HERE = Path(__file__).parent
REPORT = "@REPORT@"
SHOWN_TESTS = 10  # failing tests named in an instruction


def solution(patch: str) -> list[str]:
    """The reference solution: one command applying `patch` in the work dir (a quoted here-document)."""
    marker = "TF_PATCH_" + hashlib.sha256(patch.encode()).hexdigest()[:12]
    return [f"git apply --whitespace=nowarn - <<'{marker}'\n{patch.rstrip(chr(10))}\n{marker}"]


def hidden_tests(tests: dict[str, bytes], spec: dict[str, Any], workdir: str) -> list[FileSpec] | None:
    """The verifier's files: the test files (`tree/`), the grader, its `testlists.py`, `lists.json`, `test.sh`;
    None when a test file is not UTF-8 text (it could not travel as a hidden test)."""
    files = []
    for rel, data in tests.items():
        try:
            files.append(FileSpec(path=f"tree/{rel}", content=data.decode("utf-8")))
        except UnicodeDecodeError:
            return None
    script = ("#!/bin/bash\n# trajforge repository task: the listed tests (test files in /tests/tree, the project's "
              f"code from {workdir}), graded SWE-style into /logs/verifier/reward.json\n"
              "exec /usr/bin/python3 -I /tests/grade.py reward\n")
    return files + [FileSpec(path="grade.py", content=(HERE / "grade.py").read_text()),
                    FileSpec(path="testlists.py", content=(HERE / "testlists.py").read_text()),
                    FileSpec(path="lists.json", content=json.dumps(spec, indent=1, sort_keys=True) + "\n"),
                    FileSpec(path="test.sh", content=script, mode=0o755)]


def code_patch(diff: str, code: dict[str, bytes]) -> str:
    """The part of a commit's `diff` that is the project's code: the files of its top-level packages (package data
    too) and its top-level modules (`image.import_names` of `code`, the solved tree's code files); its docs
    (`docs/conf.py` too), CI files, metadata and build scripts are left out of the reference solution (a release diff
    carries them: no test sees them, and the test audit rejects such a task's tests as weak: 6 of swe.yaml's 12 commit
    tasks)."""
    src = src_layout(code)
    names = set(import_names(code, src))
    kept = []
    for block in re.split(r"(?m)^(?=diff --git )", diff):
        m = re.match(r"diff --git a/(.*) b/(.*)\n", block)
        if not m:
            continue
        parts = PurePosixPath(m.group(2)).parts
        if src and len(parts) > 1 and parts[0] == "src":
            parts = parts[1:]
        name = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else parts[0] if len(parts) > 1 else ""
        if name in names:  # a file of a top-level package, or a top-level module
            kept.append(block)
    return "".join(kept)


_SOLVED_RUNS: dict[tuple[str, str, float], list[Run]] = {}
_SOLVED_LOCK = threading.Lock()


def solved_runs(client, image: str, sandbox: SandboxConfig, workdir: str, tests: list[FileSpec], timeout_s: float,
                labels: dict[str, str] | None) -> list[Run]:
    """The suite twice on a revision's own tree (`image`, no solution to apply): the "after" runs of every bug
    planted in it, made once per process and image (the hidden files' digest is in the key: the lists are not yet
    in them, the tests are)."""
    digest = hashlib.sha256(json.dumps([[f.path, f.content] for f in tests if f.path != "lists.json"]).encode())
    key = (image, digest.hexdigest(), timeout_s)
    with _SOLVED_LOCK:  # one probe of a revision at a time (a shard's items run one after another anyway)
        if key not in _SOLVED_RUNS:
            first = probe(client, image, sandbox, workdir, tests, [], timeout_s, labels, repeats=1)  # SuiteTooSlow
            if len(_SOLVED_RUNS) > 16:
                _SOLVED_RUNS.clear()
            _SOLVED_RUNS[key] = [first.before, *first.after]
        return _SOLVED_RUNS[key]


def _failing(before: dict[str, str], messages: dict[str, str], f2p: tuple[str, ...]) -> str:
    lines = [f"- `{t}`: {messages.get(t) or before.get(t, 'not collected')}" for t in f2p[:SHOWN_TESTS]]
    more = f"\n- ... and {len(f2p) - SHOWN_TESTS} more" if len(f2p) > SHOWN_TESTS else ""
    return "\n".join(lines) + more


def instruction(task: dict[str, Any], name: str, workdir: str, failing: str) -> str:
    """What the agent reads: the change asked for (the commit's message and files, its change notes and the
    interface it adds or alters: `api.py`; or a bug report) and the tests that fail, with their first error lines."""
    if task["kind"] == "commit":
        head = (f"The Python project `{name}` in {workdir} needs a change: {task['subject'].strip()}"
                + (f"\n\n{task['body'].strip()}" if task["body"].strip() else "")
                + f"\n\nThe change belongs in: {', '.join(task['files'])}."
                + (f"\n\nThe project's change notes for it:\n\n{task['notes']}" if task.get("notes") else "")
                + ("\n\nThe interface it adds or alters, as its documentation states it (signatures and "
                   f"docstrings):\n\n```python\n{task['interface']}\n```" if task.get("interface") else ""))
    else:
        head = (f"The Python project `{name}` in {workdir} has a bug: some of its tests fail. Find it and fix it in "
                "the project's code.")
    return f"{head}\n\n{tests_to_pass(failing)}"


def make_env(client, index: int, cfg: RepoSourceConfig, item: dict[str, Any], sandbox: SandboxConfig,
             options: BuildOptions, aliases: dict[str, str], log_sink: Callable[[str, str], None] | None = None,
             labels: dict[str, str] | None = None, make_teacher: Callable[[], Any] | None = None) -> EnvSpec | Reject:
    """The environment of one item, or the reject saying why there is none (see the module's reasons). With
    `make_teacher` (a teacher client factory) and `cfg.issue_text == "teacher"`, the instruction is the teacher's
    issue text when it passes `issue.write_issue`'s checks."""
    key = f"repo:{cfg.label}:{item['task']}:{item.get('sha') or item['rev'][:12] + ':' + json.dumps(item['plants'])}"
    workdir = DEFAULT_WORKDIR
    with tempfile.TemporaryDirectory(prefix="trajforge-repo-") as tmp:
        try:
            repo = open_repository(repository_path(cfg.path, cfg.pypi, cfg.versions))
            if item["task"] == "commit":
                kept, skipped = scan(repo, f"{item['sha']}^!", max_code_lines=cfg.max_code_lines)
                if not kept:
                    return Reject(key=key, reason="repo_unusable", detail=f"not a candidate: {skipped[0].reason}")
                c = kept[0]
                solved, start = checkout(repo, c.sha, Path(tmp) / "solved"), checkout(repo, c.parent, Path(tmp) / "p")
                solved_code, tests = split(solved)
                patch, revision = code_patch(c.code_diff, solved_code), c.sha
                if not patch.strip():
                    return Reject(key=key, reason="repo_unusable",
                                  detail="not a candidate: the commit changes no file of the project's code")
                code, _ = split(start)
                py = [f.path for f in c.code_files if f.path.endswith(".py")]
                task = {"kind": "commit", "subject": c.subject, "body": c.body, "files": py,
                        "notes": change_notes(c.code_diff),
                        "interface": interface({rel: code.get(rel) for rel in py},
                                               {rel: solved_code[rel] for rel in py if rel in solved_code})}
            else:
                solved, revision = checkout(repo, item["rev"], Path(tmp) / "solved"), item["rev"]
                chosen = []
                for path, i in item["plants"]:
                    chosen.append(plant((solved / path).read_bytes().decode("utf-8").lstrip("\ufeff"), path)[i])
                bug = combine(chosen) if len(chosen) > 1 else chosen[0]
                patch = inverse_patch(bug)
                task = {"kind": "planted_bug", "bugs": [p.description for p in chosen]}
                code, tests = split(solved)
                clean = dict(code)  # the solved state: what the inverse patch gives back
                for change in bug.changes:
                    code[change.path] = change.mutated.encode("utf-8")
                    clean[change.path] = change.original.encode("utf-8")
                restores = {c.path: file_digest(clean[c.path]) for c in bug.changes}
            project = detect(solved, cfg.project or None)
        except (RepositoryError, ProjectError, BugPlantingError, OSError, UnicodeDecodeError, IndexError) as e:
            return Reject(key=key, reason="repo_unusable", detail=str(e)[:1500])
        lock = lock_text()
        wheel = pip_wheel(lock)
        pip = (wheelhouse(lock) / wheel).read_bytes()
        dockerfile, context, blobs = recipe(sandbox.base_image, workdir, project, solved, code, pip, wheel,
                                            "install" in cfg.project)
        solved_recipe = recipe(sandbox.base_image, workdir, project, solved, clean, pip, wheel,
                               "install" in cfg.project) if item["task"] == "planted_bug" else None
    prefix = test_command(project, REPORT, ["x"], python="python3")[:-1]
    spec: dict[str, Any] = {"command": prefix, "paths": list(project.test_paths), "timeout_s": cfg.test_timeout_s,
                            "workdir": workdir, "fail_to_pass": [], "pass_to_pass": []}
    files = hidden_tests(tests, spec, workdir)
    if files is None:
        return Reject(key=key, reason="binary_test_file", detail="a test file is not UTF-8 text")
    name = project.name or cfg.label
    env = EnvSpec(env_id="pending", family=f"repo:{safe_name(cfg.label)}", level=len(item.get("plants", [])) or 2,
                  seed=cfg.seed, source="repo", instruction="(probe)", dockerfile=dockerfile, context=context,
                  blobs=blobs, workdir=workdir, tests=files, verifier="script", test_command="bash /tests/test.sh",
                  solution=solution(patch), agent_user="agent", test_timeout_s=min(cfg.test_timeout_s, 3600))
    try:
        env.image, _ = ensure_image(client, sandbox.base_image, env, aliases, limits=sandbox, options=options,
                                    log_sink=log_sink)
    except ImageBuildError as err:
        return Reject(key=key, reason="image_build_failed", detail=f"[{err.cause}] {err.log_tail[-1500:]}")
    if solved_recipe is None:
        seen = probe(client, env.image, sandbox, workdir, files, env.solution, cfg.test_timeout_s, labels)
        after = seen.after
        check_hang(seen.before, after, cfg.test_timeout_s)
    else:  # the revision's own suite runs (shared by its bugs), then this bug's starting state and its inverse patch
        solved_env = env.model_copy(update=dict(zip(("dockerfile", "context", "blobs"), solved_recipe)))
        try:
            solved_image, _ = ensure_image(client, sandbox.base_image, solved_env, aliases, limits=sandbox,
                                           options=options, log_sink=log_sink)
        except ImageBuildError as err:
            return Reject(key=key, reason="image_build_failed", detail=f"[{err.cause}] {err.log_tail[-1500:]}")
        after = solved_runs(client, solved_image, sandbox, workdir, files, cfg.test_timeout_s, labels)
        seen = probe(client, env.image, sandbox, workdir, files, env.solution, cfg.test_timeout_s, labels, repeats=0,
                     restores=restores,
                     before_timeout_s=hang_budget(max(r.seconds for r in after), cfg.test_timeout_s))
    if seen.solution_error:
        return Reject(key=key, reason="solution_fails", detail=seen.solution_error)
    if seen.before.error == "timed out":  # e.g. a planted bug that makes a test loop forever
        clean = max(r.seconds for r in after)
        return Reject(key=key, reason="tests_hang", detail=(
            f"before the reference solution: timed out after {seen.before.budget_s:g}s (the hang budget: "
            f"{HANG_FACTOR}x the solved state's own {clean:.1f}s suite, at least {HANG_FLOOR_S:g}s, at most "
            f"test_timeout_s={cfg.test_timeout_s:g}s): {seen.before.tail[-1200:]}"))
    if seen.before.error:  # the grader printed no result: no outcome to compare with
        return Reject(key=key, reason="tests_do_not_run",
                      detail=f"before the reference solution: {seen.before.error}: {seen.before.tail[-1500:]}")
    if any(r.error for r in after) or not any(o == "passed" for o in after[0].outcomes.values()):
        bad = next((r for r in after if r.error), after[0])
        return Reject(key=key, reason="tests_do_not_run", detail=f"{bad.error or 'no test passed'}: {bad.tail[-1500:]}")
    flaky = testlists.flaky([r.outcomes for r in after])
    lists = testlists.lists(seen.before.outcomes, after[0].outcomes, cfg.pass_to_pass_cap, cfg.seed, flaky=flaky)
    reason = testlists.rejection(lists, cfg.max_flaky_share)
    broken = [t for t, o in seen.before.outcomes.items() if "::" not in t and o == "error"
              and any(n.startswith(t + "::") for n in after[0].outcomes)]
    if reason is None and task["kind"] == "planted_bug" and broken:
        reason = "does_not_import"
    if reason == "no_fail_to_pass" and task["kind"] == "planted_bug":
        reason = "bug_not_seen"
    if reason is not None:
        return Reject(key=key, reason=reason, detail=f"{len(lists.fail_to_pass)} fail-to-pass, {len(lists.flaky)} "
                                                     f"flaky of {lists.seen}; {'; '.join(task.get('bugs', []))}"[:1500])
    spec.update(fail_to_pass=list(lists.fail_to_pass), pass_to_pass=list(lists.pass_to_pass))
    knobs = {"repo": cfg.label, "revision": revision, "task_kind": task["kind"], "fail_to_pass": len(lists.fail_to_pass),
             "pass_to_pass": len(lists.pass_to_pass), **({"bugs": task["bugs"]} if "bugs" in task else {})}
    failing = _failing(seen.before.outcomes, seen.before.messages, lists.fail_to_pass)
    text = instruction(task, name, workdir, failing)
    if cfg.issue_text == "teacher" and make_teacher is not None:
        issue, knobs["issue_text"] = write_issue(make_teacher, task, name, failing, patch, tests, code,
                                                 int(hashlib.sha256(key.encode()).hexdigest()[:6], 16))
        if issue is not None:
            text = f"{issue}\n\n{tests_to_pass(failing)}"
    env = env.model_copy(update={
        "source": f"repo:{safe_name(cfg.label)}@{revision[:12]}", "family": f"repo:{task['kind']}",
        "tests": hidden_tests(tests, spec, workdir), "knobs_json": json.dumps(knobs, sort_keys=True),
        "instruction": text})
    env.env_id = f"repo-{safe_name(cfg.label)}-{task['kind'].replace('_', '-')}-{env.content_hash()[:16]}"
    return env
