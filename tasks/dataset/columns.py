"""The provenance columns of exported rows, the tool columns (`tools`, canonical tool-call arguments), the SFT train mask, the `rl_tokens` config and `rl`'s spec.

All column-wise (no per-row Python beyond one value per teacher or per part): a column built here has
one entry per row of the table it is appended to.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...schemas.arrow import arrow_schema, as_storage, to_table
from ...schemas.environment import EnvSpec
from ...schemas.export import RLTokensRow, Sampling, TrajectoryRow
from ...schemas.trajectory import Rollout
from ..engine import Manifest, StageContext, upstream_parts
from ..redaction.secrets import marked_rows
from ..teachers.tokens import assemble


def test_strength(audit: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`test_strength` per row from `EnvSpec.audit` structs: killed / tried, null where nothing was tried
    (no reference solution, audit off, or an older part without the column)."""
    arr = audit.combine_chunks() if isinstance(audit, pa.ChunkedArray) else audit
    tried = pc.cast(pc.struct_field(arr, "tried"), pa.float64())
    killed = pc.cast(pc.struct_field(arr, "killed"), pa.float64())
    return pc.if_else(pc.greater(tried, 0), pc.round(pc.divide(killed, pc.max_element_wise(tried, 1.0)), 4),
                      pa.scalar(None, pa.float64()))


def model_id(teacher: Any) -> str:
    """The model a teacher served: its served name (vLLM: the served name, else the weights it loaded),
    with `@<revision>` when the config names one."""
    server = getattr(teacher, "vllm", None)
    name = (server.served_model_name or server.model) if server is not None else (teacher.served_model or teacher.label)
    revision = getattr(teacher, "revision", None) or getattr(server, "revision", None)
    return f"{name}@{revision}" if revision else name


def teacher_columns(ctx: StageContext, teachers: list[str]) -> dict[str, pa.Array]:
    """`model` and `sampling` per row, from the build's teacher configs by label (a label the config no
    longer has: the label itself, no sampling)."""
    by_label = {t.label: t for t in ctx.config.teachers}
    models, sampling = {}, {}
    for label in set(teachers):
        t = by_label.get(label)
        models[label] = model_id(t) if t is not None else label
        sampling[label] = (Sampling(temperature=t.temperature, top_p=t.top_p, max_tokens=t.max_tokens,
                                    seed=t.seed).model_dump() if t is not None else None)
    schema = arrow_schema(TrajectoryRow)
    return {"model": pa.array([models[x] for x in teachers], pa.string()),
            "sampling": pa.array([sampling[x] for x in teachers], schema.field("sampling").type)}


def created_at(store: Any, part: str, n: int) -> pa.Array:
    """When the rollout part was written (its `_done` marker's `finished_at`), repeated `n` times."""
    marker = posixpath.join(posixpath.dirname(part), "_done", posixpath.basename(part).removesuffix(".parquet"))
    when = None
    if store.exists(marker):
        finished = store.read_json(marker).get("finished_at")
        when = dt.datetime.fromtimestamp(finished, dt.timezone.utc) if finished else None
    return pa.array([when] * n, arrow_schema(TrajectoryRow).field("created_at").type)


def tail(strings: pa.ChunkedArray | pa.Array, chars: int) -> pa.Array:
    """The last `chars` characters of each string (empty for null)."""
    if chars <= 0:
        return pa.array([""] * len(strings), pa.string())
    return pc.fill_null(pc.utf8_slice_codeunits(strings, start=-chars), "")


def train_mask(messages: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Per row, one bool per message: True for the model's (assistant) turns, what SFT trains on."""
    arr = as_storage(messages)
    roles = pc.equal(pc.struct_field(arr.flatten(), "role"), "assistant")
    return pa.ListArray.from_arrays(pc.subtract(arr.offsets, arr.offsets[0]), roles, type=pa.list_(pa.bool_()))


def rl_spec_json(env: EnvSpec, include_solutions: bool) -> str:
    """The spec an RL loop rebuilds the environment from: hidden tests yes (rewards need them), the
    reference solution only when asked for (it would let a trained policy be contaminated by it)."""
    drop = {"image"} if include_solutions else {"image", "solution"}
    return env.model_dump_json(exclude=drop)


MONITOR = ("monitor_flags", "monitor_score")  # the monitor's columns each trajectory-carrying config repeats


def rl_tokens_chunks(ctx: StageContext, parts: list[str], upstream: dict[str, Manifest],
                     counts: dict[str, Any] | None = None) -> Iterator[pa.Table]:
    """One chunk per rollout part: the exported rollouts (in `trajectories`) that recorded token ids or
    logprobs for at least one turn, with those turns. A rollout whose messages were redacted is left out
    (its token ids decode back to the secret); `counts["rl_tokens_rows_dropped"]` counts them."""
    store, kept, redacted = ctx.store, [], set()
    for t in store.iter_tables(parts, TrajectoryRow, columns=["rollout_id", "model", "passed", "reward", *MONITOR, "messages"]):
        hit = marked_rows(t.column("messages"))
        redacted.update(pc.filter(t.column("rollout_id"), pa.array(hit)).to_pylist())
        kept.append(t.drop_columns(["messages"]).filter(pa.array(~hit)))
    keep = (pa.concat_tables(kept) if kept else
            store.read_table(parts, TrajectoryRow, columns=["rollout_id", "model", "passed", "reward", *MONITOR]))
    idx = {r: i for i, r in enumerate(keep.column("rollout_id").to_pylist())}
    for part in upstream_parts(upstream, "rollout"):
        t = store.read_table([part], Rollout, columns=["rollout_id", "env_id", "teacher", "status", "usage"])
        ids = t.column("rollout_id").to_pylist()
        usage = t.column("usage").combine_chunks()
        flat = usage.flatten()
        has = pc.or_(pc.is_valid(pc.struct_field(flat, "completion_token_ids")),
                     pc.is_valid(pc.struct_field(flat, "logprobs")))
        parent = pc.list_parent_indices(usage).to_numpy()
        with_tokens = set(parent[has.to_numpy(zero_copy_only=False)].tolist())
        if counts is not None:
            n = sum(r in redacted and i in with_tokens for i, r in enumerate(ids))
            counts["rl_tokens_rows_dropped"] = counts.get("rl_tokens_rows_dropped", 0) + n
        rows = [i for i, r in enumerate(ids) if r in idx and i in with_tokens]
        if not rows:
            continue
        t = t.take(pa.array(rows, pa.int64()))
        k = keep.take(pa.array([idx[ids[i]] for i in rows], pa.int64()))
        out = t.rename_columns(["rollout_id", "env_id", "teacher", "status", "turns"])
        for name in ("model", "passed", "reward", *MONITOR):
            out = out.append_column(name, k.column(name))
        for name, column in sequence_columns(out.column("turns")).items():
            out = out.append_column(name, column)
        yield to_table(RLTokensRow, out)


def sequence_columns(turns: pa.ChunkedArray | pa.Array) -> dict[str, pa.Array]:
    """`prefix_preserving`, `token_ids`, `loss_mask` per row, from its turns (teachers.tokens.assemble)."""
    built = [assemble(row or []) for row in turns.to_pylist()]
    schema = arrow_schema(RLTokensRow)
    return {"prefix_preserving": pa.array([b.prefix_preserving for b in built], pa.bool_()),
            "token_ids": pa.array([b.token_ids for b in built], schema.field("token_ids").type),
            "loss_mask": pa.array([b.loss_mask for b in built], schema.field("loss_mask").type)}


def tool_definitions(tools_json: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The `tools` column: per row, the tool schemas of `tools_json` as a list of JSON-schema function
    definitions (each one JSON text, typed JSON: `datasets` gives dicts). Parsed once per distinct text."""
    parsed: dict[str | None, list[str]] = {}
    rows = []
    for text in tools_json.to_pylist():
        if text not in parsed:
            defs = json.loads(text or "[]")
            if not isinstance(defs, list) or not all(isinstance(d, dict) for d in defs):
                raise ValueError(f"tools_json is not a list of tool definitions: {str(text)[:200]}")
            parsed[text] = [json.dumps(d) for d in defs]
        rows.append(parsed[text])
    return pa.array(rows, pa.list_(pa.string())).cast(pa.list_(pa.json_()))


def _json_object(text: str | None) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (TypeError, ValueError):
        return False


def canonical_tool_calls(messages: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """(messages, malformed): every tool call's arguments made a JSON object's text, so the JSON-typed
    export column holds objects; arguments the model wrote that are not a JSON object are kept verbatim
    as a JSON *string* (never silently fixed), and `malformed` counts them per row. Rows with only
    well-formed calls are passed through as they are (the usual case: no per-row Python)."""
    arr = messages.combine_chunks() if isinstance(messages, pa.ChunkedArray) else messages
    malformed = np.zeros(len(arr), dtype=np.int64)
    msgs = arr.flatten()
    calls = msgs.field("tool_calls")
    if not len(calls.flatten()):
        return arr, pa.array(malformed)
    args = calls.flatten().field("function").field("arguments").to_pylist()
    bad = {i for i, a in enumerate(args) if not _json_object(a)}
    if not bad:
        return arr, pa.array(malformed)
    row_of_msg = pc.list_parent_indices(arr).to_numpy()
    msg_of_call = pc.list_parent_indices(calls).to_numpy()
    np.add.at(malformed, row_of_msg[msg_of_call[sorted(bad)]], 1)
    rows = arr.to_pylist()  # (rare: only when some call is malformed) the calls, in the order of `args`
    calls_in_order = (c for row in rows for m in row or [] for c in m.get("tool_calls") or [])
    for k, call in enumerate(calls_in_order):
        if k in bad:
            call["function"]["arguments"] = json.dumps(args[k])
    return pa.array(rows, arr.type), pa.array(malformed)
