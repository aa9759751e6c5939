"""A rollout: one agent episode in one environment, stored linearly exactly as produced."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from .common import ChangeSet, Measured, Record, Seconds, Status, TarMark
from .verdict import TestResult

TOOLS_HARNESS = "trajforge-mcp-v1"  # Rollout.harness of `tools` environments: its steps are tool calls, not shell
BASH_HARNESS = "trajforge-bash-v1"  # Rollout.harness of `terminal` environments by default: `bash` + `submit`
SWE_HARNESS = "trajforge-swe-v1"  # `bash` + `str_replace_editor` + `submit` (tasks/agent/harnesses/swe.py)
TERMINAL_HARNESS = "trajforge-terminal-v1"  # `send_keys` (tmux) + `submit` (tasks/agent/harnesses/terminal.py)
EDITOR_STEP = re.compile(r'\A# str_replace_editor (?P<command>view|create|str_replace|insert|undo_edit) '
                         r'(?P<path>"(?:[^"\\\n]|\\.)*")\n')
"""The first line of a `Step.command` that ran one `str_replace_editor` call (harness `trajforge-swe-v1`): a shell
comment naming the editor command and its path (a JSON string); the rest of the step is the program that ran it."""
# the harness names `rollout.harnesses` accepts: filled by registration (tasks/agent/harnesses), the built-in ones here
HARNESS_NAMES: set[str] = {BASH_HARNESS, TOOLS_HARNESS, SWE_HARNESS, TERMINAL_HARNESS}


class FunctionCall(Record):
    name: str
    arguments: str  # JSON text, as the OpenAI API returns it


class ToolCall(Record):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Record):
    """An OpenAI chat message (system/user/assistant/tool). Null fields are absent in the API."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None  # the model's reasoning, when the server returns it separately

    def api_dict(self) -> dict:
        """The message as the chat API expects it (no null keys; reasoning is never sent back)."""
        return self.model_dump(exclude_none=True, exclude={"reasoning_content"})


class Step(Record):
    """One command executed in the sandbox. `killed_by`: the command was killed by its timeout or
    by the out-of-memory killer (the episode goes on; the model sees why)."""

    turn: int
    command: str
    exit_code: int
    duration_s: Seconds
    timed_out: bool = False
    killed_by: Literal["timeout", "oom"] | None = None
    output_bytes: int = 0
    truncated: bool = False


class TurnUsage(Record):
    """One teacher call. Token ids and logprobs are kept when the server returns them (vLLM with
    `teacher.return_token_ids` / `teacher.logprobs`): RL needs the tokens as sampled, not re-templated."""

    turn: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: Seconds = 0.0
    finish_reason: str | None = None
    endpoint: Annotated[str | None, Measured] = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # Both optional (null when the server returned no prompt ids): rollout parts written before they existed
    # still read back under this schema (a missing non-nullable struct field would not).
    prompt_shared_len: int | None = Field(None, description=(
        "how many leading ids of this turn's prompt equal the previous turn's prompt + completion ids (0 on turn 1; "
        "None: no prompt ids)"))
    prompt_new_token_ids: list[int] | None = Field(None, description=(
        "this turn's prompt ids after those `prompt_shared_len` (the whole prompt on turn 1), as the server "
        "tokenised them (vLLM's `prompt_token_ids` with `teacher.return_token_ids`); None: not returned"))


class InPlaceTests(Record):
    """Hidden tests run right after the episode (`venue`: `fresh`, a new container from the episode's committed
    files; `in_place`, the episode's own container): agent processes gone, protected paths checksummed, final
    work dir captured, *then* the verifier folders created fresh (root, 0700) and the tests copied in and run as
    root. `error`: no parseable result (a verifier failure)."""

    venue: str | None = Field(None, description="where they ran: fresh / in_place (None: a row written before "
                                                "venues, in place)")
    results: list[TestResult] = Field(default_factory=list)
    output: str = ""
    duration_s: Seconds = 0.0
    error: str | None = None
    explicit_reward: float | None = None
    exit_code: int | None = None
    fallback: str | None = Field(None, description="why the results cannot be trusted in place (e.g. the results "
                                                   "folder could not be reset): the verify stage tests isolated")
    integrity: list[str] = Field(default_factory=list, description=(
        "what the test run itself was found to have been tampered with, read from outside the container after "
        "it: hidden tests altered, a reward file the tests never write, rewards that disagree"))
    reported: list[TestResult] = Field(default_factory=list, description=(
        "pytest's per-test result lines in the output (script verifiers), whatever channel gave the reward"))
    leftovers: int = Field(0, description="processes the test command left running when it ended (then killed)")
    wrote: list[str] | None = Field(None, description=(
        "files the test run wrote outside /tests and /logs, `+` first when the file existed before it (read on "
        "the engine's host; None: no such view)"))
    reads: list[list[str]] | None = Field(None, description=(
        "[path, program] of each read of verifier material (/tests, /logs/verifier, /verifier) by agent code the "
        "tests ran, seen by a tracer on the engine's host (None: not traced)"))
    agent_only: list[str] | None = Field(None, description=(
        "files the episode wrote that only agent code opened or ran during the tests, seen by the same tracer: the "
        "answer's own helpers, which a counterfactual leaves in place (None: not traced)"))


class Rollout(Record):
    """A trajectory. `rollout_id` is deterministic in (env_id, teacher, sample, and the harness when it is not
    the environment kind's own): rerunning a shard replaces rows, it never adds a second copy."""

    rollout_id: str
    env_id: str
    teacher: str
    harness: str
    sample: int
    messages: list[Message]
    tools_json: str = "[]"
    steps: list[Step] = Field(default_factory=list)
    usage: list[TurnUsage] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    turns: int = 0
    tool_call_errors: int = Field(0, description=(
        "tools environments: the model's call errors (unknown tool, arguments not a JSON object or breaking "
        "the tool's schema); a tool's own error answer and a failing tool server (steps with exit code >= 3) "
        "are not counted"))
    status: Status
    error: str | None = None
    wall_s: Seconds = 0.0
    attempts: int = 1
    protected_changed: list[str] = Field(default_factory=list,
                                         description="protected paths whose content changed during the episode")
    leftover_processes: int = Field(0, description="agent processes still running at the end (-1: too many to count, "
                                                   "or not all confirmed gone by the kill)")
    final_state: Annotated[bytes | None, TarMark] = Field(default=None, description="tar of the work dir after the episode")
    changes: ChangeSet | None = Field(default=None, description="the episode's change set (see ChangeSet)")
    toolchain_changed: list[str] = Field(default_factory=list, description=(
        "system programs, libraries or loader settings the episode changed, read from outside the container "
        "(tasks/sandbox/layer.py): the container's programs were no longer trusted to judge it"))
    outside_state: Annotated[bytes | None, TarMark] = Field(default=None, description=(
        "tar (paths relative to /) of the files the episode added or modified outside the work dir; with "
        "`final_state` and `changes.deleted` it reproduces the final container state in a fresh container"))
    outside_omitted: list[str] = Field(default_factory=list, description=(
        "files changed outside the work dir left out of `outside_state` because together they exceed the capture "
        "limit (only the reference solution's changes were kept): a re-test that reverts them needs no content"))
    odd_links: list[str] = Field(default_factory=list, description=(
        "what the episode left that reads what it never wrote, found in its container after it ended: a symbolic "
        "link whose target did not exist then (`dangling <path>`), a work-dir file sharing its inode with a file "
        "elsewhere (`hardlink <path>`)"))
    in_place_tests: InPlaceTests | None = Field(
        default=None, description="the hidden tests run in the episode's own container after it ended "
                                  "or a new one from its files (verify.venue); the verify stage judges from these")
