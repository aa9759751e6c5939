"""The registry of procedural environment families. A new family is one module (a `Family`) plus one
`register(...)` line: here for a built-in one, in a plugin module (`plugins:`) for others."""

from __future__ import annotations

from ..tools.families import FAMILY_CLASSES as TOOL_FAMILIES  # kind `tools` (see tasks/envs/tools/__init__.py)
from .base import Family
from .config_repair import ConfigRepair
from .csv_convert import CsvConvert
from .file_search import FileSearch
from .git_recover import GitRecover
from .log_report import LogReport
from .python_bugfix import PythonBugfix
from .shell_script import ShellScript
from .sql_query import SqlQuery

FAMILIES: dict[str, Family] = {f.name: f for f in (LogReport(), FileSearch(), ConfigRepair(), PythonBugfix(),
                                                   GitRecover(), CsvConvert(), SqlQuery(), ShellScript(),
                                                   *(cls() for cls in TOOL_FAMILIES))}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown environment family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None
