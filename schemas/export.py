"""Rows of the exported dataset configs.

`trajectories`: every verified rollout, success or failure, with its labels (failed trajectories
carry value too: ECHO's observation loss, Early Experience, MEL), hack flags and quality signals.
`sft`: the verified successes only, same columns. `rl`: environments the teacher solves sometimes
(0 < p < 1), with what an RL loop needs to run them. `preference`: a success and a failure of the
same environment. Messages are stored exactly as produced, with the tool schemas offered.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import ConfigDict, Field

from .calibration import Label
from .common import ChangeSet, JsonText, Measured, Record, Seconds, Status
from .trajectory import FunctionCall, Message, ToolCall, TurnUsage


class ExportFunctionCall(FunctionCall):
    model_config = ConfigDict(from_attributes=True)  # (built from a rollout's FunctionCall too)

    arguments: JsonText = Field(description=(
        "the call's arguments as a JSON object (a dict once loaded with `datasets`). Arguments the model wrote that "
        "are not a JSON object are kept as a JSON string of the text it wrote, and the row counts them in "
        "`malformed_tool_calls`"))


class ExportToolCall(ToolCall):
    model_config = ConfigDict(from_attributes=True)

    function: ExportFunctionCall


class ExportMessage(Message):
    """A message as exported: `tool_calls[].function.arguments` are JSON objects, not JSON text in a string
    (the form chat templates and trainers take). A rollout's `Message` validates as one when its calls'
    arguments are JSON text."""

    model_config = ConfigDict(from_attributes=True)

    tool_calls: list[ExportToolCall] | None = None


TOOLS_DESCRIPTION = ("the tool schemas offered, as JSON-schema function definitions (`{\"type\": \"function\", "
                     "\"function\": {name, description, parameters}}`; dicts once loaded with `datasets`), what "
                     "`apply_chat_template(messages, tools=...)` and TRL's trainers take; [] when none")


class Sampling(Record):
    """The sampling parameters the teacher was asked for (`teacher.*`)."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None


class TrajectoryRow(Record):
    rollout_id: str
    env_id: str
    family: str
    level: int
    teacher: str
    harness: str
    sample: int
    messages: list[ExportMessage]
    tools_json: str = Field(description="the tool schemas as one JSON text (kept one release beside `tools`; "
                                        "read `tools`)")
    status: Status
    passed: bool = Field(description="submitted, every hidden test passed, no hack flagged")
    reward: float = Field(description="fraction of hidden tests passed")
    tests_passed: int
    tests_total: int
    hack_flags: list[str]
    verification_mode: str = Field("none", description="where the hidden tests ran (Verdict.mode)")
    changed_paths: int = Field(0, description="how many paths the episode changed in its container (its change set)")
    unexpected_changes: list[str] = Field(default_factory=list, description="changed paths the reference solution did not need")
    counterfactual: str = Field("not_needed", description="not_needed / held / flipped / error: the pass re-tested with the "
                                            "suspicious unexpected changes reverted")
    step_labels: list[str] = Field(description="inspect / act / verify per command")
    inspect_before_act: bool
    act_verify_share: float
    ends_with_verify: bool
    repeated_commands: int
    failed_commands: int
    recoveries: int
    leftover_processes: int = Field(0, description="processes the agent left running when its episode ended (-1: too "
                                                   "many to count); gone before judging: a habit, not a hack")
    turns: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: Seconds
    difficulty: Label
    solve_rate: float
    content_hash: str = Field("", description=(
        "64-bit hash (hex) of the messages' roles, contents and tool calls: equal for equal trajectories"))
    model: str = Field("", description="the model id the teacher served (`@<revision>` appended when known)")
    sampling: Sampling | None = Field(None, description="sampling parameters of the teacher (None: not in the config)")
    created_at: Annotated[dt.datetime | None, Measured] = Field(None, description="when the rollout's shard was written (UTC)")
    source: str = Field("", description="where the environment comes from (procedural:<family>, llm:<theme>, harbor, ...)")
    license: str = Field("", description="the environment's license, when its source declares one")
    verifier_output_tail: str = Field("", description="the last characters of the hidden tests' output")
    changes: ChangeSet | None = Field(None, description="the episode's final change set in its container")
    kind: str = Field("terminal", description="the environment's kind: terminal (a shell) or tools (a tool server)")
    tests_run_agent_code: str = Field("unknown", description=(
        "whether the environment's hidden tests execute the agent's code (no / subprocess / in_process / unknown; "
        "environment: the tests do not, but the image's entrypoint or healthcheck reads files the agent writes; "
        "EnvSpec.tests_run_agent_code): such code runs with the tests' powers, and docs/verification.md lists the hacks that "
        "stay undetectable then; filter on it for the strictest data"))
    build_egress: str = Field("unknown", description=(
        "the network policy the environment's image was built under (EnvSpec.build_egress, "
        "`synthesize.build.egress`: allowlist / none / host; unknown: built before it was recorded)"))
    pooled_difficulty: Label = Field("unlabelled", description="the environment's difficulty across every teacher "
                                                             "of the build (Calibration.pooled_label)")
    test_strength: float | None = Field(None, description=(
        "the environment's test audit: mutants of the reference solution's outputs its hidden tests killed / "
        "mutants tried (EnvSpec.audit; null: not audited, e.g. no reference solution); 1.0 = every wrong state "
        "tried was rejected"))
    pooled_solve_rate: float = Field(0.0, description="the pooled fit's solve rate, on the `pooled_teacher`'s scale")
    tools: list[JsonText] = Field(default_factory=list, description=TOOLS_DESCRIPTION)
    monitor_flags: list[str] = Field(default_factory=list, description=(
        "the execution-free monitor's detectors that fired on this trajectory (Verdict.monitor_flags: each finding "
        "with its step and evidence is in the verify stage's parts); a second signal beside the tests"))
    monitor_score: float = Field(0.0, description="how strongly the monitor doubts the row, 0..1 (Verdict.monitor_score; "
                                                  "`verify.monitor.mode` says whether it changed the verdict)")
    monitor_rationale: str = Field("", description="the monitor's findings, one line each (Verdict.monitor_rationale)")
    malformed_tool_calls: int = Field(0, description=(
        "tool calls whose arguments the model wrote as something other than a JSON object (kept as a JSON string "
        "of what it wrote); filter on it to train on well-formed calls only"))


class SFTRow(TrajectoryRow):
    """A verified success; `train[i]` says whether a trainer learns from `messages[i]` (the model's turns)."""

    train: list[bool] = Field(default_factory=list)


class RLTokensRow(Record):
    """Per model turn, the prompt and completion token ids and logprobs as sampled (`teacher.return_token_ids`
    / `teacher.logprobs`): what on-policy RL needs without re-tokenising. Each turn's exact prompt is
    `previous[:prompt_shared_len] + prompt_new_token_ids`, `previous` being the turn before's prompt +
    completion (`trajforge.tasks.teachers.tokens.assemble` rebuilds them; docs/export.md)."""

    rollout_id: str
    env_id: str
    teacher: str
    model: str
    status: Status
    passed: bool
    reward: float
    monitor_flags: list[str] = Field(default_factory=list, description="TrajectoryRow.monitor_flags")
    monitor_score: float = Field(0.0, description="TrajectoryRow.monitor_score")
    turns: list[TurnUsage]
    prefix_preserving: bool | None = Field(None, description=(
        "every turn's prompt starts with the previous turn's prompt + completion ids exactly (the server's "
        "re-rendering of the conversation kept the sampled tokens): the rollout is then one token sequence, "
        "`token_ids`. False: re-rendering changed earlier tokens (retokenisation drift, a template that rewrites "
        "history): train per turn. None: the server returned no prompt ids"))
    token_ids: list[int] = Field(default_factory=list, description=(
        "the rollout as one sequence (the last turn's prompt + its completion) when `prefix_preserving`, else []"))
    loss_mask: list[bool] = Field(default_factory=list, description=(
        "aligned with `token_ids`: True on the ids the model sampled (every turn's completion), False on prompt "
        "ids (system, user, tool output, template framing)"))


class RLRow(Record):
    """An environment worth RL: the teacher solves it sometimes. `image` is the local content-addressed
    tag; `env_spec_json` holds the spec (files, hidden tests) to rebuild it, the reference solution only
    with `export.rl.include_solutions`."""

    env_id: str
    family: str
    level: int
    source: str
    instruction: str
    workdir: str
    image: str
    teacher: str
    attempts: int
    solve_rate: float
    ci_low: float
    ci_high: float
    difficulty: Label
    env_spec_json: str
    harness: str | None = Field(None, description="the harness the solve rate was measured under when it is not "
                                                   "the kind's own (`Calibration.harness`)")
    license: str = Field("", description="the environment's license, when its source declares one")
    kind: str = Field("terminal", description="the environment's kind: terminal or tools")
    pooled_difficulty: Label = Field("unlabelled", description="the environment's difficulty across every teacher")
    pooled_solve_rate: float = Field(0.0, description="the pooled fit's solve rate, on the `pooled_teacher`'s scale")
    pooled_teacher: str = Field("", description="the teacher whose scale the pooled rate is on")
    test_strength: float | None = Field(None, description=(
        "the environment's test audit: mutants of the reference solution's outputs its hidden tests killed / "
        "mutants tried (EnvSpec.audit; null: not audited, e.g. no reference solution); 1.0 = every wrong state "
        "tried was rejected"))


class PreferenceRow(Record):
    """A success (`chosen`) and a failure (`rejected`) of the same environment after the same prompt."""

    env_id: str
    family: str
    level: int
    prompt: list[ExportMessage]
    chosen: list[ExportMessage]
    rejected: list[ExportMessage]
    chosen_id: str
    rejected_id: str
    chosen_reward: float
    rejected_reward: float
    tools_json: str = Field(description="the tool schemas as one JSON text (kept one release beside `tools`)")
    tools: list[JsonText] = Field(default_factory=list, description=TOOLS_DESCRIPTION)
    chosen_turns: int = Field(0, description="model (assistant) turns in `chosen`")
    rejected_turns: int = Field(0, description="model (assistant) turns in `rejected`; never 0 (such a pair is not made)")
    chosen_monitor_score: float = Field(0.0, description="the monitor's score of `chosen` (TrajectoryRow.monitor_score)")
    rejected_monitor_score: float = Field(0.0, description="the monitor's score of `rejected`")
