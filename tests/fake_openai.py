"""A fault-injecting OpenAI-compatible chat server for tests (the real vLLM server is exercised in
test_vllm_e2e.py; this one misbehaves on purpose: 500s, hangs, dropped connections, scripted replies).

Modes: `ok` (replies from `script(request, n)`), `500`, `hang`, `close`, `429` and `503` (each with
`Retry-After: retry_after` when that is set). `sequence` gives the mode of the first requests in
order (then `mode`); `delay_s` slows every answer (a slow but healthy server). Counts requests, their
arrival times (`times`, monotonic) and the largest number in flight at once.

Run as a script (`python fake_openai.py --port N`) it is a stand-in server process for the managed
vLLM server's lifecycle tests (`GET /health` answers 200).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def fenced(command: str) -> dict:
    return {"role": "assistant", "content": f"Let me check.\n```bash\n{command}\n```"}


def tool_call(command: str | None, i: int = 0) -> dict:
    name, args = ("submit", {}) if command is None else ("bash", {"command": command})
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{i}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}]}


class FakeOpenAI:
    def __init__(self, mode: str = "ok", script: Callable[[dict, int], dict] | None = None, delay_s: float = 0.0,
                 sequence: list[str] | None = None, retry_after: float | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.mode, self.script, self.delay_s = mode, script or (lambda req, n: fenced("ls")), delay_s
        self.sequence, self.retry_after = list(sequence or []), retry_after
        self.requests = 0
        self.times: list[float] = []
        self.modes: list[str] = []  # the mode each request was answered in
        self.inflight = 0
        self.max_inflight = 0
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                body = json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}).encode()
                self.send_response(200 if outer.mode != "500" else 500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(length) or b"{}")
                with outer.lock:
                    outer.requests += 1
                    n = outer.requests
                    mode = outer.sequence[n - 1] if n <= len(outer.sequence) else outer.mode
                    outer.times.append(time.monotonic())
                    outer.modes.append(mode)
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                    outer.bodies.append(req)
                try:
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    if mode == "hang":
                        time.sleep(3600)
                    if mode == "close":
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if mode in ("500", "429", "503"):
                        body = b'{"error": {"message": "boom"}}'
                        self.send_response(int(mode))
                        if mode != "500" and outer.retry_after is not None:
                            self.send_header("Retry-After", f"{outer.retry_after:g}")
                    else:
                        msg = outer.script(req, n)
                        body = json.dumps({
                            "id": f"cmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                            "model": req.get("model", "fake"),
                            "choices": [{"index": 0, "message": msg,
                                         "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}],
                            "usage": {"prompt_tokens": 50 + 10 * len(req.get("messages", [])),
                                      "completion_tokens": 12, "total_tokens": 62},
                        }).encode()
                        self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with outer.lock:
                        outer.inflight -= 1

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":  # a stand-in server process: `python fake_openai.py --port N [--delay-s S]`
    import argparse
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--die-after", type=int, default=0, help="crash at request N+1 (once: see --once-file)")
    ap.add_argument("--once-file", default="", help="crash only if this file does not exist yet; create it")
    args, _ = ap.parse_known_args()

    def script(req: dict, n: int) -> dict:
        if args.die_after and n > args.die_after and not os.path.exists(args.once_file):
            open(args.once_file, "w").close()
            os._exit(1)  # a crash: every request in flight is dropped
        return fenced("true")

    srv = FakeOpenAI("ok", script, delay_s=args.delay_s, host=args.host, port=args.port)
    print(f"serving on {srv.url}", flush=True)
    srv.server.serve_forever()
