"""Task folders users already have, by format. A new format is one module (a `TaskFormat`) plus one
`register(...)` line: here for a built-in one, in a plugin module (`plugins:` in the config) for others.

Import: each folder becomes an ordinary EnvSpec that goes through the same validator. `FROM` images
that cannot be pulled offline are mapped through `synthesize.image_aliases` at build.
"""

from __future__ import annotations

from pathlib import Path

from ....schemas.environment import EnvSpec
from .base import TaskFormat, TaskFormatError, check_size, folder_digest
from .harbor import Harbor, export_harbor
from .mcp_server import McpServer
from .terminal_bench import TerminalBench

FORMATS: dict[str, TaskFormat] = {}


def register(fmt: TaskFormat) -> TaskFormat:
    FORMATS[fmt.name] = fmt
    return fmt


for _builtin in (Harbor(), TerminalBench(), McpServer()):
    register(_builtin)


def detect(folder: Path) -> TaskFormat | None:
    """The format whose marker file `folder` holds (first registered wins), else None."""
    return next((f for f in FORMATS.values() if f.recognises(Path(folder))), None)


def source_names() -> set[str]:
    """`EnvSpec.source` values of imported environments."""
    return {f.source for f in FORMATS.values()}


def find_tasks(root: Path) -> list[Path]:
    """`root` itself if it is a task folder, else the task folders below it (sorted)."""
    root = Path(root)
    if not root.exists():
        raise TaskFormatError(root, "no such folder")
    if detect(root):
        return [root]
    return sorted({p.parent for f in FORMATS.values() for p in root.rglob(f.marker)})


def import_task(folder: Path) -> EnvSpec:
    """The task folder as an EnvSpec. Raises TaskFormatError only: whatever a format (a plugin's
    too) raises on odd input makes that folder malformed (one `import_malformed` reject), never the
    stage fail."""
    try:
        fmt = detect(Path(folder))
        if fmt is None:
            markers = " or ".join(f.marker for f in FORMATS.values())
            raise TaskFormatError(Path(folder), f"not a task folder (no {markers})")
        check_size(Path(folder))
        return fmt.read(Path(folder))
    except TaskFormatError:
        raise
    except Exception as err:
        raise TaskFormatError(Path(folder), f"cannot be imported: {err.__class__.__name__}: "
                                            f"{str(err).splitlines()[0] if str(err) else ''}"[:500]) from None


def markers() -> str:
    return " or ".join(f.marker for f in FORMATS.values())


__all__ = ["FORMATS", "TaskFormat", "TaskFormatError", "detect", "export_harbor", "find_tasks", "folder_digest",
           "import_task", "markers", "register", "source_names"]
