"""An exported conversation through a tokenizer's chat template, checked: what a trainer does with a row of
`trajectories`, `sft` or `preference` (`apply_chat_template(messages, tools=...)`), refusing what would be
trained on silently wrong.

Invariants of `render`:
- tool-call arguments are JSON objects (rows loaded with `datasets`); a call whose arguments are not (the
  model wrote something else; the row counts it in `malformed_tool_calls`) raises `MalformedArguments`,
  never repaired;
- every offered tool's name and every call (name, and its arguments as *one* JSON encoding of the object)
  appear in the rendered text, else `ToolsNotRendered` (a template without tool support drops them) or
  `DoubleEncodedArguments` (arguments rendered as a JSON string of JSON text);
- `mask[i]` is True exactly on the tokens of the messages a trainer learns from (`train`, default: the
  assistant's), found by rendering prefixes: message i starts where the conversation up to it plus the
  generation prompt ends in the whole text (when the text continues with only part of the generation
  prompt, e.g. a Qwen3-style empty think block it adds only there, after the last line both share: the
  role header) and ends with the tokenizer's end-of-turn token (`eos_token`) after it, included (the model
  samples it). What a generation prompt writes is never in the mask, as at inference. A template whose earlier prefix is not a prefix of the whole text raises
  `TemplateNotPrefixStable`.
The only change to a message is `content: null` given as "" (OpenAI's null content of a tool-call turn,
which templates concatenate); keys whose value is null are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class ChatRenderError(ValueError):
    """The row cannot be rendered faithfully with this template."""


class MalformedArguments(ChatRenderError):
    """A tool call's arguments are not a JSON object (kept as the model wrote them, counted in
    `malformed_tool_calls`)."""


class ToolsNotRendered(ChatRenderError):
    """The template left out a tool definition or a tool call (it has no tool support)."""


class DoubleEncodedArguments(ChatRenderError):
    """A call's arguments were rendered as a JSON string holding JSON text."""


class TemplateNotPrefixStable(ChatRenderError):
    """Message boundaries cannot be found by rendering prefixes (the template rewrites earlier turns)."""


@dataclass
class Rendered:
    text: str
    input_ids: list[int]
    mask: list[bool]  # per token: part of a message a trainer learns from


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates take them: null-valued keys left out, null content as ""."""
    out = []
    for m in messages:
        d = {k: v for k, v in m.items() if v is not None}
        d.setdefault("content", "")
        out.append(d)
    return out


def _calls(messages: list[dict[str, Any]]) -> list[tuple[int, str, Any]]:
    return [(i, (c.get("function") or {}).get("name") or "", (c.get("function") or {}).get("arguments"))
            for i, m in enumerate(messages) for c in m.get("tool_calls") or []]


def _json_values(text: str, start_chars: str) -> Any:
    """Every JSON value that starts at one of `start_chars` in `text`."""
    decoder, i = json.JSONDecoder(), -1
    while True:
        i = min((j for j in (text.find(ch, i + 1) for ch in start_chars) if j >= 0), default=-1)
        if i < 0:
            return
        try:
            yield decoder.raw_decode(text, i)[0]
        except ValueError:
            continue


def check_tools(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """Raise unless every tool and every call (arguments once JSON-encoded) is in `text`."""
    for tool in tools:
        name = (tool.get("function") or tool).get("name", "")
        if name not in text:
            raise ToolsNotRendered(f"the chat template does not render the tool definitions ({name!r} is not in its text)")
    calls = _calls(messages)
    if not calls:
        return
    objects = [v for v in _json_values(text, "{") if isinstance(v, dict)]
    strings = [v for v in _json_values(text, '"') if isinstance(v, str) and v.lstrip().startswith("{")]
    for i, name, args in calls:
        if name not in text:
            raise ToolsNotRendered(f"message {i}: the chat template does not render tool calls ({name!r} is not in its text)")
        if any(_loads(s) == args for s in strings):
            raise DoubleEncodedArguments(f"message {i}: call {name!r}: arguments rendered as a JSON string of JSON text")
        if not any(o == args or o.get("arguments") == args for o in objects):
            raise ToolsNotRendered(f"message {i}: call {name!r}: its arguments are not in the text as a JSON object")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
           train: list[bool] | None = None, **template_kwargs: Any) -> Rendered:
    """Render one row's `messages` (and `tools`) with `tokenizer`'s chat template (or `chat_template=`),
    checked as the module says; `train` per message (default: the assistant's) gives the token mask."""
    for i, name, args in _calls(messages):
        if not isinstance(args, dict):
            raise MalformedArguments(f"message {i}: call {name!r}: arguments are not a JSON object "
                                     f"(the row's malformed_tool_calls counts it): {str(args)[:120]!r}")
    msgs, tools = template_messages(messages), list(tools or [])
    train = [m.get("role") == "assistant" for m in messages] if train is None else list(train)
    if len(train) != len(msgs):
        raise ValueError(f"train has {len(train)} flags for {len(msgs)} messages")

    def apply(upto: int, generation: bool = False) -> str:
        try:
            return tokenizer.apply_chat_template(msgs[:upto], tools=tools or None, tokenize=False,
                                                 add_generation_prompt=generation, **template_kwargs)
        except Exception as err:  # jinja's errors: the template cannot take this conversation
            raise ChatRenderError(f"the chat template failed on {upto} message(s): {type(err).__name__}: {err}") from err

    text = apply(len(msgs))
    check_tools(text, msgs, tools)
    eos = tokenizer.eos_token
    spans = []
    for i, flag in enumerate(train):
        if not flag or i == 0:
            continue
        bare, prompt = apply(i), apply(i, generation=True)
        if not text.startswith(bare) or not prompt.startswith(bare):
            raise TemplateNotPrefixStable(f"message {i}: the conversation before it renders differently on its own")
        start = len(prompt)
        if not text.startswith(prompt):  # only part of the generation prompt is there: up to its last shared line
            shared = next(k for k, (a, b) in enumerate(zip(prompt, text)) if a != b)
            start = prompt.rfind("\n", len(bare), shared) + 1
            if start <= len(bare):
                raise TemplateNotPrefixStable(f"message {i}: the text does not continue with the generation prompt")
        end = text.find(eos, start)
        if end < 0:
            raise TemplateNotPrefixStable(f"message {i}: no end-of-turn token {eos!r} after it")
        spans.append((start, end + len(eos)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for a, b in enc["offset_mapping"]:
        if any(a < s < b or a < e < b for s, e in spans):
            raise TemplateNotPrefixStable(f"a token ({a}:{b}) straddles a message boundary")
        mask.append(any(s <= a < e for s, e in spans))
    return Rendered(text, list(enc["input_ids"]), mask)
