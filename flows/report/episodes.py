"""The trajectory browser's data: one compact index row per rollout (inline in the page) and the full
episodes in chunk files loaded on demand.

How it stays responsive at 10k trajectories: the page holds only the index (column arrays, ~100
bytes a rollout) and filters and pages it in the browser (50 rows a page). Opening an episode loads
its chunk, `episodes/chunk-NNNNN.js` (CHUNK episodes each), by adding a `<script src>` tag: pages
opened from `file://` may not `fetch()` local files in Chromium, but they may load scripts. The
writer streams the rollouts one Parquet part at a time, so memory is one part plus the verdicts.
Long texts are cut (`CUT` characters, with the count of what was cut): the Parquet rows stay the truth.
Every string read (rollouts, verdicts, instructions) goes through export's secret scanner in redact mode first.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Callable

from ...schemas.build import BuildRecord
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import Rollout
from ...schemas.verdict import Verdict
from ...tasks.engine.store import RunStore
from .gather import ROLLOUT_COLUMNS, VERDICT_COLUMNS, BuildFacts, instances, parts

CHUNK = 100
CUT = 4000
INDEX_COLUMNS = ["id", "env", "family", "level", "teacher", "sample", "status", "label", "verified", "passed",
                 "hacks", "severity", "turns", "completion_tokens", "reward", "chunk", "monitor", "doubted"]


def cut(text: str | None, limit: int = CUT) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f"\n… [{len(text) - limit} more characters in the Parquet row]"


def script_json(obj: Any) -> str:
    """JSON safe inside an HTML `<script>` element or a `.js` file."""
    return (json.dumps(obj, separators=(",", ":"), default=str)
            .replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _turns(r: dict, labels: list[str]) -> list[dict]:
    """The episode as turns: the assistant's text, the commands it ran (with step label and exit code),
    the observations it got back (tool or user messages up to the next assistant message)."""
    steps = r.get("steps") or []
    step_label = labels if len(labels) == len(steps) else [""] * len(steps)
    usage = {u["turn"]: u for u in r.get("usage") or []}
    out: list[dict] = []
    n = 0
    for m in (r.get("messages") or [])[2:]:  # system prompt + instruction are shown apart
        if m["role"] == "assistant":
            n += 1
            u = usage.get(n, {})
            out.append({"n": n, "text": cut(m.get("content")), "commands": [
                {"command": s["command"], "label": lab, "exit": s["exit_code"], "killed_by": s.get("killed_by"),
                 "seconds": round(s["duration_s"], 3)}
                for s, lab in zip(steps, step_label) if s["turn"] == n],
                "tool_calls": len(m.get("tool_calls") or []), "observations": [],
                "tokens": u.get("completion_tokens", 0), "finish": u.get("finish_reason")})
        elif out:
            out[-1]["observations"].append(cut(m.get("content")))
    return out


def episode(r: dict, v: dict | None, env: dict, label: str) -> dict:
    """The full episode the browser shows when it is opened."""
    msgs = r.get("messages") or []
    instruction = env.get("instruction") or (msgs[1]["content"] if len(msgs) > 1 else "")
    q = (v or {}).get("quality") or {}
    verdict = None
    if v is not None:
        verdict = {k: v[k] for k in ("verified", "passed", "tests_passed", "reward", "mode", "counterfactual",
                                     "reverted", "unexpected", "changes")}
        verdict["tests"] = [[t["name"], t["passed"], cut(t["message"], 1000)] for t in v["tests"]]
        verdict["hacks"] = v["hacks"]
        verdict["monitor"] = {"score": v.get("monitor_score") or 0.0, "flags": v.get("monitor_flags") or [],
                              "rationale": cut(v.get("monitor_rationale"), 2000)}
        verdict["verifier_output"] = cut(v["verifier_output"])
        verdict["quality"] = {k: q.get(k) for k in ("inspect_before_act", "act_verify_share", "ends_with_verify",
                                                     "repeated_commands", "failed_commands", "recoveries")}
    return {"id": r["rollout_id"], "env": r["env_id"], "family": env.get("family", ""), "level": env.get("level"),
            "teacher": r["teacher"], "harness": r.get("harness"), "sample": r["sample"], "status": r["status"], "error": r.get("error"),
            "label": label, "instruction": cut(instruction, 3 * CUT), "turns": _turns(r, q.get("labels") or []),
            "tokens": {"prompt": r["prompt_tokens"], "completion": r["completion_tokens"]},
            "wall_s": round(r["wall_s"], 3), "verdict": verdict}


def index_row(r: dict, v: dict | None, env: dict, label: str, chunk: int, threshold: float = 0.5) -> dict:
    """What the page filters on, plus what the per-teacher breakdowns count. `doubted`: the tests passed but the
    monitor's score is at or above `threshold` (the two signals disagree: listed for review)."""
    q = (v or {}).get("quality") or {}
    hacks = (v or {}).get("hacks") or []
    labels = q.get("labels") or []
    return {"id": r["rollout_id"], "env": r["env_id"], "family": env.get("family", ""), "level": env.get("level"),
            "teacher": r["teacher"], "harness": r.get("harness"), "sample": r["sample"], "status": r["status"], "label": label,
            "verified": bool(v and v["verified"]), "passed": bool(v and v["passed"]),
            "hacks": sorted({h["kind"] for h in hacks}),
            "severity": "hack" if any(h["severity"] == "hack" for h in hacks) else ("review" if hacks else ""),
            "turns": r["turns"], "completion_tokens": r["completion_tokens"],
            "reward": (v or {}).get("reward", 0.0), "chunk": chunk,
            "latency_s": sum(u["latency_s"] for u in r.get("usage") or []),
            "steps": {lab: labels.count(lab) for lab in ("inspect", "act", "verify")},
            "repeated": q.get("repeated_commands", 0), "recoveries": q.get("recoveries", 0),
            "act_verify_share": q.get("act_verify_share") if v else None,
            "tool_call_errors": r.get("tool_call_errors") or 0,
            "monitor": sorted({f["detector"] for f in (v or {}).get("monitor_flags") or []}),
            "doubted": bool(v and v.get("tests_passed") and (v.get("monitor_score") or 0.0) >= threshold),
            "kinds": {h["kind"]: h["severity"] for h in sorted(hacks, key=lambda h: h["severity"] == "hack")}}


class EpisodeData:
    """Joins rollouts with their verdicts, environments and labels; writes the chunks as it goes."""

    def __init__(self, store: RunStore, rec: BuildRecord, facts: BuildFacts):
        from ...tasks.redaction.secrets import Scanner

        self.store, self.rec, self.facts = store, rec, facts
        # every text the report writes is redacted first (export's scanner, redact mode; before any cut,
        # so a cut never leaves half a secret unmatched)
        self.scanner = Scanner(((rec.config.get("export") or {}).get("secrets") or {}).get("detectors"))
        self.envs: dict[str, dict] = {}
        for inst in instances(rec, "synthesize")[-1:]:
            for t in store.iter_tables(parts(facts, inst), EnvSpec, columns=["env_id", "kind", "family", "level", "source",
                                                                            "instruction", "audit"]):  # kind: null before kinds
                for e in self.scanner.redact_tree(t.to_pylist()):
                    self.envs[e["env_id"]] = e
        monitor = ((rec.config.get("verify") or {}).get("monitor") or {})
        self.threshold = float(monitor.get("threshold", 0.5))
        self.verdicts: dict[str, dict] = {}
        for inst in instances(rec, "verify"):
            for t in store.iter_tables(parts(facts, inst), Verdict, columns=VERDICT_COLUMNS):  # nulls: older parts
                for v in self.scanner.redact_tree(t.to_pylist()):
                    self.verdicts[v["rollout_id"]] = v
        self.calibration: list[dict] = []
        for inst in instances(rec, "calibrate")[-1:]:
            for t in store.iter_tables(parts(facts, inst)):
                self.calibration += t.to_pylist()
        self.labels = {(c["env_id"], c["teacher"]): c["label"] for c in self.calibration}

    def write(self, folder: str, say: Callable[[str], None] = lambda s: None) -> list[dict]:
        """Write `folder/episodes/chunk-*.js`; return the index rows (one per rollout, in stored order)."""
        rows: list[dict] = []
        chunk: list[dict] = []

        def flush() -> None:
            if chunk:
                n = (len(rows) - 1) // CHUNK
                self.store.write_text(posixpath.join(folder, "episodes", f"chunk-{n:05d}.js"),
                                      f"window.tfChunk({n},{script_json(chunk)});\n")
                chunk.clear()

        for inst in instances(self.rec, "rollout"):
            for t in self.store.iter_tables(parts(self.facts, inst), Rollout, columns=ROLLOUT_COLUMNS):  # nulls: older
                for r in self.scanner.redact_tree(t.to_pylist()):
                    v = self.verdicts.get(r["rollout_id"])
                    env = self.envs.get(r["env_id"], {})
                    label = self.labels.get((r["env_id"], r["teacher"]), "")
                    rows.append(index_row(r, v, env, label, len(rows) // CHUNK, self.threshold))
                    chunk.append(episode(r, v, env, label))
                    if len(chunk) == CHUNK:
                        flush()
        flush()
        return rows


def kinds(envs: dict[str, dict], rows: list[dict]) -> dict[str, dict[str, int]]:
    """Environments, rollouts and the model's tool-call errors (Rollout.tool_call_errors) per environment
    kind (`EnvSpec.kind`; `terminal` when unset)."""
    out: dict[str, dict[str, int]] = {}
    zero = {"environments": 0, "rollouts": 0, "tool_call_errors": 0}
    for e in envs.values():
        out.setdefault(e.get("kind") or "terminal", dict(zero))["environments"] += 1
    for r in rows:
        kind = (envs.get(r["env"]) or {}).get("kind") or "terminal"
        n = out.setdefault(kind, dict(zero))
        n["rollouts"] += 1
        n["tool_call_errors"] += r.get("tool_call_errors") or 0
    return dict(sorted(out.items()))


def page_index(rows: list[dict]) -> dict:
    """The inline index: column names + one array per rollout (compact at 10k rows)."""
    return {"columns": INDEX_COLUMNS, "rows": [[r[c] for c in INDEX_COLUMNS] for r in rows], "chunk": CHUNK}
