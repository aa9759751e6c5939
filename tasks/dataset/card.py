"""The dataset card (README.md with a YAML header) of an export: what `load_dataset` reads and what
a user of the dataset needs to trust it.

Generated with huggingface_hub's card tools (`DatasetCardData` renders the header, `DatasetCard`
parses it back) and checked against the Hub's vocabularies (`schemas.hub`) before it is written;
the Hub validates it again when it is published. The header declares only configs with rows
(`datasets` cannot load an empty Parquet file). Provenance is read from the build: the stages'
fingerprints, the teachers' models and sampling parameters (never their server environment or
extra arguments), hashes of the system prompts and tool schemas found in the rows, the verifier,
counts and the difficulty distribution. A config with no rows is named with the reason (`empty_reasons`).
`hub_usage` rewrites the "How to load" section for a Hub
repository and its revisions when the card is published.

Memory: the trajectories are read one part at a time, scalar columns plus the first message.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections import Counter
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...schemas.arrow import as_storage
from ...schemas.calibration import Calibration
from ...schemas.common import INFRA_STATUSES
from ...schemas.hub import LICENSES, SIZE_CATEGORIES, TASK_CATEGORIES, size_category
from ..difficulty.bands import label_definitions  # the labels' one definition, with this config's thresholds
from ..engine import Manifest, StageContext
from ..judge.venue import VENUES
from .harness_compare import HEADER as HARNESS_HEADER
from .harness_compare import HarnessComparison

LOAD_HEADING = "## How to load"
BASE_TAGS = ["agent-trajectories", "trajforge", "tool-use"]
DESCRIPTIONS = {
    "trajectories": "every verified rollout, success or failure, with verdict, hack flags, quality signals, "
                    "difficulty",
    "sft": "verified successes (never a hack-flagged one): supervised fine-tuning",
    "rl": "environments solved sometimes (0 < p < 1) with their spec: RL with verifiable rewards",
    "preference": "a success paired with a failure of the same environment: preference tuning",
    "rl_tokens": ("per-turn prompt (as a delta) and completion token ids and logprobs, the rollout as one sequence "
                  "with its loss mask when prefix-preserving: on-policy RL"),
}


class CardError(ValueError):
    """A card the Hub would refuse or that misstates the data (names the field)."""


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _scan(ctx: StageContext, out_dir: str) -> dict[str, Any]:
    """Counts, difficulty per environment, prompt and tool-schema hashes from the trajectories parts."""
    store = ctx.store
    parts = sorted(store.fs.glob(posixpath.join(out_dir, "trajectories", "*.parquet")))
    counts, modes, monitor = Counter(), Counter(), Counter()
    difficulty: dict[tuple[str, str], str] = {}
    prompts: dict[str, set[str]] = {}
    tools: Counter = Counter()
    envs: set[str] = set()
    outcomes: dict[str, list[int]] = {}  # env_id -> [verified passes, verified failures `preference` counts]
    compare = HarnessComparison()  # per (teacher, harness): the card's "Harnesses compared" table
    for path in parts:
        with store.fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            names = set(pf.schema_arrow.names)
            want = [c for c in ("env_id", "teacher", "harness", "passed", "status", "hack_flags", "difficulty",
                                "verification_mode", "tools_json", "messages", "turns", "completion_tokens",
                                "act_verify_share", "monitor_flags", "monitor_score") if c in names]
            for batch in pf.iter_batches(columns=want, batch_size=1024):
                n = batch.num_rows
                passed = pc.sum(batch.column("passed")).as_py() or 0
                flagged = pc.sum(pc.greater(pc.list_value_length(batch.column("hack_flags")), 0)).as_py() or 0
                counts.update(verified=n, passed=passed, failed=n - passed, flagged=flagged)
                if "verification_mode" in names:
                    modes.update(batch.column("verification_mode").to_pylist())
                if {"monitor_flags", "monitor_score"} <= names:
                    threshold = ctx.config.verify.monitor.threshold
                    for fl, sc, ok in zip(batch.column("monitor_flags").to_pylist(),
                                          batch.column("monitor_score").to_pylist(), batch.column("passed").to_pylist()):
                        monitor.update(fl or [])
                        counts.update(monitored=bool(fl), doubted=bool(ok and (sc or 0) >= threshold))
                harness = batch.column("harness").to_pylist() if "harness" in names else [None] * n
                for env, teacher, h, label in zip(batch.column("env_id").to_pylist(), batch.column("teacher").to_pylist(),
                                                  harness, batch.column("difficulty").to_pylist()):
                    difficulty[(env, teacher, h)] = label  # one label per calibrated pair
                    envs.add(env)
                if {"turns", "completion_tokens"} <= names:
                    flags = pc.greater(pc.list_value_length(batch.column("hack_flags")), 0).to_pylist()
                    shares = batch.column("act_verify_share").to_pylist() if "act_verify_share" in names else [None] * n
                    for row in zip(batch.column("teacher").to_pylist(), harness, batch.column("passed").to_pylist(),
                                   batch.column("status").to_pylist(), batch.column("turns").to_pylist(),
                                   batch.column("completion_tokens").to_pylist(), flags, shares):
                        compare.add(row[0], row[1], passed=row[2], status=row[3], turns=row[4],
                                    completion_tokens=row[5], flagged=row[6], act_verify_share=row[7])
                for env, ok, status in zip(*(batch.column(c).to_pylist() for c in ("env_id", "passed", "status"))):
                    o = outcomes.setdefault(env, [0, 0])
                    if ok:
                        o[0] += 1
                    elif status not in INFRA_STATUSES:
                        o[1] += 1
                tools.update(_short(t) for t in batch.column("tools_json").to_pylist())
                first = pc.list_element(as_storage(batch.column("messages")), 0)  # (no kernel takes JSON children)
                roles, contents = pc.struct_field(first, "role"), pc.struct_field(first, "content")
                for teacher, role, content in zip(batch.column("teacher").to_pylist(), roles.to_pylist(),
                                                  contents.to_pylist()):
                    if role == "system":
                        prompts.setdefault(teacher, set()).add(_short(content or ""))
    return {"counts": dict(counts), "verification_modes": dict(modes), "tools": dict(tools), "monitor": dict(monitor),
            "prompts": {t: sorted(h) for t, h in sorted(prompts.items())},
            "difficulty": dict(Counter(difficulty.values())), "envs": envs, "outcomes": outcomes, "harnesses": compare}


def _pairs(ctx: StageContext, upstream: dict[str, Manifest] | None) -> list[tuple[int, int]]:
    """(passes, attempts) of every (environment, teacher) pair calibrate committed."""
    if not upstream or "calibrate" not in upstream:
        return []
    t = ctx.store.read_table(upstream["calibrate"].parts, Calibration, columns=["passes", "attempts"])
    return list(zip(t.column("passes").to_pylist(), t.column("attempts").to_pylist()))


def empty_reasons(ctx: StageContext, counts: dict[str, int], stats: dict[str, Any], facts: dict[str, Any],
                  upstream: dict[str, Manifest] | None = None) -> dict[str, str]:
    """{config: why it has no rows} for each empty config of this export (`trajectories` and
    `export.configs`), from the rows' facts (`_scan`), calibration and the reject reasons; the
    `export.filters` that removed rollouts are named with their counts."""
    reasons = stats.get("reject_reasons") or {}
    filtered = {k: v for k, v in sorted(reasons.items()) if k.startswith("filter_")}
    by_filter = (f"; `export.filters` removed {sum(filtered.values())} verified rollout(s) before it: "
                 + ", ".join(f"`{k}` {v}" for k, v in filtered.items())) if filtered else ""
    c, outcomes = facts.get("counts", {}), facts.get("outcomes", {})
    verified, passed = c.get("verified", counts.get("trajectories", 0)), c.get("passed", 0)
    out: dict[str, str] = {}
    for name in ["trajectories", *ctx.config.export.configs]:
        if counts.get(name):
            continue
        if not verified:
            rejected = ", ".join(f"`{k}` {v}" for k, v in sorted(reasons.items()))
            why = ("no verified rollout was exported" + (f" (rejected before export: {rejected})" if rejected
                                                          else ": the build produced no rollouts"))
        elif name == "sft":
            why = (f"no verified rollout passed ({verified} verified, 0 passed)" if not passed else
                   f"none of the {passed} verified passes ended with status `ok`") + by_filter
        elif name == "rl":
            pairs = _pairs(ctx, upstream)
            every = sum(a > 0 and p == a for p, a in pairs)
            never = sum(a > 0 and p == 0 for p, a in pairs)
            why = (f"no environment had a solve rate strictly between 0 and 1 for a teacher (of {len(pairs)} "
                   f"environment x teacher pair(s): {every} solved every attempt, {never} solved none, "
                   f"{len(pairs) - every - never} had no verified attempt)")
            if between := sum(0 < p < a for p, a in pairs):
                why = (f"{between} environment x teacher pair(s) had 0 < p < 1, but the secret scan rejected "
                       f"{(stats.get('secrets') or {}).get('rl_rows_rejected', 0)} row(s)")
        elif name == "preference":
            wins = sum(w > 0 and lo == 0 for w, lo in outcomes.values())
            losses = sum(w == 0 and lo > 0 for w, lo in outcomes.values())
            both = len(outcomes) - wins - losses
            why = (f"no environment had both a verified pass and a verified failure (of {len(outcomes)} "
                   f"environment(s): {wins} only passed, {losses} only failed)" if not both else
                   f"the {both} environment(s) with both a pass and a failure had no pair with the same prompt "
                   "and model turns on both sides") + by_filter
        elif name == "rl_tokens":
            why = ("no exported rollout carries completion token ids and logprobs (the teacher did not return "
                   "them)") + by_filter
        else:
            why = "no row matched the config" + by_filter
        out[name] = why + "." if not why.endswith(".") else why
    return out


def _kinds(ctx: StageContext, upstream: dict[str, Manifest] | None, env_ids: set[str]) -> dict[str, int]:
    """Environments of the exported rows per `EnvSpec.kind` (`terminal` / `tools`), from synthesize's
    rows (a part written before kinds existed counts as `terminal`)."""
    from ...schemas.environment import EnvSpec

    if not upstream or "synthesize" not in upstream or not env_ids:
        return {}
    t = ctx.store.read_table(upstream["synthesize"].parts, EnvSpec, columns=["env_id", "kind"],
                             filters=[("env_id", "in", sorted(env_ids))])
    return dict(Counter(k or "terminal" for k in t.column("kind").to_pylist()))


def _teachers(ctx: StageContext) -> list[dict[str, Any]]:
    """Model id and sampling parameters per teacher (no server environment, no extra arguments)."""
    out = []
    for t in ctx.config.teachers:
        out.append({"label": t.label, "backend": t.backend, "model": t.card_model,
                    "served_as": t.served_model or None, "temperature": t.temperature, "top_p": t.top_p,
                    "max_tokens": t.max_tokens, "seed": t.seed, "tool_calling": t.tool_calling})
    return out


def _source_datasets(ctx: StageContext) -> list[str]:
    card, syn = ctx.config.export.card, ctx.config.synthesize
    if card.source_datasets:
        return list(card.source_datasets)
    out = ["original"] if (syn.families or syn.llm) else []
    return out + [f"extended|{posixpath.basename(str(p).rstrip('/'))}" for p in syn.imports]


def card_metadata(ctx: StageContext, counts: dict[str, int], fingerprint: str) -> dict[str, Any]:
    """The YAML header: configs with rows, license, languages, tasks, size, tags, sources."""
    from huggingface_hub import DatasetCardData

    cfg, card = ctx.config, ctx.config.export.card
    configs = [{"config_name": name, "data_files": [{"split": "train", "path": f"{name}/train-{fingerprint}-*.parquet"}]}
               for name in ["trajectories", *cfg.export.configs] if counts.get(name)]
    extra = {"license_name": card.license_name, "license_link": card.license_link} if card.license == "other" else {}
    data = DatasetCardData(
        license=card.license, language=list(card.language), pretty_name=card.pretty_name or cfg.dataset,
        task_categories=list(card.task_categories), size_categories=[size_category(counts.get("trajectories", 0))],
        source_datasets=_source_datasets(ctx), tags=[*BASE_TAGS, *[t for t in card.tags if t not in BASE_TAGS]],
        configs=configs, **extra)
    return data.to_dict()


def validate_card(text: str) -> dict[str, Any]:
    """Parse `text` with huggingface_hub's `DatasetCard` and check its header against the Hub's
    vocabularies; returns the header. Raises CardError naming the field."""
    from huggingface_hub import DatasetCard

    try:
        meta = DatasetCard(text, ignore_metadata_errors=False).data.to_dict()
    except Exception as err:  # the card tools' own parse errors
        raise CardError(f"dataset card: {err}") from err
    as_list = lambda v: [v] if isinstance(v, str) else list(v or [])  # noqa: E731
    for field, allowed in (("license", LICENSES), ("size_categories", SIZE_CATEGORIES),
                           ("task_categories", TASK_CATEGORIES)):
        bad = [v for v in as_list(meta.get(field)) if v not in allowed]
        if bad:
            raise CardError(f"dataset card: {field} {bad} not accepted by the Hub")
    if "other" in as_list(meta.get("license")) and not (meta.get("license_name") and meta.get("license_link")):
        raise CardError("dataset card: license `other` without license_name and license_link")
    for c in meta.get("configs") or []:
        if not c.get("config_name") or not c.get("data_files"):
            raise CardError(f"dataset card: config entry {c!r} needs config_name and data_files")
    return meta


def _table(header: list[str], rows: list[list[Any]]) -> str:
    fmt = lambda v: "—" if v is None else f"`{v}`" if isinstance(v, str) and v and " " not in v else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]])


# config -> the TRL call that consumes it (a config the card declares; `model` is the user's)
TRL_LINES = {
    "sft": 'SFTTrainer(model, args=SFTConfig(assistant_only_loss=True), train_dataset=sft.select_columns(["messages", "tools"]))',
    "preference": ('DPOTrainer(model, args=DPOConfig(), train_dataset=preference.select_columns(["prompt", "chosen", '
                   '"rejected", "tools"]))'),
}


def _load_section(configs: list[str], where: str, revisions: list[str] = ()) -> str:
    lines = [LOAD_HEADING, "", "```python", "from datasets import load_dataset", ""]
    lines += [f'{name} = load_dataset("{where}", "{name}", split="train")' for name in configs]
    lines += ["```"]
    trl = [TRL_LINES[name] for name in configs if name in TRL_LINES]
    if trl:
        lines += ["", "Trainers take the conversational configs as they are: `messages` (or `prompt` / `chosen` / "
                  "`rejected`) and `tools` are lists of dicts (tool-call arguments are JSON objects), e.g. with TRL:",
                  "", "```python", "from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer", "", *trl, "```"]
    if revisions:
        lines += ["", "Every published build is a tag; pass it as `revision` to load exactly that build "
                  "(the default branch holds the newest):", "", "```python",
                  *[f'load_dataset("{where}", "{configs[0]}", revision="{r}")' for r in revisions], "```"]
    return "\n".join(lines) + "\n"


def _gates_section(ctx: StageContext, accepted: list[tuple[str, dict[str, Any]]]) -> str:
    """The card's record of gates passed on purpose (`--accept-gate`) and thresholds the config set."""
    lines = [f"- **accepted** `{a['name']}` (stage {stage}): {a['line']}" for stage, a in accepted]
    for suite, overrides in sorted(ctx.config.gates.items()):
        for name, o in sorted(overrides.items()):
            lines.append(f"- config `gates.{suite}.{name}`: "
                         + ", ".join(f"{k}={v}" for k, v in o.model_dump().items() if v is not None))
    if not lines:
        return ""
    return ("\n## Gates\n\nThis dataset was committed with these departures from the default data-quality "
            "gates (see gate.json beside each stage's output):\n\n" + "\n".join(lines) + "\n")


def dataset_card(ctx: StageContext, stats: dict[str, Any], fingerprint: str,
                 accepted: list[tuple[str, dict[str, Any]]] = (), upstream: dict[str, Manifest] | None = None,
                 out_dir: str | None = None) -> str:
    """A Hub dataset card (validated with `validate_card`); `accepted`: (stage, failure) of the gates
    committed on purpose; `upstream` / `out_dir` give the provenance (fingerprints, rows' facts)."""
    from huggingface_hub import DatasetCard

    cfg = ctx.config
    counts = stats.get("configs", {})
    meta = card_metadata(ctx, counts, fingerprint)
    configs = [c["config_name"] for c in meta.get("configs", [])]
    facts = _scan(ctx, out_dir) if out_dir else {"counts": {}, "difficulty": {}, "prompts": {}, "tools": {},
                                                   "verification_modes": {}, "monitor": {}}
    c = facts["counts"]
    empty = empty_reasons(ctx, counts, stats, facts, upstream)
    fps = [[name, m.fingerprint + (f".r{m.revision}" if m.revision else ""), m.build_id]
           for name, m in sorted((upstream or {}).items())] + [["export", fingerprint, ctx.build_id]]
    teachers = [[t["label"], t["model"], t["served_as"], t["temperature"], t["top_p"], t["max_tokens"], t["seed"],
                 ", ".join(facts["prompts"].get(t["label"], [])) or None] for t in _teachers(ctx)]
    license_line = (f"`other`: [{cfg.export.card.license_name}]({cfg.export.card.license_link})"
                    if cfg.export.card.license == "other" else f"`{cfg.export.card.license}`")
    if cfg.export.card.license == "unknown":
        license_line += " (not set: `export.card.license` in the build config)"
    families = ", ".join(sorted({f.name for f in cfg.synthesize.families})) or "none"
    kinds = _kinds(ctx, upstream, facts.get("envs", set()))
    verify = cfg.verify
    lines = [
        f"# {meta.get('pretty_name') or cfg.dataset}", "",
        f"Agent trajectories (terminal / coding agents using tools) built by "
        f"trajforge (build `{ctx.build_id}`): environments with hidden tests, episodes "
        "of teacher models in Docker sandboxes, verified, calibrated for difficulty.", "",
        _table(["config", "rows", "what"], [[n, counts.get(n, 0), DESCRIPTIONS.get(n, "")] for n in configs]), "",
        "Configs without rows are not declared" + (":" if empty else "."), "",
        *[f"- `{name}`: 0 rows: {why}" for name, why in empty.items()], *([""] if empty else []),
        _load_section(configs or ["trajectories"], out_dir or "<export folder>"),
        "## Provenance", "",
        f"- build: `{ctx.build_id}`; license: {license_line}",
        f"- environments: families {families}; imported task sets: "
        f"{', '.join(map(str, cfg.synthesize.imports)) or 'none'}; LLM-synthesized: "
        f"{'yes' if cfg.synthesize.llm else 'no'}; kinds (environments with exported rows): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'n/a'} (`terminal`: a bash tool in the "
        "sandbox; `tools`: the environment's own tools over a stateful store, verified by its end state)",
        f"- episodes: {cfg.rollout.samples_per_env} per environment and teacher"
        f"{' (+ adaptive rounds)' if cfg.calibrate.adaptive else ''}, at most {cfg.rollout.max_turns} turns, "
        f"{cfg.rollout.command_timeout_s:g} s per command, {cfg.rollout.episode_timeout_s:g} s per episode",
        f"- verifier: hidden tests run after the agent's processes are gone "
        f"(venue `{verify.venue}`: {VENUES[verify.venue].doc}; rows by mode: "
        f"{facts['verification_modes'] or 'n/a'}), hack detectors and counterfactual re-tests; "
        f"procedural successes replayed on a sibling instance: {'yes' if verify.replay_on_sibling else 'no'}",
        f"- counts (`trajectories`): verified {c.get('verified', counts.get('trajectories', 0))}, "
        f"passed {c.get('passed', 'n/a')}, failed {c.get('failed', 'n/a')}, hack-flagged {c.get('flagged', 'n/a')}; "
        f"rejected before export: {stats.get('reject_reasons', {}) or 'none'}",
        f"- monitor (execution-free, beside the tests; `verify.monitor.mode` `{verify.monitor.mode}`): rows with a "
        f"finding {c.get('monitored', 0)}, test passes it doubts (score >= "
        f"{verify.monitor.threshold:g}) {c.get('doubted', 0)}; findings by detector: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(facts['monitor'].items())) or 'none'} (columns `monitor_flags`, "
        "`monitor_score`, `monitor_rationale`)",
        _secrets_line(stats.get("secrets")),
        f"- difficulty (environment x teacher, from calibrated solve rates): "
        f"{', '.join(f'{k} {v}' for k, v in sorted(facts['difficulty'].items())) or 'n/a'}",
        f"- tool schemas (sha256/16 of `tools_json`: rows): "
        f"{', '.join(f'`{k}`: {v}' for k, v in sorted(facts['tools'].items())) or 'n/a'}", "",
        "Teachers (model and sampling parameters; `system prompt` = sha256/16 of the system messages in the rows):",
        "", _table(["teacher", "model", "served as", "temperature", "top_p", "max_tokens", "seed", "system prompt"],
                   teachers), "",
        "Stage fingerprints (same fingerprint = same output; `trajforge explain` says why):", "",
        _table(["stage", "fingerprint", "built by"], fps), "",
        "## Fields", "",
        "`trajectories` holds OpenAI-format `messages` exactly as produced (tool calls and tool outputs), "
        "`tools` (the tool schemas offered, JSON-schema function definitions; `tools_json` holds the same as one "
        "text, kept one release for compatibility), `malformed_tool_calls` (calls whose arguments the model wrote "
        "as something other than a JSON object: kept as the string it wrote), the verdict (`passed`, `reward` = fraction of hidden tests "
        "passed, `status` from the failure taxonomy), `hack_flags`, quality signals (`step_labels` "
        "inspect/act/verify, `act_verify_share`, `inspect_before_act`, ...) and the environment's calibrated "
        "`difficulty` and `solve_rate` for the row's teacher, `pooled_difficulty` and `pooled_solve_rate` "
        "across every teacher of the build, and `kind` (terminal: a shell; tools: a tool server). `sft` keeps the verified successes; `rl` lists environments solved "
        "sometimes (0 < p < 1) with their spec; `preference` pairs a success with a failure of the same "
        "environment.",
    ]
    compare = facts.get("harnesses")
    if compare is not None and len(compare.harnesses) > 1:
        lines += ["", "## Harnesses compared", "",
                  "The same environments under each harness (`rollout.harnesses`): one row per teacher and harness "
                  "(solve rate = passed / episodes not lost to infrastructure; `act/verify share`: the mean quality "
                  "signal of that name).", "", _table(HARNESS_HEADER, compare.rows())]
    lines += ["", "## Difficulty labels", "",
              "What each `difficulty` value means in this build (solve rate p of an environment for a teacher):", "",
              _table(["label", "definition"], [[k, v] for k, v in label_definitions(cfg.calibrate).items()])]
    text = "---\n" + _yaml(meta) + "---\n\n" + "\n".join(lines) + "\n" + _gates_section(ctx, list(accepted))
    validate_card(text)
    return str(DatasetCard(text))


def _secrets_line(secrets: dict[str, Any] | None) -> str:
    if not isinstance(secrets, dict):
        return "- secrets: not scanned"
    found = {k: v for k, v in (secrets.get("detectors") or {}).items() if v}
    return (f"- secrets: every message, tool output and environment file scanned before export (action "
            f"`{secrets.get('action', '?')}`); findings per detector: {found or 'none'}")


def _yaml(meta: dict[str, Any]) -> str:
    from huggingface_hub import DatasetCardData

    return DatasetCardData(**meta).to_yaml() + "\n"


def hub_usage(card: str, repo_id: str, revisions: list[str]) -> str:
    """`card` with its "How to load" section rewritten for the Hub repository `repo_id` and its
    published `revisions` (tags); a card without that section gets it before "## Provenance"."""
    meta = validate_card(card)
    configs = [c["config_name"] for c in meta.get("configs", [])] or ["trajectories"]
    section = _load_section(configs, repo_id, revisions)
    pattern = re.compile(rf"^{re.escape(LOAD_HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(card):
        return pattern.sub(lambda _: section + "\n", card, count=1)
    anchor = card.find("\n## ")
    return card + "\n" + section if anchor < 0 else card[:anchor + 1] + section + "\n" + card[anchor + 1:]
