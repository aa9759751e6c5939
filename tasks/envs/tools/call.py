"""One tool call to a brought MCP server (an `mcp-server` folder, tasks/envs/formats/mcp_server.py), standard
library only: what the reference solution's commands and a recorded trajectory's steps run in the sandbox.

Copied into such an environment as `.tools/call.py`, next to `.tools/server.json` (the server's `command`,
run in `.tools/server/` with `TRAJFORGE_STORE` naming the store; a server pinned as a package runs in `.tools/`
with its executables on PATH and its modules on PYTHONPATH / NODE_PATH). `call.py NAME 'JSON'` starts the server,
does the MCP handshake and one `tools/call`, prints the result's text and exits 0 (ok), 1 (a tool error:
`isError`), 2 (a call error: JSON-RPC -32602 or arguments that are not a JSON object) or 3 (the server did
not start, answer or stay up; the reason on stdout). `call.py init` builds `store.db` from `.tools/seed.sql`.
"""

import json
import os
import sqlite3
import subprocess
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.dirname(HERE)
STORE = os.path.join(WORK, "store.db")
SDK_DIR = "/opt/trajforge/mcp"  # the tools layer's SDK, for Python servers (tasks/envs/tools/layer.py)
PKG_DIR = "/opt/trajforge/pkg"  # a server pinned as a package (tasks/envs/tools/package.py)
PROTOCOL = "2025-06-18"
STDERR_TAIL = 8192  # characters of the server's stderr kept for a failure's message


class Drain(threading.Thread):
    """Reads a stream to its end while the call runs (a server that writes more than a pipe holds to stderr must
    not block), keeping only its last STDERR_TAIL characters."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.kept = stream, ""

    def run(self):
        try:
            for chunk in iter(lambda: self.stream.read(4096), ""):
                self.kept = (self.kept + chunk)[-STDERR_TAIL:]
        except (OSError, ValueError):
            pass

    def tail(self, n=800):
        self.join(5)
        return self.kept[-n:]


def launch():
    """(argv, cwd, environment) of the server, as `.tools/server.json` declares it."""
    with open(os.path.join(HERE, "server.json")) as f:
        spec = json.load(f)
    env = {**os.environ, "TRAJFORGE_STORE": STORE, "PYTHONPATH": SDK_DIR, "PYTHONDONTWRITEBYTECODE": "1"}
    if spec.get("package"):  # pinned as a package: installed in PKG_DIR, run in .tools/
        env.update(PATH=PKG_DIR + "/bin:" + env.get("PATH", "/usr/bin:/bin"), PYTHONPATH=PKG_DIR + "/site:" + SDK_DIR,
                   NODE_PATH=PKG_DIR + "/node_modules")
        return spec["command"], HERE, env
    return spec["command"], os.path.join(HERE, "server"), env


def call(name, arguments):
    """(exit code, text) of one call."""
    argv, cwd, env = launch()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    drain = Drain(proc.stderr)
    drain.start()
    try:
        for msg in [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "trajforge", "version": "1"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}]:
            proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if not isinstance(reply, dict) or reply.get("id") != 2:
                continue
            if "error" in reply:
                err = reply["error"] if isinstance(reply["error"], dict) else {}
                return (2 if err.get("code") == -32602 else 3), f"error: {err.get('message', reply['error'])}"
            result = reply.get("result") or {}
            text = "\n".join(str(c.get("text", "")) for c in result.get("content") or [] if isinstance(c, dict))
            return (1 if result.get("isError") else 0), text
        return 3, "the tool server ended without an answer: " + drain.tail()
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(5)


def init_store():
    if os.path.exists(STORE):
        os.remove(STORE)
    db = sqlite3.connect(STORE)
    with open(os.path.join(HERE, "seed.sql")) as f:
        db.executescript(f.read())
    db.commit()
    db.close()


def main(argv):
    if argv == ["init"]:
        init_store()
        return 0
    if len(argv) != 2:
        print("usage: call.py [init | NAME JSON]", file=sys.stderr)
        return 2
    try:
        arguments = json.loads(argv[1])
    except ValueError as err:
        print(f"call error: {err}")
        return 2
    if not isinstance(arguments, dict):
        print("call error: arguments must be a JSON object")
        return 2
    code, text = call(argv[0], arguments)
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
