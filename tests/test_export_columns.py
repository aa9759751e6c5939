"""The export's columns and files (issue 12, parts 3 and 5), on committed-looking upstream parts (no
Docker): provenance columns, the SFT train mask, the opt-in `rl_tokens` config, failures kept in
`trajectories`, every config loaded back with `datasets`; row groups bounded in bytes, a page index,
files bounded, one schema per config across files."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trajforge.schemas.arrow import arrow_schema
from trajforge.schemas.calibration import Calibration
from trajforge.schemas.common import ChangeSet, FileSpec
from trajforge.schemas.config import load_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.export import PreferenceRow, RLRow, RLTokensRow, SFTRow, TrajectoryRow
from trajforge.schemas.trajectory import FunctionCall, Message, Rollout, ToolCall, TurnUsage
from trajforge.schemas.verdict import Quality, TestResult, Verdict
from trajforge.tasks.engine import Manifest, StageContext, execute_shard
from trajforge.tasks.export import ExportStage

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"trajectories": TrajectoryRow, "sft": SFTRow, "rl": RLRow, "preference": PreferenceRow,
          "rl_tokens": RLTokensRow}


def messages(i: int, output: str = "") -> list[Message]:
    call = ToolCall(id="c1", function=FunctionCall(name="bash", arguments=f'{{"command": "cat f{i}"}}'))
    return [Message(role="system", content="s"), Message(role="user", content="task"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", name="bash", content=f"[exit code 0]\n{i}\n{output}"),
            Message(role="assistant", content="done", reasoning_content=f"thought {i}" if i == 1 else None)]


def build_export(tmp: Path, overrides: dict | None = None, n: int = 6, output=lambda i: "",
                 env_files: list[FileSpec] | None = None, verifier_output=lambda i: "", passed=None,
                 messages_of=None, tools_of=lambda i: "[]", usage_of=None) -> tuple:
    """Upstream parts for `n` rollouts over two environments (even: passed, unless `passed(i)` says; then
    calibration counts what it says), every export shard run, then `finalize` (derived configs, their
    gates, the card). `messages_of(i, output)`, `tools_of(i)` (tools_json) and `usage_of(i)` replace
    rollout i's messages, tools and turns. Returns (ctx, export dir, stats, shard infos)."""
    cfg = load_config(ROOT / "configs/replay.yaml", {"runs": str(tmp), "dataset": "cols", **(overrides or {})})
    ctx = StageContext.create(cfg, "b")
    teacher = cfg.teachers[0].label
    envs = [EnvSpec(env_id=e, family="fam", level=1, seed=k, source=f"procedural:fam{k}", instruction="do it",
                    files=list(env_files or []), tests=[FileSpec(path="test_x.py", content="def test_a(): pass")],
                    solution=["echo SOLUTION-STEP"], image="trajforge/env:0123456789abcdef",
                    kind="tools" if k else "terminal")
            for k, e in enumerate(["e0", "e1"])]
    usage = [TurnUsage(turn=1, completion_tokens=3, completion_token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3]),
             TurnUsage(turn=2, completion_tokens=1, completion_token_ids=[9], logprobs=[-0.5])]
    rollouts = [Rollout(rollout_id=f"r{i:04d}", env_id=f"e{i // 2 % 2}", teacher=teacher, harness="h", sample=i,
                        messages=(messages_of or messages)(i, output(i)), tools_json=tools_of(i),
                        status="ok" if i % 2 == 0 else "max_turns", turns=2,
                        usage=usage_of(i) if usage_of else usage if i < 2 else [], prompt_tokens=10,
                        completion_tokens=5, wall_s=1.0)
                for i in range(n)]
    won = [passed(i) if passed else i % 2 == 0 for i in range(n)]
    verdicts = [Verdict(rollout_id=r.rollout_id, env_id=r.env_id, teacher=teacher, sample=r.sample, status=r.status,
                        verified=True, passed=won[i], reward=1.0 if won[i] else 0.0,
                        tests=[TestResult(name="a", passed=won[i])], verifier_output=verifier_output(i),
                        quality=Quality(labels=["act"]), mode="in_place",
                        changes=ChangeSet(added=[f"/home/agent/work/out{i}.txt"], total=1))
                for i, r in enumerate(rollouts)]
    calib = [Calibration(env_id=e, family="fam", level=1, teacher=teacher, attempts=4, passes=2, excluded=0,
                         solve_rate=0.5, ci_low=0.1, ci_high=0.9, label="medium", certain=False,
                         pooled_label="hard" if e == "e1" else "medium", pooled_solve_rate=0.2 if e == "e1" else 0.5,
                         pooled_teacher="strong") for e in ("e0", "e1")]
    if passed:
        for c in calib:
            mine = [won[i] for i, r in enumerate(rollouts) if r.env_id == c.env_id]
            c.attempts, c.passes = len(mine), sum(mine)
    up = {}
    for name, model, rows in [("synthesize", EnvSpec, envs), ("rollout", Rollout, rollouts),
                              ("verify", Verdict, verdicts), ("calibrate", Calibration, calib)]:
        path = posixpath.join(ctx.store.root, "up", name, "part-00000.parquet")
        ctx.store.write_records(path, model, rows)
        ctx.store.write_json(posixpath.join(ctx.store.root, "up", name, "_done", "part-00000"),
                             {"finished_at": 1_760_000_000.0})
        up[name] = Manifest(stage=name, fingerprint="x", build_id="b", dir=posixpath.dirname(path), parts=[path],
                            rows=len(rows), rejects=0, reject_reasons={}, stats={}, components={}, gate={},
                            created_at="")
    stage, out = ExportStage(), posixpath.join(ctx.store.root, "b", "export", "fpexport")
    infos = [execute_shard(stage, ctx, out, s, up) for s in stage.plan(ctx, up)]
    stats = stage.summarize(ctx, [i["stats"] for i in infos])
    stage.finalize(ctx, out, stats, up)
    return ctx, out, stats, infos


def files(out: str, config: str) -> list[str]:
    return sorted(str(p) for p in Path(out, config).glob("*.parquet"))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return build_export(tmp_path_factory.mktemp("cols"), {"export.configs": ["sft", "rl", "preference", "rl_tokens"]})


def test_trajectories_carry_provenance_and_keep_failures(export):
    ctx, out, _, _ = export
    rows = pq.read_table(files(out, "trajectories")).to_pylist()
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok", "max_turns"}  # failures stay
    t = ctx.config.teachers[0]
    r = next(r for r in rows if r["rollout_id"] == "r0001")
    assert r["model"] and r["sampling"] == {"temperature": t.temperature, "top_p": t.top_p,
                                            "max_tokens": t.max_tokens, "seed": t.seed}
    assert r["created_at"].timestamp() == 1_760_000_000.0 and r["source"] == "procedural:fam0"
    assert r["changes"]["added"] == ["/home/agent/work/out1.txt"] and r["passed"] is False
    assert r["messages"][-1]["reasoning_content"] == "thought 1" and rows[0]["messages"][-1]["reasoning_content"] is None


def test_rows_carry_the_kind_and_the_pooled_difficulty_next_to_the_per_teacher_one(export):
    """Issue 14 part 2 / issue 18: `pooled_*` and `kind` are the environment's, on every row of it."""
    _, out, _, _ = export
    rows = pq.read_table(files(out, "trajectories"), columns=["env_id", "kind", "difficulty", "pooled_difficulty",
                                                              "pooled_solve_rate"]).to_pylist()
    by_env = {r["env_id"]: (r["kind"], r["difficulty"], r["pooled_difficulty"], r["pooled_solve_rate"]) for r in rows}
    assert by_env == {"e0": ("terminal", "medium", "medium", 0.5), "e1": ("tools", "medium", "hard", 0.2)}
    rl = {r["env_id"]: r for r in pq.read_table(files(out, "rl")).to_pylist()}
    assert (rl["e1"]["kind"], rl["e1"]["pooled_difficulty"], rl["e1"]["pooled_teacher"]) == ("tools", "hard", "strong")


def test_verifier_tail_is_bounded(tmp_path):
    _, out, _, _ = build_export(tmp_path, {"export.verifier_tail_chars": 10}, n=2,
                                verifier_output=lambda i: "x" * 50 + "0123456789")
    tails = pq.read_table(files(out, "trajectories"), columns=["verifier_output_tail"]).column(0).to_pylist()
    assert tails == ["0123456789", "0123456789"]


def test_sft_train_mask_and_rl_tokens(export):
    _, out, stats, _ = export
    sft = pq.read_table(files(out, "sft")).to_pylist()
    assert {r["rollout_id"] for r in sft} == {"r0000", "r0002", "r0004"}
    for r in sft:
        assert r["train"] == [m["role"] == "assistant" for m in r["messages"]] == [False, False, True, False, True]
    tokens = pq.read_table(files(out, "rl_tokens")).to_pylist()
    assert sorted(r["rollout_id"] for r in tokens) == ["r0000", "r0001"]
    assert [u["completion_token_ids"] for u in tokens[0]["turns"]] == [[5, 6, 7], [9]]
    assert tokens[0]["turns"][0]["logprobs"] == [-0.1, -0.2, -0.3]
    assert stats["configs"]["rl_tokens"] == 2


def test_rl_has_tests_but_no_solution_unless_asked(export, tmp_path):
    _, out, _, _ = export
    spec = pq.read_table(files(out, "rl")).column("env_spec_json").to_pylist()[0]
    assert "test_x.py" in spec and "SOLUTION-STEP" not in spec
    _, out2, _, _ = build_export(tmp_path, {"export.rl.include_solutions": True}, n=2)
    assert "SOLUTION-STEP" in pq.read_table(files(out2, "rl")).column("env_spec_json").to_pylist()[0]


def test_every_config_loads_with_datasets(export):
    import datasets

    _, out, stats, _ = export
    for config in ("trajectories", "sft", "rl", "preference", "rl_tokens"):
        ds = datasets.load_dataset(out, config, split="train")
        assert len(ds) == stats["configs"][config] > 0, config
    assert "train" in datasets.load_dataset(out, "sft", split="train").column_names


def test_large_export_is_bounded_with_page_index_and_one_schema(tmp_path):
    """About 1.5 MB of tool output: the plan splits the rollout part, every row group stays under 64 KiB
    uncompressed, each file carries a page index and its config's schema, sft files are bounded too."""
    big = lambda i: f"line {i} " * (800 + 40 * (i % 7))  # noqa: E731  (~5-7 KB a row, varied)
    bound, file_bytes = 64 * 1024, 600 * 1024
    ctx, out, stats, infos = build_export(
        tmp_path, {"export.parquet.row_group_bytes": bound, "export.parquet.file_bytes": file_bytes,
                   "export.rows_per_shard": 10_000, "export.configs": ["sft"]}, n=250, output=big)
    assert len(infos) > 1 and stats["configs"]["trajectories"] == 250
    assert len(files(out, "sft")) > 1
    for config in ("trajectories", "sft"):
        for f in files(out, config):
            pf = pq.ParquetFile(f)
            assert pf.schema_arrow.remove_metadata().equals(arrow_schema(MODELS[config]).remove_metadata()), f
            md = pf.metadata
            assert md.num_row_groups > 1, f
            for g in range(md.num_row_groups):
                rg = md.row_group(g)
                assert rg.total_byte_size <= bound, (f, g, rg.total_byte_size)
                # the page index: page offsets of every column, min/max per page where values are small enough
                assert all(rg.column(c).has_offset_index for c in range(rg.num_columns)), (f, g)
                assert rg.column(0).has_column_index, (f, g)
            assert sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups)) <= file_bytes * 1.5


def test_card_says_why_a_config_is_empty(tmp_path):
    """Every rollout passed: `rl` (no 0 < p < 1) and `preference` (no failure) are empty, and the card says
    why with the counts; a filter that removed rollouts is named with its count (issue 28)."""
    from trajforge.tasks.dataset.card import empty_reasons

    ctx, out, stats, _ = build_export(tmp_path, {"export.configs": ["sft", "rl", "preference"]}, n=6,
                                      passed=lambda i: True)
    assert stats["configs"]["rl"] == 0 and stats["configs"]["preference"] == 0 and stats["configs"]["sft"] == 3
    card = Path(out, "README.md").read_text()
    assert ("- `rl`: 0 rows: no environment had a solve rate strictly between 0 and 1 for a teacher (of 2 "
            "environment x teacher pair(s): 2 solved every attempt, 0 solved none, 0 had no verified attempt)."
            in card), card
    assert ("- `preference`: 0 rows: no environment had both a verified pass and a verified failure (of 2 "
            "environment(s): 2 only passed, 0 only failed)." in card), card
    assert "- `sft`: 0 rows" not in card
    facts = {"counts": {"verified": 6, "passed": 0, "failed": 6}, "outcomes": {"e0": [0, 4], "e1": [0, 2]}}
    why = empty_reasons(ctx, {"trajectories": 6, "sft": 0, "rl": 0, "preference": 0},
                        {"reject_reasons": {"filter_hack": 2, "filter_no_inspect_before_act": 3, "unverified": 1}},
                        facts)
    assert why["sft"] == ("no verified rollout passed (6 verified, 0 passed); `export.filters` removed 5 verified "
                          "rollout(s) before it: `filter_hack` 2, `filter_no_inspect_before_act` 3.")
    assert "0 only passed, 2 only failed" in why["preference"] and "`filter_hack` 2" in why["preference"]
    nothing = empty_reasons(ctx, {"trajectories": 0}, {"reject_reasons": {"unverified": 4}}, {"counts": {}})
    assert nothing["trajectories"] == "no verified rollout was exported (rejected before export: `unverified` 4)."
    assert nothing["rl"] == nothing["trajectories"]


def test_card_defines_every_difficulty_label_with_this_builds_thresholds(export):
    """The card says what `difficulty` means: one row per label (unverified included), thresholds from config."""
    from typing import get_args

    from trajforge.schemas.calibration import Label

    ctx, out, _, _ = export
    card = Path(out, "README.md").read_text()
    section = card[card.index("## Difficulty labels"):]
    for label in get_args(Label):
        assert f"| `{label}` |" in section, label
    assert f"{ctx.config.calibrate.unsolved_below:g}" in section
