"""The registry of procedural environment families, of every kind: terminal families (a `Family` of
base.py) and tool families (a `ToolFamily` of tool_base.py, their sandbox code in `tool_code/`). A new
family is one module plus one `register(...)` line: here for a built-in one, in a plugin module
(`plugins:`) for others."""

from __future__ import annotations

from .base import Family
from .bookings import Bookings
from .calendar import Calendar
from .config_repair import ConfigRepair
from .csv_convert import CsvConvert
from .file_search import FileSearch
from .git_recover import GitRecover
from .log_report import LogReport
from .orders import Orders
from .python_bugfix import PythonBugfix
from .shell_script import ShellScript
from .sql_query import SqlQuery
from .tickets import Tickets

FAMILIES: dict[str, Family] = {f.name: f for f in (LogReport(), FileSearch(), ConfigRepair(), PythonBugfix(),
                                                   GitRecover(), CsvConvert(), SqlQuery(), ShellScript(),
                                                   Bookings(), Orders(), Tickets(), Calendar())}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown environment family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None
