"""The gate: run a stage's Great Expectations suite on its output before anything is committed.

Suites live as versioned JSON in `expectations/suites/<stage>.json` and are loaded into an ephemeral
GX context on every run (nothing persists between runs). Every expectation has a `name` (unique in
its suite; `<suite>.<name>` elsewhere): config overrides, `--accept-gate` and failures use it.
Expectations address table columns, or row figures computed from them (`figures.ROW_FIGURES`: a
teacher's format-error share, a family's share, ...); `stats_expectations` check figures of
`stats.json` (for aggregates rows do not carry, or tables too large to load).
Only scalar columns are handed to GX: nested columns (messages, tests) are checked by the schema;
`gate_columns` names the ones a suite needs, so a caller reads just those from a large output.
Value sets are referenced, not copied: `{"$field": "Rollout.status"}` takes them from the records;
defaults that depend on the build config are facts: `{"$fact": "max_turns"}` (`figures.GateFacts`).

The *effective suite* of a stage = its versioned suite, facts resolved, the config's `gates.<suite>`
overrides applied (a threshold changed, or an expectation disabled with its reason) and
`gate.extra` appended. Its hash is the stage's gate hash (see tasks/engine/runner.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from importlib import resources
from typing import Any, Iterable

import pyarrow as pa

from ..schemas.value_sets import resolve
from .figures import ROW_FIGURES, STATS_FIGURES, GateFacts, add_row_figures

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
logging.getLogger("great_expectations").setLevel(logging.WARNING)

THRESHOLD_KEYS = ("min_value", "max_value", "mostly", "strict_min", "strict_max")
SHOWN_ROWS = 5  # offending row ids a failure names


def suite_names() -> list[str]:
    """Every versioned suite: the stages' and the export configs' (`export.sft`, ...)."""
    folder = resources.files("trajforge.expectations") / "suites"
    return sorted(p.name[:-len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_suite(stage: str) -> dict[str, Any]:
    """The versioned suite of `stage`, with value-set references resolved from the record types
    (see `schemas.value_sets`) and stats checks in their one form (`figure`, `args`, min/max_value)."""
    path = resources.files("trajforge.expectations") / "suites" / f"{stage}.json"
    if not path.is_file():
        raise KeyError(f"no expectation suite {stage!r} (suites: {', '.join(suite_names())})")
    spec = json.loads(path.read_text())
    spec["expectations"] = [resolve_expectation(e) for e in spec.get("expectations", [])]
    spec["stats_expectations"] = [_stats_check(c) for c in spec.get("stats_expectations", [])]
    return spec


def _stats_check(c: dict[str, Any]) -> dict[str, Any]:
    """`{"key": "rows", "min": 1}` (the first form) or `{"figure": ..., "args": ..., "min_value": ...}`."""
    c = dict(c)
    if "key" in c:
        c.setdefault("figure", "stat")
        c.setdefault("args", {"key": c.pop("key")})
    for old, new in (("min", "min_value"), ("max", "max_value")):
        if old in c:
            c[new] = c.pop(old)
    c.setdefault("name", c["args"].get("key") if c["figure"] == "stat" else c["figure"])
    return c


def resolve_expectation(e: dict[str, Any]) -> dict[str, Any]:
    kwargs = e.get("kwargs", {})
    if "value_set" not in kwargs:
        return e
    return {**e, "kwargs": {**kwargs, "value_set": resolve(kwargs["value_set"])}}


def _resolve_facts(obj: Any, facts: GateFacts) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"$fact"}:
            return facts.get(obj["$fact"])
        return {k: _resolve_facts(v, facts) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve_facts(v, facts) for v in obj]
    return obj


def _override_dict(o: Any) -> dict[str, Any]:
    """A `gates.<suite>.<name>` value as a dict: a number is the expectation's main threshold."""
    if hasattr(o, "model_dump"):  # unset and null fields mean "keep the default" (a config travels as JSON)
        return {k: v for k, v in o.model_dump().items() if v is not None}
    if isinstance(o, bool):
        return {"enabled": o}
    if isinstance(o, (int, float)):
        return {"value": o}
    return dict(o)


def effective_suite(stage: str, overrides: dict[str, Any] | None = None, extra: Iterable[dict[str, Any]] = (),
                    facts: GateFacts | None = None) -> dict[str, Any]:
    """The suite a gate runs: defaults with facts resolved, `overrides` (name -> GateOverride, dict or a
    number) applied, `extra` expectations appended. Disabled ones are left out and listed in
    `disabled` (name -> reason); changed thresholds in `overridden`. Raises KeyError for an override
    that names no expectation of the suite."""
    spec, facts, overrides = load_suite(stage), facts or GateFacts(), dict(overrides or {})
    out: dict[str, list] = {"expectations": [], "stats_expectations": []}
    disabled: dict[str, str] = {}
    overridden: dict[str, dict[str, Any]] = {}
    for section in out:
        for e in spec[section]:
            e = _resolve_facts(e, facts)
            name, enabled, reason = e["name"], e.get("enabled", True), e.get("reason")
            o = overrides.pop(name, None)
            if o is not None:
                o = _override_dict(o)
                if "enabled" in o:
                    enabled, reason = o["enabled"], o.get("reason") or reason
                changes = {k: o[k] for k in THRESHOLD_KEYS if k in o}
                if "value" in o:
                    changes[e.get("threshold", "max_value")] = o["value"]
                target = e["kwargs"] if section == "expectations" else e
                target.update(changes)
                if changes or "enabled" in o:
                    overridden[name] = {**changes, **({"enabled": enabled} if "enabled" in o else {}),
                                        **({"reason": o["reason"]} if o.get("reason") else {})}
            if enabled and e.get("type", "").endswith("_to_be_between") and \
                    all((e["kwargs"] if section == "expectations" else e).get(k) is None for k in ("min_value", "max_value")):
                enabled, reason = False, "no threshold: it comes from the build config (`$fact`), none was given"
            if not enabled:
                disabled[name] = reason or "disabled"
                continue
            out[section].append({k: v for k, v in e.items() if k not in ("enabled", "reason", "doc")})
    if overrides:
        known = [e["name"] for k in out for e in spec[k]]
        raise KeyError(f"gates.{stage}: no expectation named {', '.join(sorted(overrides))} "
                       f"(names: {', '.join(known)})")
    for i, e in enumerate(extra):
        e = resolve_expectation(dict(e))
        e.setdefault("name", (e.get("meta") or {}).get("name") or f"extra{i}")
        out["expectations"].append(e)
    return {"name": stage, "version": spec.get("version", 1), "allow_empty": spec.get("allow_empty", False),
            "id_column": spec.get("id_column"), **out, "disabled": disabled, "overridden": overridden}


def check_gates(gates: dict[str, dict[str, Any]]) -> None:
    """A config's `gates:` names suites and expectations that exist: ValueError naming the first that
    does not (the config schema cannot know the suites: they live here)."""
    for suite, overrides in gates.items():
        if suite not in suite_names():
            raise ValueError(f"gates: no suite {suite!r} (suites: {', '.join(suite_names())})")
        try:
            effective_suite(suite, overrides)
        except KeyError as err:
            raise ValueError(str(err).strip("'\"")) from None


def suite_hash(suite: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(suite, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _is_scalar(field: pa.Field) -> bool:
    return not (pa.types.is_list(field.type) or pa.types.is_struct(field.type) or pa.types.is_large_binary(field.type))


def _scalar_frame(table: pa.Table):
    return table.select([f.name for f in table.schema if _is_scalar(f)]).to_pandas()


# kwargs through which an expectation names columns; expectations on the column set as a whole
# need every scalar column to give the same verdict
_COLUMN_KWARGS = ("column", "column_A", "column_B", "column_list")
_WHOLE_TABLE = ("expect_table_columns_", "expect_table_column_count_")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def gate_columns(stage: str, schema: pa.Schema, extra: list[dict[str, Any]] = (),
                 suite: dict[str, Any] | None = None) -> list[str]:
    """The columns the gate of `stage` (or the effective `suite`) looks at in an output of `schema`, in
    schema order: the scalar columns its expectations name, the inputs of the row figures they name,
    the columns a `row_condition` mentions and the suite's id column (offending rows are named by it);
    every scalar column when an expectation looks at the column set; none when it checks stats only.
    `run_gate` on a table of just these columns gives the verdict it gives on the whole table (nested
    columns never reach GX anyway)."""
    suite = suite or effective_suite(stage, extra=extra)
    expectations = suite["expectations"]
    scalar = [f.name for f in schema if _is_scalar(f)]
    if not expectations:
        return []
    if any(e.get("type", "").startswith(_WHOLE_TABLE) for e in expectations):
        return scalar
    named: set[str] = {suite["id_column"]} if suite.get("id_column") else set()
    for e in expectations:
        kwargs = e.get("kwargs", {})
        for k in _COLUMN_KWARGS:
            v = kwargs.get(k)
            for c in [v] if isinstance(v, str) else v or []:
                named.update(ROW_FIGURES[c].inputs if c in ROW_FIGURES else [c])
        if kwargs.get("row_condition"):
            named.update(_WORD.findall(str(kwargs["row_condition"])))
    keep = [c for c in scalar if c in named]
    return keep or scalar[:1]  # a row count needs at least one column


def _threshold(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in (*THRESHOLD_KEYS, "value_set") if kwargs.get(k) is not None}


def _check_stats(stage: str, stats: dict[str, Any], checks: list[dict[str, Any]],
                 rejects: pa.Table | None) -> list[dict[str, Any]]:
    """The stats figures of `checks` against their min/max_value; one failure per check naming the
    groups (e.g. sources) out of range and, for a reject share, the first offending reject keys."""
    failures = []
    for c in checks:
        lo, hi = c.get("min_value"), c.get("max_value")
        values = STATS_FIGURES[c["figure"]](stats, **c.get("args", {}))
        bad = {label: v for label, v in values.items()
               if not (isinstance(v, (int, float)) and (lo is None or v >= lo) and (hi is None or v <= hi))}
        if not bad:
            continue
        rows: list[str] = []
        reason = c.get("args", {}).get("reason")
        if reason and rejects is not None and rejects.num_rows:
            rows = [k for k, r in zip(rejects.column("key").to_pylist(), rejects.column("reason").to_pylist())
                    if r == reason][:SHOWN_ROWS]
        observed = bad[""] if list(bad) == [""] else {k: (round(v, 6) if isinstance(v, float) else v)
                                                        for k, v in bad.items()}
        failures.append({"name": f"{stage}.{c['name']}", "expectation": f"stats.{c['name']}",
                         "kwargs": {"min": lo, "max": hi}, "unexpected": list(bad.values()),
                         "observed": observed, "threshold": {k: v for k, v in (("min_value", lo), ("max_value", hi))
                                                             if v is not None}, "rows": rows})
    return failures


def _gx_failure(stage: str, r: dict[str, Any], id_column: str | None) -> dict[str, Any]:
    cfg = r["expectation_config"]
    kwargs = {k: v for k, v in cfg["kwargs"].items() if k != "batch_id"}
    res = r.get("result") or {}
    if "observed_value" in res:
        observed = res["observed_value"]
    elif "mostly" in kwargs and "unexpected_percent" in res:
        observed = round(1 - (res["unexpected_percent"] or 0) / 100, 6)  # the share of rows that meet it
    else:
        observed = list(dict.fromkeys(map(str, res.get("partial_unexpected_list") or [])))[:SHOWN_ROWS]
    rows = [str(i.get(id_column)) for i in res.get("partial_unexpected_index_list") or [] if id_column in i]
    return {"name": (cfg.get("meta") or {}).get("name") or f"{stage}.{cfg['type']}",
            "expectation": cfg["type"], "kwargs": kwargs,
            "unexpected": res.get("partial_unexpected_list", res.get("observed_value")),
            "observed": observed, "threshold": _threshold(kwargs), "rows": rows[:SHOWN_ROWS],
            "unexpected_count": res.get("unexpected_count"),
            "exception": (r.get("exception_info") or {}).get("exception_message")}


def run_gate(stage: str, table: pa.Table, stats: dict[str, Any], extra: list[dict[str, Any]] = (),
             suite: dict[str, Any] | None = None, rejects: pa.Table | None = None,
             accept: Iterable[str] = ()) -> dict[str, Any]:
    """Validate `table` and `stats` against the effective `suite` (default: the versioned suite of
    `stage` + `extra`); return a JSON-able report with `success`, `failures` (name, expectation,
    kwargs, observed value, threshold, up to five offending row ids), `accepted` (failures named in
    `accept`, committed on purpose), `disabled` and the full GX result. Never raises on a failed
    expectation."""
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    # GX sets INFO on some of its own module loggers (e.g. data_context.types.base): quiet them all
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    suite = suite or effective_suite(stage, extra=extra)
    expectations = suite["expectations"]
    failures = _check_stats(stage, stats, suite["stats_expectations"], rejects)
    result_json: dict[str, Any] = {}
    if table.num_rows and expectations:
        frame = _scalar_frame(table)
        used = {e["kwargs"].get("column") for e in expectations}
        frame = add_row_figures(frame, {c for c in used if c in ROW_FIGURES})
        id_column = suite.get("id_column") if suite.get("id_column") in frame.columns else None
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = {"globally": False}
        batch_def = (context.data_sources.add_pandas(f"{stage}_source")
                     .add_dataframe_asset(f"{stage}_output")
                     .add_batch_definition_whole_dataframe("all"))
        gx_suite = context.suites.add(ExpectationSuite(name=f"{stage}_suite", expectations=[
            ExpectationConfiguration(type=e["type"], kwargs=e["kwargs"],
                                     meta={**e.get("meta", {}), "name": f"{stage}.{e['name']}"})
            for e in expectations]))
        batch = batch_def.get_batch(batch_parameters={"dataframe": frame})
        result_format: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
        if id_column:
            result_format["unexpected_index_column_names"] = [id_column]
        result = batch.validate(gx_suite, result_format=result_format)
        result_json = result.to_json_dict()
        order = {f"{stage}.{e['name']}": i for i, e in enumerate(expectations)}
        gx_failures = [_gx_failure(stage, r, id_column) for r in result_json.get("results", []) if not r["success"]]
        failures += sorted(gx_failures, key=lambda f: order.get(f["name"], len(order)))
    elif not table.num_rows and not suite.get("allow_empty", False):
        failures.append({"name": f"{stage}.table_not_empty", "expectation": "table_not_empty", "kwargs": {},
                         "unexpected": [0], "observed": 0, "threshold": {"min_value": 1}, "rows": []})
    report = {"stage": stage, "success": not failures, "failures": failures, "accepted": [],
              "disabled": suite.get("disabled", {}), "overridden": suite.get("overridden", {}),
              "suite": suite_hash(suite),
              "evaluated": len(expectations) + len(suite["stats_expectations"]),
              "rows": table.num_rows, "gx": result_json}
    return accept_failures(report, accept)


def accepted_by(name: str, accept: Iterable[str]) -> bool:
    """`--accept-gate` takes the full name (`rollout.format_error_share`) or the name in its suite."""
    return any(a == name or name.endswith("." + a) for a in accept)


def accept_failures(report: dict[str, Any], accept: Iterable[str]) -> dict[str, Any]:
    """Move the failures named in `accept` to `accepted` (committed on purpose); success is recomputed."""
    accept = list(accept)
    keep = [f for f in report["failures"] if not accepted_by(f.get("name", f["expectation"]), accept)]
    report["accepted"] = report.get("accepted", []) + [f for f in report["failures"] if f not in keep]
    report["failures"] = keep
    report["success"] = not keep
    return report


def describe_failure(f: dict[str, Any]) -> str:
    """One line: name, what it checks, the observed value, the threshold, the first offending rows."""
    name = f.get("name") or f["expectation"]
    if f.get("message"):
        return f"{name}: {f['message']}"
    what = f["expectation"]
    column = (f.get("kwargs") or {}).get("column")
    if column:
        what += f" on {column}"
    threshold = ", ".join(f"{k}={v}" for k, v in (f.get("threshold") or {}).items()) or str(f.get("kwargs"))
    line = f"{name} ({what}): observed {f.get('observed', f.get('unexpected'))}, threshold {threshold}"
    if f.get("rows"):
        more = f.get("unexpected_count") or 0
        line += f"; rows: {', '.join(map(str, f['rows']))}" + (f" (of {more})" if more > len(f["rows"]) else "")
    if f.get("exception"):
        line += f"; error: {f['exception']}"
    return line


def brief(f: dict[str, Any]) -> dict[str, Any]:
    """A failure as build.json, a manifest and the dataset card keep it (no GX internals)."""
    return {"name": f.get("name") or f["expectation"], "observed": f.get("observed", f.get("unexpected")),
            "threshold": f.get("threshold") or f.get("kwargs"), "rows": f.get("rows", []),
            "line": describe_failure(f)}
