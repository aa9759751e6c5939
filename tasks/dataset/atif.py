"""Exported trajectories as ATIF documents (the Agent Trajectory Interchange Format, Harbor's RFC 0001,
v1.8; built and validated with the `atif` package's own models), for viewers and tools that read it.

One document per trajectory row: the system and user messages are `system` / `user` steps; each model
turn is an `agent` step with its tool calls (arguments as JSON objects), and the tool results that
answer it are that step's observation (matched by call id). The verdict and labels go to `extra`.
Arguments the model wrote that are not a JSON object cannot be an ATIF tool call's arguments: the call
gets `{}` and keeps what the model wrote in its `extra.raw_arguments` (the row's `malformed_tool_calls`
already counts it), never a guess.

Invariant: every document returned validates with `atif.Trajectory` (it is built through it).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from ... import __version__

SCHEMA_VERSION = "ATIF-v1.8"
EXTRA_FIELDS = ("rollout_id", "env_id", "family", "level", "teacher", "harness", "sample", "status", "passed",
                "reward", "tests_passed", "tests_total", "hack_flags", "difficulty", "solve_rate", "source", "kind",
                "verification_mode", "malformed_tool_calls")


def _arguments(value: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(arguments, extra) of one exported tool call's arguments: the JSON text pyarrow gives or the value
    `datasets` decoded. A malformed call was exported as a JSON string of what the model wrote."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:  # (`datasets` decoded the JSON string: the model's text itself)
            return {}, {"raw_arguments": value}
    if isinstance(parsed, dict):
        return parsed, None
    return {}, {"raw_arguments": parsed if isinstance(parsed, str) else json.dumps(parsed)}


def _tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = row.get("tools")
    if tools is None:
        tools = json.loads(row.get("tools_json") or "[]")
    tools = [json.loads(t) if isinstance(t, str) else t for t in tools]
    return tools or None


def to_atif(row: dict[str, Any]):
    """The ATIF trajectory (an `atif.Trajectory`) of one exported trajectory row (a `trajectories` / `sft`
    row as a dict: from Parquet with pyarrow or `datasets`)."""
    from atif import Agent, FinalMetrics, Observation, ObservationResult, Step, ToolCall, Trajectory

    steps: list[dict[str, Any]] = []
    for m in row["messages"]:
        role = m["role"]
        if role == "tool":
            agent = next((s for s in reversed(steps) if s["source"] == "agent"), None)
            calls = {c.tool_call_id for c in (agent or {}).get("tool_calls") or []}
            if agent is None or (m.get("tool_call_id") and m["tool_call_id"] not in calls):
                raise ValueError(f"rollout {row.get('rollout_id')}: a tool result ({m.get('tool_call_id')}) answers "
                                 "no earlier tool call")
            results = agent.setdefault("observation", {"results": []})["results"]
            results.append(ObservationResult(source_call_id=m.get("tool_call_id"), content=m.get("content") or ""))
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent" if role == "assistant" else role,
                                "message": m.get("content") or ""}
        if role == "assistant":
            if m.get("reasoning_content"):
                step["reasoning_content"] = m["reasoning_content"]
            calls = []
            for c in m.get("tool_calls") or []:
                args, extra = _arguments(c["function"]["arguments"])
                calls.append(ToolCall(tool_call_id=c["id"], function_name=c["function"]["name"], arguments=args,
                                      extra=extra))
            step["tool_calls"] = calls or None
        steps.append(step)
    built = [Step(**{**s, "observation": Observation(**s["observation"]) if "observation" in s else None})
             for s in steps]
    return Trajectory(
        schema_version=SCHEMA_VERSION, session_id=row.get("rollout_id"), trajectory_id=row.get("rollout_id"),
        agent=Agent(name="trajforge", version=__version__, model_name=row.get("model") or row.get("teacher"),
                    tool_definitions=_tools(row), extra={"harness": row.get("harness")}),
        steps=built,
        final_metrics=FinalMetrics(total_prompt_tokens=row.get("prompt_tokens"),
                                   total_completion_tokens=row.get("completion_tokens"), total_steps=len(built)),
        extra={k: row[k] for k in EXTRA_FIELDS if k in row})


def atif_documents(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(rollout_id, ATIF document as JSON-ready dict) per row."""
    for row in rows:
        yield row["rollout_id"], to_atif(row).to_json_dict()
