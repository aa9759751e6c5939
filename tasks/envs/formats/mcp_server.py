"""Format `mcp-server`: bring your own MCP server. A folder with `mcp-env.yaml` becomes a `tools` environment:

```yaml
instruction: The counter named 'alpha' must end up at 42; leave the others.
runtime: python            # or node (Debian's Node.js, pinned, on the tools layer)
command: [python3, server.py]   # the server over stdio, run in server/ (copied to .tools/server/)
oracle:                    # the reference solution: tool calls
  - {name: set_counter, arguments: {name: alpha, value: 42}}
expected: {target: 42}     # optional: EXPECTED in the checks
```

beside `server/` (the server's files; a Python server may use the MCP SDK, which the tools layer holds),
`seed.sql` (the store: SQLite, built at image build into `store.db` in the work dir; the server finds it
at `$TRAJFORGE_STORE`) and `checks.py` (`test_*` functions over the final store read-only: `db()`,
`rows(sql, *params)`, `value(sql, *params)`, `EXPECTED`). The same hidden checks as every tool
environment follow the author's: `test_store_schema_unchanged`.

The environment carries the server (`.tools/server/`, `.tools/server.json`) and a one-shot client
(`.tools/call.py`: the reference solution's commands, `python3 -I .tools/call.py NAME 'ARGS'`); all of
`.tools/` is protected. The validator's `tools_serve` starts the server in the sandbox, lists its tools in
two sessions (the same list, shell-safe names, object schemas the oracle's arguments fit) and records
them with the server's name and version (`EnvSpec.tool_server`); running the oracle, a write outside the
store is `tools_write_outside_store`. A server that never starts, hangs or crashes is rejected with its
stderr named (`tools_broken`, `solution_fails`).

Or, instead of `server/`, a package pinned by one exact version (tasks/envs/tools/package.py):

```yaml
package: {pip: "counters-mcp==1.0.0"}   # or {npm: "counters-mcp@1.0.0"}; ranges, URLs, git refs: refused
command: [counters-mcp]                 # run in .tools/, the package's executables on PATH
```

Importing resolves the pin and its dependencies once, from the configured index / registry, into
`.tools/package.lock.json` (every artifact's file, version and sha256; the env id follows it) and caches the
artifacts under $TRAJFORGE_CACHE; the image build installs them with no network (pip: wheels only; npm:
install scripts never run, tarballs of regular files and folders only) and refuses an artifact whose bytes
differ from the lock (`artifact_mismatch`). Every dependency comes from the index / registry (a direct URL,
`file:` or git spec is refused, named, before it is fetched).
`.tools/server.json` then names the `package`; the validation is the same.
"""

from __future__ import annotations

import json
from pathlib import Path

from ....schemas.common import FileSpec
from ....schemas.config import safe_name
from ....schemas.environment import EnvSpec
from ..families.base import tests_module
from ..tools.checks import PRELUDE, SCHEMA_CHECK, SCHEMA_SQL
from ..tools.package import LOCK_FILE, MANAGERS, PackageError, parse_pin, resolve
from ..tools.spec import CALL_SOURCE, TOOLS_DIR, SeedError, call_command, load_seed
from . import base
from .base import TaskFormat, TaskFormatError, check_links, folder_digest

RUNTIMES = {"python", "node"}


def import_mcp_server(folder: Path) -> EnvSpec:
    folder = Path(folder)
    meta_path = folder / "mcp-env.yaml"
    meta = base.yaml_mapping(meta_path)
    instruction = base.instruction_text(meta.get("instruction"), meta_path)
    pin = None
    if "package" in meta:  # a pinned package instead of a server/ folder (tasks/envs/tools/package.py)
        try:
            pin = parse_pin(meta["package"])
        except PackageError as err:
            raise TaskFormatError(meta_path, str(err)) from None
        if (folder / "server").exists():
            raise TaskFormatError(meta_path, "field `package` and a server/ folder: the server is one or the other")
        if meta.get("runtime", MANAGERS[pin[0]]) != MANAGERS[pin[0]]:
            raise TaskFormatError(meta_path, f"field `runtime` must be {MANAGERS[pin[0]]} for a {pin[0]} package "
                                             f"(or left out), got {meta['runtime']!r}")
    runtime = meta.get("runtime", MANAGERS[pin[0]] if pin else "python")
    if runtime not in RUNTIMES:
        raise TaskFormatError(meta_path, f"field `runtime` must be one of {sorted(RUNTIMES)}, got {runtime!r}")
    command = meta.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
        raise TaskFormatError(meta_path, "field `command` must be a non-empty list of strings (the server's argv)")
    oracle = meta.get("oracle")
    if not isinstance(oracle, list) or not oracle or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), dict)
            for c in oracle):
        raise TaskFormatError(meta_path, "field `oracle` must be a non-empty list of {name, arguments} tool calls")
    expected = meta.get("expected", {})
    if not isinstance(expected, dict) or any(str(k).startswith("__") for k in expected):
        raise TaskFormatError(meta_path, "field `expected` must be a mapping (keys starting with '__' are reserved)")
    check_links(folder)
    if pin is None and not (folder / "server").is_dir():
        raise TaskFormatError(folder / "server", "missing (the server's folder, or a pinned `package` in mcp-env.yaml)")
    server = base.file_specs(folder / "server") if pin is None else []
    seed = base.read_file(folder / "seed.sql", "the store's schema and rows")
    checks = base.read_file(folder / "checks.py", "the end-state checks")
    if "def test_" not in checks:
        raise TaskFormatError(folder / "checks.py", "defines no test_* function")
    try:
        con = load_seed(seed)
    except SeedError as err:
        raise TaskFormatError(folder / "seed.sql", f"does not build a store: {err}") from None
    try:
        schema = [list(r) for r in con.execute(SCHEMA_SQL)]
    finally:
        con.close()
    launch: dict = {"runtime": runtime, "command": command}
    files = [FileSpec(path=f"{TOOLS_DIR}/server/{f.path}", content=f.content, mode=f.mode) for f in server]
    knobs: dict = {"imported_from": folder.name, "runtime": runtime, "oracle_calls": len(oracle)}
    id_parts = [folder_digest(folder)]
    if pin is not None:  # resolved once, here: the lock is in the environment, its id and its image
        try:
            lock, _ = resolve(*pin)
        except PackageError as err:
            raise TaskFormatError(meta_path, f"field `package`: {err}") from None
        text = json.dumps(lock, indent=1, sort_keys=True) + "\n"
        files.append(FileSpec(path=f"{TOOLS_DIR}/{LOCK_FILE}", content=text))
        launch["package"] = knobs["package"] = f"{pin[0]}:{lock['name']}{'==' if pin[0] == 'pip' else '@'}{pin[2]}"
        if lock.get("install_scripts"):
            knobs["install_scripts_not_run"] = lock["install_scripts"]
        id_parts.append(text)
    files += [
        FileSpec(path=f"{TOOLS_DIR}/server.json", content=json.dumps(launch, sort_keys=True) + "\n"),
        FileSpec(path=f"{TOOLS_DIR}/call.py", content=CALL_SOURCE.read_text()),
        FileSpec(path=f"{TOOLS_DIR}/seed.sql", content=seed)]
    body = "\n\n".join([PRELUDE, checks.strip(), SCHEMA_CHECK])
    return EnvSpec(
        env_id=base.folder_env_id("mcp", folder, id_parts), kind="tools",
        family=f"mcp-server:{safe_name(folder.name)}", level=base.LEVELS.get(str(meta.get("difficulty", "")), 2),
        seed=0, source="mcp-server", instruction=instruction.strip(), files=files,
        setup=[f"python3 -I {TOOLS_DIR}/call.py init", f"rm {TOOLS_DIR}/seed.sql"],
        tests=[FileSpec(path="test_task.py", content=tests_module({**expected, "__schema__": schema}, body))],
        solution=[call_command(c["name"], c.get("arguments", {}), brought=True) for c in oracle],
        protected=[f"{TOOLS_DIR}/*", f"{TOOLS_DIR}/**/*", f"{TOOLS_DIR}/**/.*"],
        knobs_json=json.dumps(knobs, sort_keys=True))


class McpServer(TaskFormat):
    name = "mcp-server"
    marker = "mcp-env.yaml"

    def read(self, folder: Path) -> EnvSpec:
        return import_mcp_server(folder)
