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
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from ..schemas.arrow import arrow_schema, to_table
from ..schemas.calibration import Calibration
from ..schemas.common import INFRA_STATUSES, Reject
from ..schemas.config import ExportFilters
from ..schemas.environment import EnvSpec
from ..schemas.export import PreferenceRow, RLRow, TrajectoryRow
from ..schemas.trajectory import Message, Rollout
from ..schemas.verdict import Verdict
from .engine import GateFailed, Manifest, Shard, ShardResult, Stage, StageContext, upstream_parts

ROLLOUT_COLUMNS = ["rollout_id", "env_id", "teacher", "harness", "sample", "messages", "tools_json", "status",
                   "turns", "prompt_tokens", "completion_tokens", "wall_s"]
VERDICT_COLUMNS = ["rollout_id", "verified", "passed", "reward", "tests", "hack_flags", "quality", "mode", "changes",
                   "unexpected", "counterfactual"]
TRAJECTORY_ADDED = [n for n in TrajectoryRow.model_fields if n not in ROLLOUT_COLUMNS]


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


class ExportStage(Stage):
    name = "export"
    requires = ("calibrate", "verify", "rollout", "synthesize")
    config_sections = ("export",)
    output = TrajectoryRow

    def part_path(self, shard: Shard, fingerprint: str) -> str:
        return f"trajectories/train-{fingerprint}-{shard.index:05d}.parquet"

    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        return [Shard(index=i, payload={"part": p}) for i, p in enumerate(upstream_parts(upstream, "rollout"))]

    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        """Column-wise join on Arrow: rollout columns (messages, tools) are taken, never turned into
        records; verdict, quality, environment and calibration columns are gathered beside them by
        index. Per-row Python only decides the reject reason, from a handful of scalars."""
        store, filters = ctx.store, ctx.config.export.filters
        table = store.read_table([shard.payload["part"]], Rollout, columns=ROLLOUT_COLUMNS)
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
        out = table.take(pa.array(keep, pa.int64()))
        v = vt.take(pa.array(keep_v, pa.int64()))
        q = v.column("quality").combine_chunks()
        envs = store.read_table(upstream["synthesize"].parts, EnvSpec, columns=["env_id", "family", "level"])
        calib = store.read_table(upstream["calibrate"].parts, Calibration,
                                 columns=["env_id", "teacher", "label", "solve_rate"])
        env_idx, cal_idx = _index(envs, "env_id"), _index(calib, "env_id", "teacher")
        env_ids, teachers = out.column("env_id").to_pylist(), out.column("teacher").to_pylist()
        e = envs.take(pa.array([env_idx[x] for x in env_ids], pa.int64()))
        c = calib.take(pa.array([cal_idx[k] for k in zip(env_ids, teachers)], pa.int64()))
        added = {"family": e.column("family"), "level": e.column("level"), "passed": v.column("passed"),
                 "reward": v.column("reward"), "tests_passed": _list_sum(v.column("tests"), "passed"),
                 "tests_total": pc.list_value_length(v.column("tests")), "hack_flags": v.column("hack_flags"),
                 "step_labels": q.field("labels"), "difficulty": c.column("label"), "solve_rate": c.column("solve_rate"),
                 "verification_mode": v.column("mode"), "unexpected_changes": v.column("unexpected"),
                 "changed_paths": pc.fill_null(pc.struct_field(v.column("changes").combine_chunks(), "total"), 0),
                 "counterfactual": v.column("counterfactual"),
                 **{n: q.field(n) for n in ("inspect_before_act", "act_verify_share", "ends_with_verify",
                                            "repeated_commands", "failed_commands", "recoveries")}}
        schema = arrow_schema(TrajectoryRow)
        for name in TRAJECTORY_ADDED:
            out = out.append_column(schema.field(name), pc.cast(added[name], schema.field(name).type))
        return ShardResult(out, rejects, {"passed": pc.sum(out.column("passed")).as_py() or 0})

    def finalize(self, ctx: StageContext, out_dir: str, stats: dict[str, Any], upstream: dict[str, Manifest]) -> None:
        """Write the derived configs, gate each, then the card (all before the manifest)."""
        from ..expectations.gate import run_gate

        store = ctx.store
        fp = posixpath.basename(out_dir)
        table = store.read_table(store.fs.glob(posixpath.join(out_dir, "trajectories", "*.parquet")), TrajectoryRow)
        counts = {"trajectories": table.num_rows}
        for name in ctx.config.export.configs:
            derived = DERIVED[name](ctx, table, upstream)
            report = run_gate(f"export.{name}", derived, {"rows": derived.num_rows})
            store.write_json(posixpath.join(out_dir, f"gate.{name}.json"), report)
            if not report["success"]:
                raise GateFailed(f"gate of export config {name!r} failed: {report['failures']}")
            n, size = derived.num_rows, ctx.config.export.rows_per_shard
            for i, start in enumerate(range(0, n, size)):
                store.write_table(posixpath.join(out_dir, name, f"train-{fp}-{i:05d}.parquet"),
                                  derived.slice(start, size))
            counts[name] = n
        stats["configs"] = counts
        store.write_text(posixpath.join(out_dir, "README.md"), dataset_card(ctx, stats, fp))


def sft(ctx: StageContext, t: pa.Table, upstream: dict[str, Manifest]) -> pa.Table:
    return t.filter(pc.and_(t["passed"], pc.equal(t["status"], "ok")))


def rl(ctx: StageContext, t: pa.Table, upstream: dict[str, Manifest]) -> pa.Table:
    envs = {e.env_id: e for e in ctx.store.read_records(upstream["synthesize"].parts, EnvSpec)}
    rows = [RLRow(env_id=c.env_id, family=c.family, level=c.level, source=envs[c.env_id].source,
                  instruction=envs[c.env_id].instruction, workdir=envs[c.env_id].workdir,
                  image=envs[c.env_id].image or "", teacher=c.teacher, attempts=c.attempts, solve_rate=c.solve_rate,
                  ci_low=c.ci_low, ci_high=c.ci_high, difficulty=c.label,
                  env_spec_json=envs[c.env_id].model_dump_json(exclude={"image"}))
            for c in ctx.store.read_records(upstream["calibrate"].parts, Calibration) if 0 < c.passes < c.attempts]
    return to_table(RLRow, rows)


def preference(ctx: StageContext, t: pa.Table, upstream: dict[str, Manifest]) -> pa.Table:
    """Pairs (success, failure) of the same environment *and the same prompt* (system + instruction
    messages and tool schemas identical: a continuation only compares with one written for the same
    context), by rollout id order, as many as the smaller side has. Hack-flagged attempts are
    failures here: preferring the clean success over them is what a preference set should teach."""
    wins, losses = defaultdict(list), defaultdict(list)
    for r in t.select(["rollout_id", "env_id", "family", "level", "messages", "tools_json", "status", "passed",
                       "reward", "hack_flags"]).to_pylist():
        head = next((i for i, m in enumerate(r["messages"]) if m["role"] == "assistant"), len(r["messages"]))
        key = (r["env_id"], json.dumps(r["messages"][:head], sort_keys=True), r["tools_json"])
        if r["passed"]:
            wins[key].append((head, r))
        elif r["status"] not in INFRA_STATUSES:  # a hacked attempt is a fine `rejected`
            losses[key].append((head, r))
    rows = []
    for key in sorted(wins):
        for (head, w), (_, lo) in zip(sorted(wins[key], key=lambda x: x[1]["rollout_id"]),
                                      sorted(losses.get(key, []), key=lambda x: x[1]["rollout_id"])):
            msgs = [Message.model_validate(m) for m in w["messages"]]
            lose = [Message.model_validate(m) for m in lo["messages"]]
            rows.append(PreferenceRow(env_id=w["env_id"], family=w["family"], level=w["level"], prompt=msgs[:head],
                                      chosen=msgs[head:], rejected=lose[head:], chosen_id=w["rollout_id"],
                                      rejected_id=lo["rollout_id"], chosen_reward=w["reward"],
                                      rejected_reward=lo["reward"], tools_json=w["tools_json"]))
    return to_table(PreferenceRow, rows)


DERIVED: dict[str, Callable[[StageContext, pa.Table, dict[str, Manifest]], pa.Table]] = {
    "sft": sft, "rl": rl, "preference": preference}


def dataset_card(ctx: StageContext, stats: dict[str, Any], fingerprint: str) -> str:
    """A Hub dataset card whose YAML header declares the non-empty configs (what `load_dataset` reads)."""
    counts = stats.get("configs", {})
    configs = [{"config_name": name, "data_files": [{"split": "train", "path": f"{name}/train-{fingerprint}-*.parquet"}]}
               for name in ["trajectories", *ctx.config.export.configs] if counts.get(name)]
    header = {"configs": configs, "tags": ["agent-trajectories", "trajforge"], "license": "other"}
    cfg = ctx.config
    families = ", ".join(sorted({f.name for f in cfg.synthesize.families})) or "imported / synthesized"
    rows = "\n".join(f"| `{name}` | {n} |" for name, n in counts.items())
    return (f"---\n{yaml.safe_dump(header, sort_keys=False)}---\n\n# {cfg.dataset}\n\n"
            f"Agent trajectories built by trajforge (build `{ctx.build_id}`).\n\n"
            f"- teachers: {', '.join(f'`{t.label}`' for t in cfg.teachers)}\n- environment families: {families}\n"
            f"- samples per environment: {cfg.rollout.samples_per_env}"
            f"{' (+ adaptive rounds)' if cfg.calibrate.adaptive else ''}\n"
            f"- rejected rollouts: {stats.get('reject_reasons', {}) or 'none'}\n\n"
            f"| config | rows |\n|---|---|\n{rows}\n\n"
            "`trajectories` holds every verified rollout, success or failure, with OpenAI-format `messages` "
            "exactly as produced (tool calls and tool outputs), `tools_json` (the tool schemas offered), the "
            "verdict (`passed`, `reward` = fraction of hidden tests passed, `status` from the failure taxonomy), "
            "`hack_flags`, quality signals (`step_labels` inspect/act/verify, `act_verify_share`, "
            "`inspect_before_act`, ...) and the environment's calibrated `difficulty` and `solve_rate`. "
            "`sft` keeps the verified successes; `rl` lists environments solved sometimes (0 < p < 1) with "
            "their full spec; `preference` pairs a success with a failure of the same environment. "
            "Configs without rows are not declared.\n")
