"""A repository task's instruction as an issue text the teacher writes (issue 43, `synthesize.repos[].issue_text:
teacher`): the change (or the bug's symptoms) described as a user reports it on an issue tracker.

The teacher reads what the commit-written instruction is made of (the message, the change notes, the interface the
change adds or alters, the failing tests' names and first error lines; for a planted bug, the failing tests and
their errors only) and never the reference diff's body or a test file. Its text is then checked: a reply that is
empty, too short or too long, or that contains a line of the reference solution or a line found only in the hidden
test files (`leak`) is not used, and the task keeps its commit-written instruction (the reason is recorded in the
row's `knobs_json`: `issue_text`). A teacher error is the same fallback, never a reject: the task is still a task.

The agent's instruction is the issue text, then the failing tests' list (names and first error lines, as every
repository task has it).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

SYSTEM = ("You write issue reports for a Python project's issue tracker, as a user or maintainer would: what is wrong "
          "or wanted, in prose and small usage examples. Reply with the issue text only (a title line, then the body).")
PROMPT = """Project: {name}
{what}

Failing tests (names and first error lines):
{failing}

Write the issue that asks for this change. Describe the behaviour wanted and, for a defect, how it shows; small usage
examples are welcome. Do not write the fix, do not quote code of the project's tests, do not name line numbers."""
MIN_CHARS, MAX_CHARS = 60, 6000
MIN_LEAK_LINE = 12  # shorter lines (`return x`, `pass`, `else:`) are too common to count as a copy


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if len(line.strip()) >= MIN_LEAK_LINE}


def leak(text: str, patch: str, tests: dict[str, bytes], code: dict[str, bytes], shown: str = "") -> str | None:
    """Why `text` may not be the instruction (it contains, anywhere, a line the reference solution adds or a line
    that only the hidden test files have: at least `MIN_LEAK_LINE` characters), or None. Lines the teacher was
    `shown` (the prompt: signatures and docstrings are added lines too) are not copies."""
    added = _lines("\n".join(line[1:] for line in patch.splitlines()
                             if line.startswith("+") and not line.startswith("+++"))) - _lines(shown)
    in_code = set().union(*(_lines(b.decode("utf-8", "replace")) for b in code.values())) if code else set()
    test_only = set().union(*(_lines(b.decode("utf-8", "replace")) for b in tests.values())) - in_code if tests else set()
    flat = " ".join(text.split())
    for what, lines in (("the reference solution", added), ("the hidden tests", test_only)):
        for line in sorted(lines):
            if " ".join(line.split()) in flat:  # anywhere in the text, whatever the spacing around it
                return f"it copies a line of {what}: {line[:120]!r}"
    return None


def prompt(task: dict[str, Any], name: str, failing: str) -> str:
    """What the teacher reads of a task (never the diff's body, never a test file)."""
    if task["kind"] == "commit":
        what = (f"Change: {task['subject'].strip()}" + (f"\n{task['body'].strip()}" if task["body"].strip() else "")
                + f"\nFiles it touches: {', '.join(task['files'])}"
                + (f"\n\nChange notes:\n{task['notes']}" if task.get("notes") else "")
                + (f"\n\nInterface added or altered (signatures and docstrings):\n{task['interface']}"
                   if task.get("interface") else ""))
    else:
        what = "A defect: the tests below fail on the project's current code."
    return PROMPT.format(name=name, what=what, failing=failing)


async def _write(make_teacher: Callable[[], Any], text: str, index: int) -> tuple[str | None, str | None]:
    from ..synthesis.reply import ask

    teacher = make_teacher()
    try:
        return await ask(teacher, SYSTEM, text, index, f"repo-issue-{index}")
    finally:
        await teacher.aclose()


def write_issue(make_teacher: Callable[[], Any], task: dict[str, Any], name: str, failing: str, patch: str,
                tests: dict[str, bytes], code: dict[str, bytes], index: int = 0) -> tuple[str | None, str]:
    """(the teacher's issue text, "written") or (None, why the commit-written instruction stays); `make_teacher`
    gives a new teacher client (closed after the one request)."""
    asked = prompt(task, name, failing)
    try:
        reply, error = asyncio.run(_write(make_teacher, asked, index))
    except Exception as err:  # a teacher that cannot even be made: the task keeps its own instruction
        return None, f"teacher_error: {type(err).__name__}: {err}"[:300]
    if error is not None:
        return None, f"teacher_error: {error}"[:300]
    reply = (reply or "").strip()
    if not MIN_CHARS <= len(reply) <= MAX_CHARS:
        return None, f"issue text of {len(reply)} characters (wanted {MIN_CHARS} to {MAX_CHARS})"
    why = leak(reply, patch, tests, code, shown=asked)
    if why:
        return None, why
    return reply, "written"


def tests_to_pass(failing: str) -> str:
    """The end of every repository task's instruction: the failing tests (names, first error lines) and the rules."""
    return ("These tests fail now and must pass (the project's test files are not in the work dir: they are run "
            f"after you finish, with the project's own test command):\n{failing}\n\n"
            "Every test that passes now must keep passing. Do not edit test files.")
