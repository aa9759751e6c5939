"""Issue 31 item 2: exported rows round-trip through real chat templates of two families, with tools.

- SmolLM2-135M-Instruct's own tokenizer and template (the embedded teacher's model, `make teacher`): a
  plain ChatML template without tool support;
- the Hermes/Qwen3-style tool-calling template vLLM ships (`vllm/transformers_utils/chat_templates/
  template_minicpmv45.jinja`, in the vLLM interpreter's site-packages), rendered with the SmolLM2 tokenizer:
  tools in a system block, calls as `<tool_call>{"name", "arguments"}</tool_call>`, tool output as
  `<tool_response>` user turns, an empty think block before the final answer.
- SmolLM2's family with tools: the `smollm2-tools` template trajforge ships for its vLLM teacher
  (`vllm.chat_template`), where rows with tools render too.
Both must be installed (CI installs them): a missing one fails here, it is not skipped.

Rows come from the export stage (`build_export`, loaded back with `datasets`: arguments and tools as
objects). Checked: every row of `trajectories`, `sft` and `preference` renders without error, arguments
appear once JSON-encoded (no `\\\\\\"`), a template that cannot render tools raises a named error, a
malformed-arguments row is flagged and raises a named error (never repaired), and the `sft` `train` mask,
taken to tokens by `trajforge.tasks.dataset.chat.render` (prefix renders), selects exactly the assistant
tokens an independent scan of the token stream finds (`<|im_start|>assistant\\n` ... `<|im_end|>`).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from trajforge.schemas.trajectory import FunctionCall, Message, ToolCall
from trajforge.tasks.dataset.chat import MalformedArguments, ToolsNotRendered, render
from trajforge.tasks.teachers.vllm_server import cache_dir, resolve_chat_template, resolve_python

pytestmark = pytest.mark.teacher  # the model's tokenizer and vLLM's template: `make teacher` (make test does it)

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    "required": ["command"]}}}
ARGS = {"command": "grep -c \"ERROR\" /var/log/app.log | tr -d '\\n' # naïve", "timeout": 5}  # quotes, backslash, non-ASCII
TOOL_ROWS = {2, 3}  # rollouts of the tools environment (e1)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    path = cache_dir() / "models" / "smollm2-135m-instruct"
    assert (path / "tokenizer.json").exists(), f"SmolLM2's tokenizer is missing at {path}: run `make teacher`"
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def hermes_template() -> str:
    python = resolve_python(None)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    path = Path(site) / "vllm" / "transformers_utils" / "chat_templates" / "template_minicpmv45.jinja"
    assert path.exists(), f"vLLM's tool-calling chat template is missing at {path}: run `make teacher`"
    return path.read_text()


@pytest.fixture(scope="module")
def smollm2_tools() -> str:
    """The SmolLM2 template with a tools section that trajforge ships for its vLLM teacher
    (`vllm.chat_template: smollm2-tools`): the same family as the model's own, with tools."""
    return resolve_chat_template("smollm2-tools").read_text()


def conversation(i: int, output: str = "", args: str | None = None) -> list[Message]:
    if i in TOOL_ROWS:
        call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments=args or json.dumps(ARGS)))
        middle = [Message(role="assistant", tool_calls=[call]),
                  Message(role="tool", tool_call_id="c1", name="bash", content=f"[exit code 0]\n{i}")]
    else:
        middle = [Message(role="assistant", content="Let me look.\n```bash\nls -la\n```"),
                  Message(role="user", content=f"[exit code 0]\nfile{i}.txt")]
    return [Message(role="system", content="You are an agent in a terminal."), Message(role="user", content=f"task of e{i // 2 % 2}"),
            *middle, Message(role="assistant", content=f"Done: {i} files.")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import datasets
    from test_export_columns import build_export, files

    _, out, _, _ = build_export(tmp_path_factory.mktemp("chat"), {"export.configs": ["sft", "preference"]}, n=6,
                                messages_of=conversation,
                                tools_of=lambda i: json.dumps([BASH]) if i in TOOL_ROWS else "[]")
    return {c: list(datasets.load_dataset("parquet", data_files=files(out, c), split="train"))
            for c in ("trajectories", "sft", "preference")}


def conversations(config: str, row: dict) -> list[list[dict]]:
    if config == "preference":
        return [row["prompt"] + row["chosen"], row["prompt"] + row["rejected"]]
    return [row["messages"]]


def chatml_assistant_mask(tokenizer, text: str, ids: list[int]) -> list[bool]:
    """The oracle: tokens from after `<|im_start|>assistant\\n` (and the empty think block a generation
    prompt of this family writes) through `<|im_end|>`, found in the text, mapped to tokens by offsets."""
    spans = [m.span(1) for m in re.finditer(r"<\|im_start\|>assistant\n(?:<think>\n\n</think>\n\n)?(.*?<\|im_end\|>)",
                                            text, re.S)]
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(offsets) == len(ids)
    return [any(s <= a < e for s, e in spans) for a, _ in offsets]


def test_exported_rows_render_through_smollm2_and_a_hermes_style_template(exported, tokenizer, hermes_template,
                                                                         smollm2_tools):
    once = json.dumps(ARGS, ensure_ascii=False)
    counts = {}
    for config, rows in exported.items():
        assert rows, config
        for row in rows:
            for messages in conversations(config, row):
                tools = row["tools"]
                assert all(isinstance(c["function"]["arguments"], dict)
                           for m in messages for c in m["tool_calls"] or [])
                calls = sum(len(m["tool_calls"] or []) for m in messages)
                for template in (hermes_template, smollm2_tools):
                    r = render(tokenizer, messages, tools, chat_template=template)
                    assert r.text.count(once) == calls  # once-encoded, exactly where the calls are
                    assert '\\\\\\"' not in r.text and json.dumps(once) not in r.text  # never double-encoded
                    assert all(m["content"] in r.text for m in messages if m["content"])
                if tools:  # SmolLM2's template has no tool support: a named error, not a silent drop
                    with pytest.raises(ToolsNotRendered):
                        render(tokenizer, messages, tools)
                    counts[config, "smollm2-refused"] = counts.get((config, "smollm2-refused"), 0) + 1
                else:
                    smol = render(tokenizer, messages, tools)
                    assert all(m["content"] in smol.text for m in messages if m["content"])
                    counts[config, "smollm2"] = counts.get((config, "smollm2"), 0) + 1
                counts[config, "hermes"] = counts.get((config, "hermes"), 0) + 1
    for config in exported:  # every config, both families, and the refusal seen
        assert counts[config, "hermes"] and counts[config, "smollm2"] and counts[config, "smollm2-refused"], counts


def test_the_sft_train_mask_selects_exactly_the_assistant_tokens(exported, tokenizer, hermes_template, smollm2_tools):
    checked = 0
    for row in exported["sft"]:
        assert row["train"] == [m["role"] == "assistant" for m in row["messages"]]
        families = [{"chat_template": hermes_template}, {"chat_template": smollm2_tools}] + (
            [{}] if not row["tools"] else [])
        for kw in families:
            r = render(tokenizer, row["messages"], row["tools"], train=row["train"], **kw)
            assert r.input_ids == tokenizer(r.text, add_special_tokens=False)["input_ids"]
            assert r.mask == chatml_assistant_mask(tokenizer, r.text, r.input_ids)
            selected = tokenizer.decode([t for t, m in zip(r.input_ids, r.mask) if m])
            for m in row["messages"]:
                if m["content"]:
                    assert (m["content"] in selected) == (m["role"] == "assistant"), (m["role"], m["content"])
            assert selected.count("<|im_end|>") == sum(row["train"])
            checked += 1
    assert checked >= 5


def test_malformed_arguments_are_flagged_and_refused_never_repaired(tmp_path, tokenizer, hermes_template):
    import datasets
    from test_export_columns import build_export, files

    wrote = 'grep -c "ERROR" app.log'  # the model wrote a command, not a JSON object
    _, out, _, _ = build_export(tmp_path, n=4, messages_of=lambda i, o: conversation(i, o, wrote if i == 3 else None),
                                tools_of=lambda i: json.dumps([BASH]) if i in TOOL_ROWS else "[]")
    rows = {r["rollout_id"]: r for r in datasets.load_dataset("parquet", data_files=files(out, "trajectories"),
                                                              split="train")}
    bad, good = rows["r0003"], rows["r0002"]
    assert (bad["malformed_tool_calls"], good["malformed_tool_calls"]) == (1, 0)
    assert bad["messages"][2]["tool_calls"][0]["function"]["arguments"] == wrote  # kept as written
    for kw in ({"chat_template": hermes_template}, {}):
        with pytest.raises(MalformedArguments, match="malformed_tool_calls"):
            render(tokenizer, bad["messages"], bad["tools"], **kw)
    render(tokenizer, good["messages"], good["tools"], chat_template=hermes_template)


def test_a_template_that_double_encodes_or_drops_arguments_is_named(exported, tokenizer):
    """Templates made to fail on purpose: arguments encoded twice (`tojson` of the JSON text), and calls
    left out but their names kept: each a named error, never a rendered row."""
    from trajforge.tasks.dataset.chat import DoubleEncodedArguments

    row = next(r for r in exported["sft"] if r["tools"])
    head = "{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    tail = "{{ m.content }}<|im_end|>\n{% endfor %}"
    twice = head + "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson | tojson }}{% endfor %}" + tail
    names = head + "{% for c in m.tool_calls or [] %}{{ c.function.name }}{% endfor %}" + tail
    with pytest.raises(DoubleEncodedArguments):
        render(tokenizer, row["messages"], row["tools"], chat_template=twice)
    with pytest.raises(ToolsNotRendered, match="arguments"):
        render(tokenizer, row["messages"], row["tools"], chat_template=names)
