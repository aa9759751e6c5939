"""The gate: run a stage's Great Expectations suite on its output before anything is committed.

Suites live as versioned JSON in `expectations/suites/<stage>.json` and are loaded into an ephemeral
GX context on every run (nothing persists between runs). Expectations address table columns; a
suite may also check `stats.json` through `stats_expectations` (for tables too large to load).
Only scalar columns are handed to GX: nested columns (messages, tests) are checked by the schema.
Value sets are referenced, not copied: `{"$field": "Rollout.status"}` takes them from the records.
"""

from __future__ import annotations

import json
import logging
import os
from importlib import resources
from typing import Any

import pyarrow as pa

from ..schemas.value_sets import resolve

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
logging.getLogger("great_expectations").setLevel(logging.WARNING)


def load_suite(stage: str) -> dict[str, Any]:
    """The versioned suite of `stage`, with value-set references resolved from the record types
    (see `schemas.value_sets`)."""
    path = resources.files("trajforge.expectations") / "suites" / f"{stage}.json"
    spec = json.loads(path.read_text())
    spec["expectations"] = [resolve_expectation(e) for e in spec.get("expectations", [])]
    return spec


def resolve_expectation(e: dict[str, Any]) -> dict[str, Any]:
    kwargs = e.get("kwargs", {})
    if "value_set" not in kwargs:
        return e
    return {**e, "kwargs": {**kwargs, "value_set": resolve(kwargs["value_set"])}}


def _scalar_frame(table: pa.Table):
    keep = [f.name for f in table.schema
            if not (pa.types.is_list(f.type) or pa.types.is_struct(f.type) or pa.types.is_large_binary(f.type))]
    return table.select(keep).to_pandas()


def _check_stats(stats: dict[str, Any], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`{"key": "rows", "min": 1, "max": null}` style checks on stats.json values."""
    failures = []
    for c in checks:
        value = stats.get(c["key"])
        lo, hi = c.get("min"), c.get("max")
        ok = isinstance(value, (int, float)) and (lo is None or value >= lo) and (hi is None or value <= hi)
        if not ok:
            failures.append({"expectation": f"stats.{c['key']}", "kwargs": {"min": lo, "max": hi},
                             "unexpected": [value]})
    return failures


def run_gate(stage: str, table: pa.Table, stats: dict[str, Any], extra: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """Validate; return a JSON-able report with `success`, `failures` (expectation, kwargs,
    offending values) and the full GX result. Never raises on a failed expectation."""
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    # GX sets INFO on some of its own module loggers (e.g. data_context.types.base): quiet them all
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    spec = load_suite(stage)
    expectations = list(spec.get("expectations", [])) + [resolve_expectation(e) for e in extra]
    failures = _check_stats(stats, spec.get("stats_expectations", []))
    result_json: dict[str, Any] = {}
    if table.num_rows and expectations:
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = {"globally": False}
        batch_def = (context.data_sources.add_pandas(f"{stage}_source")
                     .add_dataframe_asset(f"{stage}_output")
                     .add_batch_definition_whole_dataframe("all"))
        suite = context.suites.add(ExpectationSuite(
            name=f"{stage}_suite", expectations=[ExpectationConfiguration(**e) for e in expectations]))
        batch = batch_def.get_batch(batch_parameters={"dataframe": _scalar_frame(table)})
        result = batch.validate(suite, result_format="SUMMARY")
        result_json = result.to_json_dict()
        for r in result.results:
            if not r.success:
                res = r.result or {}
                failures.append({
                    "expectation": r.expectation_config.type,
                    "kwargs": {k: v for k, v in r.expectation_config.kwargs.items() if k != "batch_id"},
                    "unexpected": res.get("partial_unexpected_list", res.get("observed_value")),
                    "exception": (r.exception_info or {}).get("exception_message"),
                })
    elif not table.num_rows and spec.get("allow_empty", False) is False:
        failures.append({"expectation": "table_not_empty", "kwargs": {}, "unexpected": [0]})
    return {"stage": stage, "success": not failures, "failures": failures,
            "evaluated": len(expectations) + len(spec.get("stats_expectations", [])),
            "rows": table.num_rows, "gx": result_json}
