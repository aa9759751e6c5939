"""Stage `export`: the dataset as Parquet configs plus a dataset card, loadable with
`datasets.load_dataset(<export dir>, "<config>")` and uploadable to the Hub as it is.

- `trajectories` (the stage's output table): every verified rollout (all adaptive rounds), success or
  failure, with messages as produced, tool schemas, verdict, hack flags, quality signals and the
  environment's calibrated difficulty. `export.filters` drop rows with a `filter_*` reject reason.
- derived configs (`export.configs`), written by `finalize` and gated by their own suite
  (`expectations/suites/export.<config>.json`):
  `sft` = verified successes (never a hack-flagged one); `rl` = environments with 0 < p < 1;
  `preference` = a success paired with a failure of the same environment.
The card declares only configs that have rows (`datasets` cannot load an empty Parquet file).
File names carry the export fingerprint: `datasets` keys its cache on the card's file patterns.
"""

from __future__ import annotations

import json
import posixpath
from collections import defaultdict
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schemas.arrow import arrow_schema, as_storage, empty_table, to_table
from ..schemas.calibration import Calibration
from ..schemas.common import INFRA_STATUSES, Reject
from ..schemas.config import ExportFilters
from ..schemas.environment import EnvSpec
from ..schemas.export import ExportMessage, PreferenceRow, RLRow, RLTokensRow, SFTRow, TrajectoryRow
from ..schemas.trajectory import Rollout
from ..schemas.verdict import Verdict
from .agent.harnesses import episode_harness
from .dataset.card import dataset_card
from .dataset.columns import (
    canonical_tool_calls,
    created_at,
    rl_spec_json,
    rl_tokens_chunks,
    tail,
    teacher_columns,
    test_strength,
    tool_definitions,
    train_mask,
)
from .dataset.parquet import FileWriter
from .engine import Manifest, Shard, ShardResult, Stage, StageContext, upstream_parts
from .engine.parquet import ParquetOptions
from .engine.runner import brief_failure, check_gate, gate_columns, gate_suites
from .envs.catalogue import load_envs
from .redaction.secrets import Scanner, scan_table

ROLLOUT_COLUMNS = ["rollout_id", "env_id", "teacher", "harness", "sample", "messages", "tools_json", "status",
                   "turns", "prompt_tokens", "completion_tokens", "wall_s"]
VERDICT_COLUMNS = ["rollout_id", "verified", "passed", "reward", "tests", "hack_flags", "quality", "mode", "changes",
                   "unexpected", "counterfactual", "verifier_output", "monitor_flags", "monitor_score", "monitor_rationale"]
LATE = ("malformed_tool_calls",)  # set after the secrets scan, from the messages it leaves
TRAJECTORY_ADDED = [n for n in TrajectoryRow.model_fields if n not in ROLLOUT_COLUMNS and n not in LATE]
SCANNED = {"trajectories": ["messages", "verifier_output_tail"], "rl": ["instruction", "env_spec_json"]}
PREFERENCE_COLUMNS = ["rollout_id", "env_id", "family", "level", "messages", "tools_json", "tools", "status", "passed",
                      "reward", "hack_flags", "monitor_score"]


def filter_reason(f: ExportFilters, *, hacks: int, inspect_before_act: bool, act_verify_share: float,
                  repeated_commands: int) -> str | None:
    """The reject reason of a verified trajectory under `export.filters`, or None to keep it."""
    if f.drop_hacks and hacks:
        return "filter_hack"
    if f.require_inspect_before_act and not inspect_before_act:
        return "filter_no_inspect_before_act"
    if f.min_act_verify_share is not None and act_verify_share < f.min_act_verify_share:
        return "filter_low_act_verify_share"
    if f.max_repeated_commands is not None and repeated_commands > f.max_repeated_commands:
        return "filter_repeated_commands"
    return None


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _hash_strings(arr: pa.Array) -> np.ndarray:
    import pandas as pd

    return pd.util.hash_array(arr.to_numpy(zero_copy_only=False).astype(object), categorize=False)


def _spread(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mixer (splitmix64's finaliser): positions and parts do not cancel out."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def content_hashes(messages: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Per row, a 64-bit hash (16 hex digits) of its messages in order: role, content, tool call names and
    arguments. Column-wise (no per-row Python): equal trajectories get equal hashes."""
    arr = as_storage(messages)  # exported messages: JSON arguments hashed as their text
    n = len(arr)
    msgs = arr.flatten()
    parent = pc.list_parent_indices(arr).to_numpy()
    h = _hash_strings(msgs.field("role")) * _MIX + _spread(_hash_strings(msgs.field("content")))
    calls = msgs.field("tool_calls")
    if len(calls.flatten()):
        call_parent = pc.list_parent_indices(calls).to_numpy()
        fn = calls.flatten().field("function")
        call_h = _spread(_hash_strings(fn.field("name")) + _spread(_hash_strings(fn.field("arguments"))))
        first_call = np.searchsorted(call_parent, call_parent)  # calls of one message are contiguous
        np.add.at(h, call_parent, _spread(call_h + (np.arange(len(call_parent)) - first_call).astype(np.uint64)))
    first = np.searchsorted(parent, parent)  # messages of one row are contiguous
    row = np.zeros(n, dtype=np.uint64)
    np.add.at(row, parent, _spread(h + (np.arange(len(parent)) - first).astype(np.uint64) * _MIX))
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
    return pa.array([f"{v:016x}" for v in _spread(row + lengths).tolist()], pa.string())


def _index(table: pa.Table, *keys: str) -> dict:
    cols = [table.column(k).to_pylist() for k in keys]
    return {k[0] if len(k) == 1 else k: i for i, k in enumerate(zip(*cols))}


def _list_sum(lists: pa.ChunkedArray, field: str) -> pa.Array:
    """Per row, the number of true `field` values in a list<struct> column."""
    arr = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    offsets = arr.offsets.to_numpy()
    flat = pc.struct_field(arr.values, field).to_numpy(zero_copy_only=False).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(flat)])
    return pa.array(cum[offsets[1:]] - cum[offsets[:-1]])


ENV_COLUMNS = ["env_id", "family", "level", "source", "kind", "tests_run_agent_code", "build_egress", "audit", *(["license"] if "license" in EnvSpec.model_fields else [])]


def _scan(ctx: StageContext, table: pa.Table, rejects: list[Reject]) -> tuple[pa.Table, dict[str, Any]]:
    """The secrets gate of a trajectories part: SCANNED columns redacted (or their rows rejected, reason
    `secret`); the hashes are taken again of redacted messages. Returns the table and the shard's counters."""
    cfg = ctx.config.export.secrets
    scanner = Scanner(cfg.detectors)
    out, dropped, redacted = scan_table(table, SCANNED["trajectories"], scanner, cfg.action)
    rejects += [Reject(key=k, reason="secret", detail=", ".join(d)) for k, d in dropped]
    if redacted:
        i = out.schema.get_field_index("content_hash")
        out = out.set_column(i, out.schema.field(i), content_hashes(out.column("messages")))
    return out, {"secret_hits": dict(scanner.hits), "secret_rows": {"redacted": redacted, "rejected": len(dropped)}}


def _footer_size(store, part: str, columns: list[str]) -> tuple[int, int]:
    """(rows, uncompressed bytes of `columns`) of a Parquet part, from its footer."""
    import pyarrow.parquet as pq

    with store.fs.open(part, "rb") as f:
        meta = pq.ParquetFile(f).metadata
    size = sum(rg.column(j).total_uncompressed_size for rg in (meta.row_group(i) for i in range(meta.num_row_groups))
               for j in range(rg.num_columns) if rg.column(j).path_in_schema.split(".")[0] in columns)
    return meta.num_rows, size


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def scanner_version() -> str:
    """The secret scanner as named in stats and in the fingerprint (the targeted patterns are code: `dataset`)."""
    return f"detect-secrets {_version('detect-secrets')} + targeted patterns"


class ExportStage(Stage):
    name = "export"
    requires = ("calibrate", "verify", "rollout", "synthesize")
    config_sections = ("export",)
    output = TrajectoryRow

    def config_section(self, config: Any) -> dict[str, Any]:
        """`export` plus the scanner's version: a new detect-secrets release (its patterns) re-runs export."""
        return {**super().config_section(config), "scanner": scanner_version()}

    def part_path(self, shard: Shard, fingerprint: str) -> str:
        return f"trajectories/train-{fingerprint}-{shard.index:05d}.parquet"

    def parquet_options(self, ctx: StageContext) -> ParquetOptions:
        """The trajectories parts are the dataset's files: laid out as `export.parquet` says."""
        return ParquetOptions.of(ctx.config.export.parquet)

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        """One shard per rollout part; a part whose exported columns exceed `export.parquet.file_bytes`
        (uncompressed, from its footer) is split into row ranges, so every trajectories file stays bounded."""
        pieces = []
        for p in upstream_parts(upstream, "rollout"):
            rows, size = _footer_size(ctx.store, p, ROLLOUT_COLUMNS)
            n = max(1, -(-size // ctx.config.export.parquet.file_bytes)) if rows else 1
            step = -(-rows // n) if rows else 0
            pieces += ([{"part": p}] if n == 1 else
                       [{"part": p, "rows": [a, min(a + step, rows)]} for a in range(0, rows, step)])
        return [Shard(index=i, payload=payload) for i, payload in enumerate(pieces)]

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        """Column-wise join on Arrow: rollout columns (messages, tools) are taken, never turned into
        records; verdict, quality, environment and calibration columns are gathered beside them by
        index. Per-row Python only decides the reject reason, from a handful of scalars."""
        store, filters = ctx.store, ctx.config.export.filters
        table = store.read_table([shard.payload["part"]], Rollout, columns=ROLLOUT_COLUMNS)
        if "rows" in shard.payload:
            start, stop = shard.payload["rows"]
            table = table.slice(start, stop - start)
        ids, status = table.column("rollout_id").to_pylist(), table.column("status").to_pylist()
        vt = store.read_table(upstream_parts(upstream, "verify"), Verdict, columns=VERDICT_COLUMNS,
                              filters=[("rollout_id", "in", ids)])
        vidx = _index(vt, "rollout_id")  # the last verdict of a rollout wins (a re-run round)
        quality = vt.column("quality").combine_chunks()
        verified = vt.column("verified").to_pylist()
        hacks = pc.list_value_length(vt.column("hack_flags")).to_pylist()
        ibf, avs, rep = (quality.field(n).to_pylist()
                         for n in ("inspect_before_act", "act_verify_share", "repeated_commands"))
        keep, keep_v, rejects = [], [], []
        for i, (rid, st) in enumerate(zip(ids, status)):
            j = vidx.get(rid)
            reason = ("no_verdict" if j is None else "unverified" if not verified[j]
                      else filter_reason(filters, hacks=hacks[j], inspect_before_act=ibf[j],
                                         act_verify_share=avs[j], repeated_commands=rep[j]))
            if reason:
                rejects.append(Reject(key=rid, reason=reason, detail=st))
            else:
                keep.append(i)
                keep_v.append(j)
        if not keep:  # e.g. a part of teacher_error episodes only: nothing to join (an empty filter fails)
            return ShardResult(empty_table(arrow_schema(TrajectoryRow)), rejects,
                               {"passed": 0, "secret_rows": {"redacted": 0, "rejected": 0}})
        out = table.take(pa.array(keep, pa.int64()))
        v = vt.take(pa.array(keep_v, pa.int64()))
        q = v.column("quality").combine_chunks()
        env_ids, teachers = out.column("env_id").to_pylist(), out.column("teacher").to_pylist()
        mine = [("env_id", "in", sorted(set(env_ids)))]  # this part's environments only
        envs = store.read_table(upstream["synthesize"].parts, EnvSpec, columns=ENV_COLUMNS, filters=mine)
        calib = store.read_table(upstream["calibrate"].parts, Calibration,
                                 columns=["env_id", "teacher", "harness", "label", "solve_rate", "pooled_label",
                                          "pooled_solve_rate"], filters=mine)
        env_idx, cal_idx = _index(envs, "env_id"), _index(calib, "env_id", "teacher", "harness")
        e = envs.take(pa.array([env_idx[x] for x in env_ids], pa.int64()))
        # each row's calibration pair: (environment, teacher, its harness unless the kind's own: calibrate.py)
        kinds = pc.fill_null(e.column("kind"), "terminal").to_pylist()
        pair_harness = [episode_harness(EnvSpec.model_construct(env_id=x, kind=k), h)
                        for x, k, h in zip(env_ids, kinds, out.column("harness").to_pylist())]
        c = calib.take(pa.array([cal_idx[k] if k in cal_idx else cal_idx[k[:2] + (None,)]  # a per-teacher calibration
                                 for k in zip(env_ids, teachers, pair_harness)], pa.int64()))
        added = {"family": e.column("family"), "level": e.column("level"), "passed": v.column("passed"),
                 "reward": v.column("reward"), "tests_passed": _list_sum(v.column("tests"), "passed"),
                 "tests_total": pc.list_value_length(v.column("tests")), "hack_flags": v.column("hack_flags"),
                 "step_labels": q.field("labels"), "difficulty": c.column("label"), "solve_rate": c.column("solve_rate"),
                 "verification_mode": v.column("mode"), "unexpected_changes": v.column("unexpected"),
                 "changed_paths": pc.fill_null(pc.struct_field(v.column("changes").combine_chunks(), "total"), 0),
                 "counterfactual": v.column("counterfactual"),
                 **{n: q.field(n) for n in ("inspect_before_act", "act_verify_share", "ends_with_verify",
                                            "repeated_commands", "failed_commands", "recoveries",
                                            "leftover_processes")},
                 "content_hash": content_hashes(out.column("messages")), **teacher_columns(ctx, teachers),
                 "created_at": created_at(store, shard.payload["part"], out.num_rows), "source": e.column("source"),
                 "license": (pc.fill_null(e.column("license"), "") if "license" in ENV_COLUMNS
                             else pa.array([""] * out.num_rows, pa.string())),
                 "verifier_output_tail": tail(v.column("verifier_output"), ctx.config.export.verifier_tail_chars),
                 "changes": v.column("changes"), "kind": pc.fill_null(e.column("kind"), "terminal"),  # older parts: null
                 "tests_run_agent_code": pc.fill_null(e.column("tests_run_agent_code"), "unknown"),
                 "build_egress": pc.fill_null(e.column("build_egress"), "unknown"),
                 "test_strength": test_strength(e.column("audit")),
                 "pooled_difficulty": pc.fill_null(c.column("pooled_label"), "unlabelled"),
                 "pooled_solve_rate": pc.fill_null(c.column("pooled_solve_rate"), 0.0),
                 "tools": tool_definitions(out.column("tools_json")),
                 "monitor_flags": pa.array([sorted({f["detector"] for f in fl or []})
                                            for fl in v.column("monitor_flags").to_pylist()], pa.list_(pa.string())),
                 "monitor_score": pc.fill_null(v.column("monitor_score"), 0.0),  # older parts: no monitor
                 "monitor_rationale": pc.fill_null(v.column("monitor_rationale"), "")}
        schema = arrow_schema(TrajectoryRow)
        for name in TRAJECTORY_ADDED:
            out = out.append_column(schema.field(name), pc.cast(added[name], schema.field(name).type))
        out, stats = _scan(ctx, out, rejects)
        messages, malformed = canonical_tool_calls(out.column("messages"))
        out = out.set_column(out.schema.get_field_index("messages"), out.schema.field("messages"), messages)
        out = out.append_column(schema.field("malformed_tool_calls"), malformed)
        return ShardResult(out, rejects, {"passed": pc.sum(out.column("passed")).as_py() or 0,
                                          "malformed_tool_calls": int(pc.sum(malformed).as_py() or 0), **stats})

    def summarize(self, ctx: StageContext, shard_stats: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-shard counters summed; the secret scan's become the `secrets` section (publish requires it)."""
        stats = super().summarize(ctx, shard_stats)
        rows = stats.pop("secret_rows", {})
        stats["secrets"] = {"action": ctx.config.export.secrets.action, "detectors": stats.pop("secret_hits", {}),
                            "rows_redacted": rows.get("redacted", 0), "rows_rejected": rows.get("rejected", 0),
                            "scanner": scanner_version()}
        return stats

    def finalize(self, ctx: StageContext, out_dir: str, stats: dict[str, Any], upstream: dict[str, Manifest]) -> None:
        """Write the derived configs, gate each, then the card (all before the manifest).

        Streamed: a config's rows are derived chunk by chunk (see DERIVED) and written in files of
        `rows_per_shard` rows as they come; only the scalar columns its gate reads are kept for the
        whole config. A failed gate leaves that config's files for inspection (no card, no manifest:
        nothing is committed; a re-run starts the folder afresh). Failures named in `--accept-gate`
        are committed and listed in the card, with those of the upstream stages."""
        store, cfg = ctx.store, ctx.config.export
        fp = posixpath.basename(out_dir)
        parts = sorted(store.fs.glob(posixpath.join(out_dir, "trajectories", "*.parquet")))
        counts = {"trajectories": store.num_rows(parts)}
        suites = gate_suites(self, ctx.config)
        secrets, scanner = stats.setdefault("secrets", {}), Scanner(cfg.secrets.detectors)
        options = ParquetOptions.of(cfg.parquet)
        for name in cfg.configs:
            folder, suite = posixpath.join(out_dir, name), suites[f"export.{name}"]
            store.remove(folder)  # a re-run after a failed gate or a crash starts clean (the card globs it)
            writer, gated = FileWriter(store, folder, fp, cfg.rows_per_shard, CONFIG_MODELS[name], options), []
            for chunk in DERIVED[name](ctx, parts, upstream, **({"counts": secrets} if name == "rl_tokens" else {})):
                if name in SCANNED:  # environment text (instruction, files, tests) is scanned here
                    chunk, dropped, redacted = scan_table(chunk, SCANNED[name], scanner, cfg.secrets.action, "env_id")
                    secrets[f"{name}_rows_redacted"] = secrets.get(f"{name}_rows_redacted", 0) + redacted
                    secrets[f"{name}_rows_rejected"] = secrets.get(f"{name}_rows_rejected", 0) + len(dropped)
                writer.add(chunk)
                gated.append(chunk.select(gate_columns(f"export.{name}", chunk.schema, suite)))
            n = writer.close()
            report = check_gate(ctx, f"export.{name}", suite, pa.concat_tables(gated) if gated else pa.table({}),
                                {"rows": n}, folder, posixpath.join(out_dir, f"gate.{name}.json"))
            stats.setdefault("gate_accepted", []).extend(report["accepted"])
            counts[name] = n
        stats["configs"] = counts
        detectors = secrets.setdefault("detectors", {})
        for k, n in scanner.hits.items():
            detectors[k] = detectors.get(k, 0) + n
        accepted = [(n, a) for n, m in sorted(upstream.items()) for a in m.gate.get("accepted", [])]
        accepted += [("export", brief_failure(f)) for f in stats.get("gate_accepted", [])]
        store.write_text(posixpath.join(out_dir, "README.md"), dataset_card(ctx, stats, fp, accepted,
                                                                           upstream=upstream, out_dir=out_dir))


def sft(ctx: StageContext, t: pa.Table, upstream: dict[str, Manifest]) -> pa.Table:
    """Verified successes, with `train`: the per-message mask of the model's turns."""
    t = t.filter(pc.and_(t["passed"], pc.equal(t["status"], "ok")))
    return t.append_column(arrow_schema(SFTRow).field("train"), train_mask(t.column("messages")))


def rl(ctx: StageContext, t: pa.Table | None, upstream: dict[str, Manifest]) -> pa.Table:
    every = ctx.store.read_records(upstream["calibrate"].parts, Calibration)
    proven = {c.env_id for c in every if c.passes > 0}  # a verified pass (never a hack-flagged one) in this build
    calib = [c for c in every if 0 < c.passes < c.attempts]
    envs = load_envs(ctx, upstream["synthesize"], {c.env_id for c in calib})
    # only environments proven solvable: a reference solution, or some teacher's verified pass
    calib = [c for c in calib if envs[c.env_id].oracle == "present" or c.env_id in proven]
    rows = [RLRow(env_id=c.env_id, family=c.family, level=c.level, source=envs[c.env_id].source,
                  instruction=envs[c.env_id].instruction, workdir=envs[c.env_id].workdir,
                  image=envs[c.env_id].image or "", teacher=c.teacher, harness=c.harness, attempts=c.attempts,
                  solve_rate=c.solve_rate,
                  ci_low=c.ci_low, ci_high=c.ci_high, difficulty=c.label,
                  env_spec_json=rl_spec_json(envs[c.env_id], ctx.config.export.rl.include_solutions),
                  license=getattr(envs[c.env_id], "license", None) or "", kind=envs[c.env_id].kind,
                  test_strength=envs[c.env_id].audit.strength,
                  pooled_difficulty=c.pooled_label, pooled_solve_rate=c.pooled_solve_rate, pooled_teacher=c.pooled_teacher)
            for c in calib]
    return to_table(RLRow, rows)


def preference(ctx: StageContext, t: pa.Table, upstream: dict[str, Manifest]) -> pa.Table:
    """Pairs (success, failure) of the same environment *and the same prompt* (system + instruction
    messages and tool schemas identical: a continuation only compares with one written for the same
    context), by rollout id order, as many as the smaller side has. Hack-flagged attempts are
    failures here: preferring the clean success over them is what a preference set should teach.
    Both sides hold model turns: an attempt without any (e.g. an `agent_timeout` before the first
    answer) is never paired, as a trainer can learn nothing from an empty side."""
    wins, losses = defaultdict(list), defaultdict(list)
    for r in t.select(PREFERENCE_COLUMNS).to_pylist():
        head = next((i for i, m in enumerate(r["messages"]) if m["role"] == "assistant"), None)
        if head is None:
            continue
        key = (r["env_id"], json.dumps(r["messages"][:head], sort_keys=True), r["tools_json"])
        if r["passed"]:
            wins[key].append((head, r))
        elif r["status"] not in INFRA_STATUSES:  # a hacked attempt is a fine `rejected`
            losses[key].append((head, r))
    rows = []
    for key in sorted(wins):
        for (head, w), (_, lo) in zip(sorted(wins[key], key=lambda x: x[1]["rollout_id"]),
                                      sorted(losses.get(key, []), key=lambda x: x[1]["rollout_id"])):
            msgs = [ExportMessage.model_validate(m) for m in w["messages"]]
            lose = [ExportMessage.model_validate(m) for m in lo["messages"]]
            rows.append(PreferenceRow(env_id=w["env_id"], family=w["family"], level=w["level"], prompt=msgs[:head],
                                      chosen=msgs[head:], rejected=lose[head:], chosen_id=w["rollout_id"],
                                      rejected_id=lo["rollout_id"], chosen_reward=w["reward"],
                                      rejected_reward=lo["reward"], tools_json=w["tools_json"], tools=w["tools"],
                                      chosen_turns=_model_turns(msgs[head:]), rejected_turns=_model_turns(lose[head:]),
                                      chosen_monitor_score=w["monitor_score"] or 0.0,
                                      rejected_monitor_score=lo["monitor_score"] or 0.0))
    return to_table(PreferenceRow, rows)


def _model_turns(messages: list[ExportMessage]) -> int:
    return sum(m.role == "assistant" for m in messages)


def _sft_chunks(ctx: StageContext, parts: list[str], upstream: dict[str, Manifest]) -> Iterator[pa.Table]:
    for t in ctx.store.iter_tables(parts, TrajectoryRow):  # one trajectories part at a time
        yield sft(ctx, t, upstream)


def _rl_chunks(ctx: StageContext, parts: list[str], upstream: dict[str, Manifest]) -> Iterator[pa.Table]:
    yield rl(ctx, None, upstream)  # one row per (environment, teacher): bounded by the catalogue


def _preference_chunks(ctx: StageContext, parts: list[str], upstream: dict[str, Manifest]) -> Iterator[pa.Table]:
    """Pairs never cross environments and come out in environment order: the environments with both
    a success and a counted failure are taken in groups of about `rows_per_shard` rollouts, each
    group read across every part (filtered on env_id), paired as the whole table would be."""
    store, counts = ctx.store, defaultdict(lambda: [0, 0, 0])  # env_id -> [rollouts, wins, losses]
    for t in store.iter_tables(parts, TrajectoryRow, columns=["env_id", "passed", "status"]):
        for env_id, passed, status in zip(*(t.column(c).to_pylist() for c in ("env_id", "passed", "status"))):
            c = counts[env_id]
            c[0] += 1
            if passed:
                c[1] += 1
            elif status not in INFRA_STATUSES:  # what `preference` takes as a failure
                c[2] += 1
    groups, group, held = [], [], 0
    for env_id in sorted(e for e, (_, wins, losses) in counts.items() if wins and losses):
        if group and held + counts[env_id][0] > ctx.config.export.rows_per_shard:
            groups.append(group)
            group, held = [], 0
        group.append(env_id)
        held += counts[env_id][0]
    if group:
        groups.append(group)
    for ids in groups:
        t = store.read_table(parts, TrajectoryRow, columns=PREFERENCE_COLUMNS, filters=[("env_id", "in", ids)])
        yield preference(ctx, t, upstream)


# config -> its rows, chunk by chunk, in output order, from the trajectories parts (memory: one chunk)
DERIVED: dict[str, Callable[[StageContext, list[str], dict[str, Manifest]], Iterator[pa.Table]]] = {
    "sft": _sft_chunks, "rl": _rl_chunks, "preference": _preference_chunks, "rl_tokens": rl_tokens_chunks}
CONFIG_MODELS = {"sft": SFTRow, "rl": RLRow, "preference": PreferenceRow, "rl_tokens": RLTokensRow}
