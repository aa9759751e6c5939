"""What a report shows, read from a build's committed outputs through the run store.

Two kinds of numbers, kept apart so the page never invents one:
- *figures*: values copied from a stage's `stats.json` (summed over its adaptive-round instances:
  `rollout`, `rollout.r1`, ...; `calibrate` is the final instance only, since each round's calibrate
  covers every verify so far) or a manifest's rows/rejects. Each is keyed by its path, e.g.
  `("verify", "hacks", "hardcoded_answer")`, and the page carries that key next to the number
  (`data-figure`), so a test can check every figure against the stats files;
- *breakdowns*: per teacher / family / episode views derived from the committed Parquet rows
  (per-teacher status, solve-rate distributions, turn and token histograms). Their totals equal the
  matching figures (the stats are computed from the same rows).
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections import Counter, defaultdict
from typing import Any

from pydantic import BaseModel, Field

from ...schemas.build import BuildRecord
from ...tasks.engine.store import RunStore

FigureKey = tuple[str, ...]
ROLLOUT_COLUMNS = ["rollout_id", "env_id", "teacher", "harness", "sample", "messages", "steps", "usage", "prompt_tokens",
                   "completion_tokens", "turns", "status", "error", "wall_s", "tool_call_errors"]
VERDICT_COLUMNS = ["rollout_id", "env_id", "teacher", "sample", "status", "verified", "reward", "tests_passed",
                   "passed", "tests", "hack_flags", "hacks", "quality", "verifier_output", "mode", "changes",
                   "unexpected", "counterfactual", "reverted", "monitor_flags", "monitor_score", "monitor_rationale"]


class StageRow(BaseModel):
    """One stage instance of the build: what `build.json` and its manifest say."""

    instance: str
    stage: str
    status: str
    rows: int | None = None
    rejects: int | None = None
    reject_reasons: dict[str, int] = {}
    gate: str = ""
    fingerprint: str = ""
    reused_from: str | None = None
    shard_seconds: float | None = Field(None, description="stats.json `shard_seconds`: summed shard task time")
    wall_s: float | None = Field(None, description="commit-to-commit time in this build; None when reused")


class BuildFacts(BaseModel):
    """A build's stage table and figures: what the comparison of two builds diffs."""

    build_id: str
    dataset: str
    status: str
    created_at: str
    finished_at: str | None = None
    stages: list[StageRow]
    stats: dict[str, list[dict[str, Any]]] = Field(description="stage -> stats.json of each counted instance")
    manifests: dict[str, dict[str, Any]] = Field(default_factory=dict, description="instance -> manifest.json")

    def figure(self, key: FigureKey) -> float | None:
        """The value at `key` = (stage, *path in stats.json), summed over the stage's counted instances."""
        stage, *path = key
        total, found = 0.0, False
        for s in self.stats.get(stage, []):
            node: Any = s
            for p in path:
                node = node.get(p) if isinstance(node, dict) else None
            if isinstance(node, (int, float)) and not isinstance(node, bool):
                total, found = total + node, True
        return total if found else None

    def keys(self, stage: str, *path: str) -> list[str]:
        """The sub-keys of a stats dict (e.g. the hack kinds of `verify.hacks`) over all counted instances."""
        out: dict[str, None] = {}
        for s in self.stats.get(stage, []):
            node: Any = s
            for p in path:
                node = node.get(p) if isinstance(node, dict) else None
            if isinstance(node, dict):
                out.update(dict.fromkeys(node))
        return sorted(out)

    def comparable(self) -> dict[FigureKey, float]:
        """Every numeric figure of the build's stats (flattened), for the comparison with another build."""
        out: dict[FigureKey, float] = {}
        skip = {"shard_seconds", "endpoints", "endpoint_errors", "endpoint_rate_limited", "round_plan"}

        def walk(stage: str, node: Any, path: tuple[str, ...]) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if k not in skip:
                        walk(stage, v, (*path, k))
            elif isinstance(node, (int, float)) and not isinstance(node, bool):
                key = (stage, *path)
                out[key] = out.get(key, 0.0) + node

        for stage, instances in self.stats.items():
            for s in instances:
                walk(stage, s, ())
        return out


def run_order(rec: BuildRecord) -> list[str]:
    """The build's stage instances in the order they ran (`build.json` keeps them sorted by name): the
    default pipeline's stages, each adaptive round's instances after the loop's deciding stage, the
    stages after it last; stages the pipeline does not name at the end."""
    from ...tasks.pipeline import PIPELINE

    names = PIPELINE.names
    after = names.index(PIPELINE.loop.after) if PIPELINE.loop else len(names)

    def key(instance: str) -> tuple:
        stage, _, rnd = instance.partition(".r")
        r = int(rnd) if rnd.isdigit() else 0
        i = names.index(stage) if stage in names else len(names) + 1000
        if r:
            return (after, r, i, instance)
        return (i + 1000 if i > after else i, 0, 0, instance)

    return sorted(rec.stages, key=key)


def _parse_time(value: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def build_facts(store: RunStore, build_id: str) -> BuildFacts:
    """The stage table and stats of a build (FileNotFoundError naming the build when it has no build.json)."""
    rec = store.read_build(build_id)
    if rec is None:
        raise FileNotFoundError(f"build {build_id!r} not found under {store.url(store.root)} "
                                f"(builds: {', '.join(store.builds()) or 'none'})")
    stages, stats, manifests = [], defaultdict(list), {}
    t_prev = _parse_time(rec.created_at)
    final: dict[str, dict] = {}
    for instance in run_order(rec):
        e = rec.stages[instance]
        stage = instance.split(".")[0]
        m = None
        if e.manifest and store.exists(posixpath.join(e.manifest, "manifest.json")):
            m = manifests[instance] = store.read_json(posixpath.join(e.manifest, "manifest.json"))
        wall = None
        if m is not None and e.status == "committed" and m.get("build_id") == build_id:
            t = _parse_time(m.get("created_at"))
            if t is not None and t_prev is not None:
                wall = max(0.0, (t - t_prev).total_seconds())
            t_prev = t or t_prev
        gate = ""
        if m is not None:
            gate = ("pass" if not m["gate"].get("accepted") else "accepted") if m["gate"].get("success", True) else "fail"
        elif e.status == "failed" and e.gate and e.gate.get("failures"):
            gate = "fail"
        stages.append(StageRow(
            instance=instance, stage=stage, status=e.status, rows=e.rows, rejects=e.rejects,
            reject_reasons=(m or {}).get("reject_reasons", {}), gate=gate, fingerprint=e.fingerprint,
            reused_from=e.reused_from if e.status == "reused" else None,
            shard_seconds=(m or {}).get("stats", {}).get("shard_seconds"), wall_s=wall))
        if m is None:
            continue
        if stage == "calibrate":
            final[stage] = m["stats"]
        else:
            stats[stage].append(m["stats"])
    for stage, s in final.items():
        stats[stage] = [s]
    return BuildFacts(build_id=rec.build_id, dataset=rec.dataset, status=rec.status, created_at=rec.created_at,
                      finished_at=rec.finished_at, stages=stages, stats=dict(stats), manifests=manifests)


def previous_committed(store: RunStore, build_id: str) -> str | None:
    """The newest committed build of the dataset created before `build_id` (ids sort by creation time)."""
    for b in reversed([b for b in store.builds() if b < build_id]):
        rec = store.read_build(b)
        if rec is not None and rec.status == "committed":
            return b
    return None


def instances(rec: BuildRecord, stage: str) -> list[str]:
    """The committed (or reused) instances of `stage` in the build, in run order."""
    return [i for i in run_order(rec) if i.split(".")[0] == stage and rec.committed(i)]


def parts(facts: BuildFacts, instance: str) -> list[str]:
    return list(facts.manifests.get(instance, {}).get("parts", []))


class Breakdowns(BaseModel):
    """Views derived from the committed rows (see the module docstring)."""

    status_by_teacher: dict[str, dict[str, int]] = {}
    turns: dict[str, list[int]] = {}
    completion_tokens: dict[str, list[int]] = {}
    throughput: dict[str, dict[str, float]] = {}
    calibration: list[dict[str, Any]] = []
    step_labels: dict[str, dict[str, int]] = {}
    repeated_commands: dict[str, int] = {}
    recoveries: dict[str, int] = {}
    flagged: dict[str, list[str]] = {}
    harness_header: list[str] = []
    harnesses: list[list[Any]] = []  # per (teacher, harness), when the build ran more than one harness


def breakdowns(facts: BuildFacts, episodes: list[dict[str, Any]], calibration: list[dict[str, Any]]) -> Breakdowns:
    """Per-teacher views of the episode index rows (one per rollout, see `episodes.index_row`)."""
    from ...tasks.dataset.harness_compare import HEADER, HarnessComparison

    b = Breakdowns(calibration=calibration)
    compare = HarnessComparison()
    status: dict[str, Counter] = defaultdict(Counter)
    tokens_s: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    labels: dict[str, Counter] = defaultdict(Counter)
    flagged: dict[str, list[str]] = defaultdict(list)
    for e in episodes:
        t = e["teacher"]
        status[t][e["status"]] += 1
        b.turns.setdefault(t, []).append(e["turns"])
        b.completion_tokens.setdefault(t, []).append(e["completion_tokens"])
        acc = tokens_s[t]
        acc[0] += e["completion_tokens"]
        acc[1] += e["latency_s"]
        acc[2] += 1
        for lab in ("inspect", "act", "verify"):
            labels[t][lab] += e["steps"].get(lab, 0)
        b.repeated_commands[t] = b.repeated_commands.get(t, 0) + e["repeated"]
        b.recoveries[t] = b.recoveries.get(t, 0) + e["recoveries"]
        for kind in e["hacks"]:
            flagged[kind].append(e["id"])
        compare.add(t, e.get("harness"), passed=e["passed"], status=e["status"], turns=e["turns"],
                    completion_tokens=e["completion_tokens"], flagged=bool(e["hacks"]),
                    act_verify_share=e.get("act_verify_share"))
    b.status_by_teacher = {t: dict(c) for t, c in sorted(status.items())}
    b.throughput = {t: {"completion_tokens": a[0], "teacher_seconds": round(a[1], 3), "episodes": a[2],
                        "tokens_per_s": round(a[0] / a[1], 2) if a[1] > 0 else 0.0}
                    for t, a in sorted(tokens_s.items())}
    b.step_labels = {t: dict(c) for t, c in sorted(labels.items())}
    b.flagged = dict(flagged)
    if len(compare.harnesses) > 1:
        b.harness_header, b.harnesses = HEADER, compare.rows()
    return b


def audit_survivors(store: RunStore, facts: BuildFacts, envs: dict[str, dict], cap: int = 20) -> list[dict[str, str]]:
    """The test audit's survivors (tasks/envs/audit.py): rejected `weak_tests` environments (from the synthesize
    stage's rejects) and kept, flagged ones (`EnvSpec.audit` with `synthesize.audit: flag`), at most `cap`."""
    from ...schemas.common import Reject

    out: list[dict[str, str]] = []
    for instance, m in facts.manifests.items():
        path = posixpath.join(m.get("dir", ""), "rejects.parquet")
        if instance.split(".")[0] != "synthesize" or not m.get("reject_reasons", {}).get("weak_tests") \
                or not store.exists(path):
            continue
        for r in store.read_table([path], Reject).to_pylist():
            if r["reason"] == "weak_tests":
                out.append({"env_id": r["key"], "outcome": "rejected", "mutant": r["detail"][:400]})
    for env_id, e in sorted(envs.items()):
        for m in ((e.get("audit") or {}).get("survivors") or []):
            out.append({"env_id": env_id, "outcome": "kept (flagged)",
                        "mutant": f"{m['mutator']} of {m['path']}: {m['what']}"[:400]})
    return out[:cap]
