"""A fault-injecting OpenAI-compatible chat server for tests (the real vLLM server is exercised in
test_vllm_e2e.py; this one misbehaves on purpose: 500s, hangs, dropped connections, scripted replies).

Modes: `ok` (replies from `script(request, n)`), `500`, `hang`, `close`, `429` and `503` (each with
`Retry-After: retry_after` when that is set). `sequence` gives the mode of the first requests in
order (then `mode`); `delay_s` slows every answer (a slow but healthy server). Counts requests, their
arrival times (`times`, monotonic) and the largest number in flight at once.

Run as a script (`python fake_openai.py --port N`) it is a stand-in server process for the managed
vLLM server's lifecycle tests (`GET /health` answers 200).

`rate_tok_s` (opt-in) makes it a stand-in for a GPU server under continuous batching: every answer
carries `completion_tokens` tokens and is held until they are generated, `rate_tok_s` shared equally
by the requests in flight (each at most `stream_tok_s`): `SharedRate`. `GET .../stats` then gives
busy seconds, in-flight request-seconds and per-request latencies (benchmarks/inflight_scale.py).
"""

from __future__ import annotations

import heapq
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


class SharedRate:
    """Processor sharing: `rate` tokens/s split equally among the requests in flight, each at most
    `stream` tokens/s; a request is done once its own tokens are generated. Pure bookkeeping on the
    times it is given (`add`, `advance`), so it is testable without a clock; `serve` blocks a server
    thread on the real clock, with one scheduler thread waking each request when it is done.

    Invariants: tokens are generated at `min(rate, n * stream)` whenever n >= 1 requests are in flight
    (none are lost or made up); `busy_s` counts the time with n >= 1, `inflight_s` integrates n."""

    def __init__(self, rate: float, stream: float | None = None, now: float = 0.0):
        if rate <= 0 or (stream is not None and stream <= 0):
            raise ValueError("rate and stream must be > 0 tokens/s")
        self.rate, self.stream = rate, stream
        self.t = now
        self.work = 0.0  # tokens generated per request so far (the same for every request in flight)
        self.heap: list[tuple[float, int]] = []  # (work level at which the request is done, id)
        self.busy_s = 0.0
        self.inflight_s = 0.0
        self.tokens = 0.0
        self._next = 0
        self._done: list[tuple[int, float]] = []  # done, not yet returned by `advance`
        self._cond = threading.Condition()
        self._events: dict[int, threading.Event] = {}
        self._scheduler: threading.Thread | None = None

    def share(self, n: int) -> float:
        """Tokens/s each of `n` requests in flight gets."""
        return min(self.rate / n, self.stream or float("inf")) if n else 0.0

    def add(self, tokens: float, now: float) -> int:
        """A request of `tokens` arrives at `now`; returns its id (requests done by `now` are kept for
        the next `advance`)."""
        self._step(now)
        self._next += 1
        heapq.heappush(self.heap, (self.work + max(tokens, 0.0), self._next))
        self.tokens += max(tokens, 0.0)
        return self._next

    def next_finish(self) -> float | None:
        """When the first request in flight is done if nothing else arrives (None: none in flight)."""
        if not self.heap:
            return None
        return self.t + (self.heap[0][0] - self.work) / self.share(len(self.heap))

    def advance(self, now: float) -> list[tuple[int, float]]:
        """Move the clock to `now`; (id, time done) of every request done by then and not yet
        returned, in order."""
        self._step(now)
        done, self._done = self._done, []
        return done

    def _step(self, now: float) -> None:
        done = self._done
        while self.heap and now > self.t:
            n = len(self.heap)
            finish = self.next_finish()
            until = min(now, finish)
            self.work += (until - self.t) * self.share(n)
            self.busy_s += until - self.t
            self.inflight_s += n * (until - self.t)
            self.t = until
            if until == finish:  # the first request is done now (float rounding must not keep it)
                self.work = max(self.work, self.heap[0][0])
            while self.heap and self.heap[0][0] <= self.work + 1e-9:
                done.append((heapq.heappop(self.heap)[1], self.t))
        self.t = max(self.t, now)

    def serve(self, tokens: float) -> float:
        """Block until a request of `tokens` is generated (real clock); its latency in seconds."""
        with self._cond:
            if self._scheduler is None:
                self.t = time.monotonic()
                self._scheduler = threading.Thread(target=self._schedule, daemon=True)
                self._scheduler.start()
            t0 = time.monotonic()
            rid = self.add(tokens, t0)
            ev = self._events[rid] = threading.Event()
            self._cond.notify()
        ev.wait()
        return time.monotonic() - t0

    def _schedule(self) -> None:
        with self._cond:
            while True:
                for rid, _ in self.advance(time.monotonic()):
                    self._events.pop(rid).set()
                finish = self.next_finish()
                self._cond.wait(None if finish is None else max(0.0, finish - time.monotonic()) + 1e-4)

    def stats(self) -> dict:
        with self._cond:
            self._step(time.monotonic() if self._scheduler else self.t)
            return {"busy_s": self.busy_s, "inflight_s": self.inflight_s, "tokens": self.tokens,
                    "inflight": len(self.heap)}


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # hundreds of clients may connect at once (the default backlog is 5)


class LoopbackServer:
    """An HTTP server served on a daemon thread while in `with` (`serve(server)` from `__init__`); `url` is
    its OpenAI-style base URL."""

    def serve(self, server) -> None:
        self.server = server
        self.url = f"http://{server.server_address[0]}:{server.server_address[1]}/v1"
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeOpenAI(LoopbackServer):
    def __init__(self, mode: str = "ok", script: Callable[[dict, int], dict] | None = None, delay_s: float = 0.0,
                 sequence: list[str] | None = None, retry_after: float | None = None, host: str = "127.0.0.1",
                 port: int = 0, rate_tok_s: float | None = None, stream_tok_s: float | None = None,
                 completion_tokens: int = 12):
        self.mode, self.script, self.delay_s = mode, script or (lambda req, n: fenced("ls")), delay_s
        self.rate = SharedRate(rate_tok_s, stream_tok_s) if rate_tok_s else None
        self.completion_tokens = completion_tokens
        self.latencies: list[float] = []  # with `rate_tok_s`: each answer's generation time
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
                if outer.rate is not None and self.path.rstrip("/").endswith("/stats"):
                    with outer.lock:
                        body = json.dumps({**outer.rate.stats(), "requests": outer.requests,
                                           "max_inflight": outer.max_inflight,
                                           "latencies": outer.latencies}).encode()
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
                        if outer.rate is not None:
                            took = outer.rate.serve(outer.completion_tokens)
                            with outer.lock:
                                outer.latencies.append(round(took, 4))
                        body = json.dumps({
                            "id": f"cmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                            "model": req.get("model", "fake"),
                            "choices": [{"index": 0, "message": msg,
                                         "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}],
                            "usage": {"prompt_tokens": 50 + 10 * len(req.get("messages", [])),
                                      "completion_tokens": outer.completion_tokens,
                                      "total_tokens": 50 + outer.completion_tokens},
                        }).encode()
                        self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with outer.lock:
                        outer.inflight -= 1

        server = _Server((host, port), Handler)
        server.daemon_threads = True
        self.serve(server)


if __name__ == "__main__":  # a stand-in server process: `python fake_openai.py --port N [--delay-s S]`
    import argparse
    import os

    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--die-after", type=int, default=0, help="crash at request N+1 (once: see --once-file)")
    ap.add_argument("--once-file", default="", help="crash only if this file does not exist yet; create it")
    ap.add_argument("--solutions", default="", help=(
        "JSONL of {instruction, commands}: a conversation whose user message is a listed instruction gets its "
        "commands (one fenced block), then SUBMIT; any other gets `true` until the episode ends"))
    args, _ = ap.parse_known_args()
    solutions = {}
    if args.solutions:
        with open(args.solutions) as f:
            solutions = {d["instruction"]: d["commands"] for d in map(json.loads, f) if d}

    def script(req: dict, n: int) -> dict:
        if args.die_after and n > args.die_after and not os.path.exists(args.once_file):
            open(args.once_file, "w").close()
            os._exit(1)  # a crash: every request in flight is dropped
        users = [m.get("content") for m in req["messages"] if m["role"] == "user"]
        commands = solutions.get(users[0]) if users else None
        if commands is not None:
            if any(m["role"] == "assistant" for m in req["messages"]):
                return {"role": "assistant", "content": "SUBMIT"}
            return fenced("\n".join(commands))
        return fenced("true")

    srv = FakeOpenAI("ok", script, delay_s=args.delay_s, host=args.host, port=args.port)
    print(f"serving on {srv.url}", flush=True)
    srv.server.serve_forever()
