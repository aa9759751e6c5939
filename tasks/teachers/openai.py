"""Backend `openai`: teachers behind OpenAI-compatible endpoints (a fleet of vLLM servers, a hosted API).

Owns its settings (`OpenAIClientConfig`: the endpoints and how to talk to them), the session that
turns one request into one `Turn` exactly as the model produced it, and a start-up health probe.
Routing, in-flight caps and dead endpoints are `endpoints.EndpointPool`'s. Requests carry a seed
derived from (teacher.seed, rollout id, turn) when `seed` is set: a rerun asks the same thing.

Retries, per turn (teacher time, reported in `Turn.wait_s`, never the agent's):
- a 429, or a 503 with `Retry-After`: wait at least what the server asks (plus jittered backoff);
  counted as `rate_limited`, not as a failure;
- connection refused (a server down or restarting, e.g. the managed vLLM's watchdog at work): retried
  with jittered exponential backoff, not counted as a failure;
- 5xx, stalls (`request_timeout_s`) and dropped connections: at most `retries` + 1 such attempts.
Everything is bounded by the turn's teacher budget, `max_wait_s` + the generation the agent may be
charged (`max_tokens / agent_tokens_per_s`); past it the turn raises TeacherError (`teacher_error`).
A server known dead for good (the build says so: `endpoints.DEAD_KEY`) ends the turn at its next
failed request, without waiting for that budget (or moves it to another endpoint, if one is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import email.utils
import json
import random
import time
import urllib.request
from typing import Any, Iterator, Literal

from pydantic import model_validator

from ...schemas.config import TeacherConfig, operational
from ...schemas.environment import EnvSpec
from ...schemas.trajectory import FunctionCall, Message, ToolCall
from ..engine.contract import LimiterFactory, StageContext
from .base import ContextOverflow, TeacherBackend, TeacherError, Turn, stable_hash
from .endpoints import EndpointPool


class OpenAIClientConfig(TeacherConfig):
    """How to reach OpenAI-compatible endpoints: every field here is operational (where and how
    requests travel, not what is asked), so none of them is part of a fingerprint."""

    endpoints: list[str] = operational(default_factory=list, description="base URLs")
    base_url: str | None = operational(None, description="a single base URL")
    api_key_env: str = operational("OPENAI_API_KEY")
    request_timeout_s: float | None = operational(None, gt=0, description=(
        "one request longer than this is a stalled server (retried); default: only the turn's teacher "
        "budget bounds it (a slow but healthy server is waited for)"))
    retries: int = operational(3, ge=0, description="attempts after a 5xx, stall or dropped connection")
    max_inflight_per_endpoint: int = operational(32, ge=1, description="cap across all workers")
    dead_after_failures: int = operational(3, ge=1)
    dead_cooldown_s: float = operational(30, ge=0)

    def all_endpoints(self) -> list[str]:
        return [u.rstrip("/") for u in [*self.endpoints, *([self.base_url] if self.base_url else [])]]


class OpenAITeacherConfig(OpenAIClientConfig):
    """Existing endpoints (`endpoints` or `base_url`) serving `model`."""

    backend: Literal["openai"]

    @model_validator(mode="after")
    def _reachable(self) -> "OpenAITeacherConfig":
        if not self.all_endpoints():
            raise ValueError("backend 'openai' needs `endpoints` (or `base_url`)")
        if not self.model:
            raise ValueError("backend 'openai' needs `model`")
        return self

    @property
    def label(self) -> str:
        return self.name or f"openai:{self.model}"


def _transient(err: BaseException) -> bool:
    from openai import APIConnectionError, APIStatusError, APITimeoutError

    if isinstance(err, (APIConnectionError, APITimeoutError)):
        return True
    return isinstance(err, APIStatusError) and (err.status_code == 429 or err.status_code >= 500)


def retry_after(err: BaseException) -> float | None:
    """Seconds the server asked to wait (`Retry-After`: seconds or an HTTP date), if it did."""
    response = getattr(err, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        with contextlib.suppress(TypeError, ValueError):
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, (when - dt.datetime.now(dt.timezone.utc)).total_seconds())
    return None


def failure_kind(err: BaseException) -> Literal["rate_limited", "down", "failed"]:
    """`rate_limited`: 429 / 503 with Retry-After; `down`: nothing listens (refused, unreachable);
    `failed`: 5xx, a stall, a dropped connection (counted against `retries`)."""
    from openai import APIStatusError

    if isinstance(err, APIStatusError):
        limited = err.status_code == 429 or (err.status_code == 503 and retry_after(err) is not None)
        return "rate_limited" if limited else "failed"
    # by name: the openai client's HTTP library is httpx or a renamed copy of it (httpx2)
    if type(err.__cause__).__name__ in ("ConnectError", "ConnectTimeout"):
        return "down"
    return "failed"


def backoff(attempt: int, asked: float | None) -> float:
    """Full-jitter exponential backoff (0.5 s doubling, at most 8 s), never below what the server asked."""
    return max(random.uniform(0, min(8.0, 0.5 * 2 ** attempt)), asked or 0.0)


def _is_context_error(err: BaseException) -> bool:
    text = str(err).lower()
    return any(k in text for k in ("context length", "maximum context", "context window", "too long",
                                   "max_model_len", "maximum model length"))


def tool_call_from(c: Any, i: int) -> ToolCall:
    """A tool call as the server sent it. A malformed one (no `function`, no name, arguments that
    are not text) is kept as well as it can be, never raised: the harness answers it with a format
    error (the model's fault, `format_error`), not an infrastructure failure."""
    fn = getattr(c, "function", None)
    name, args = getattr(fn, "name", None), getattr(fn, "arguments", None)
    if args is not None and not isinstance(args, str):
        args = json.dumps(args, default=str)
    return ToolCall(id=str(getattr(c, "id", None) or f"call_{i}"),
                    function=FunctionCall(name=name if isinstance(name, str) else "", arguments=args or "{}"))


class _Session:
    def __init__(self, teacher: "OpenAITeacher", rollout_id: str):
        self.t, self.rollout_id, self.turn = teacher, rollout_id, 0

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        from openai import BadRequestError

        cfg, pool = self.t.cfg, self.t.pool
        self.turn += 1
        kwargs: dict[str, Any] = dict(model=cfg.served_model, messages=[m.api_dict() for m in messages],
                                      temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if cfg.seed is not None:
            kwargs["seed"] = stable_hash(f"{cfg.seed}|{self.rollout_id}|{self.turn}") % (2 ** 31)
        if cfg.tool_calling and tools:
            kwargs["tools"] = tools
            if cfg.tool_choice != "auto":
                kwargs["tool_choice"] = cfg.tool_choice
        if cfg.logprobs:
            kwargs["logprobs"] = True
        if cfg.return_token_ids:
            kwargs["extra_body"] = {"return_token_ids": True}

        t0 = time.monotonic()
        deadline = t0 + cfg.max_wait_s + cfg.max_tokens / cfg.agent_tokens_per_s
        endpoint, attempts, failures = None, 0, 0

        def out_of_time(last: str) -> TeacherError:
            return TeacherError(f"teacher {endpoint.url if endpoint else '?'} gave no answer within teacher.max_wait_s="
                                f"{cfg.max_wait_s:g}s (+ {cfg.max_tokens / cfg.agent_tokens_per_s:.0f}s of generation) "
                                f"after {attempts} attempt(s): {last}")

        while True:
            endpoint = pool.pick(self.rollout_id)
            attempts += 1
            sent = None
            try:
                async with endpoint.gate.hold(timeout=max(0.0, deadline - time.monotonic())):
                    sent = time.monotonic()
                    limit = min(cfg.request_timeout_s or float("inf"), deadline - sent)
                    try:
                        resp = await endpoint.client.chat.completions.create(**kwargs, timeout=max(limit, 0.01))
                    except Exception as err:  # a non-transient error (4xx) is the request's, not a death
                        pool.report(endpoint, "ok" if not _transient(err) else
                                    "rate_limited" if failure_kind(err) == "rate_limited" else "error")
                        raise
                    pool.report(endpoint, "ok")
                    break
            except BadRequestError as err:
                if _is_context_error(err):
                    raise ContextOverflow(str(err)[:500]) from None
                raise TeacherError(f"teacher rejected the request: {str(err)[:500]}") from None
            except Exception as err:
                if isinstance(err, TimeoutError) and sent is None:  # waited for a slot until the deadline
                    raise out_of_time(f"no free slot at the in-flight cap ({cfg.max_inflight_per_endpoint})") from None
                last = f"{err.__class__.__name__}: {str(err)[:300]}"
                if not _transient(err):
                    raise TeacherError(f"teacher {endpoint.url} failed: {last}") from None
                if await pool.is_gone(endpoint):
                    continue  # dead for good: another endpoint, or `pick` ends the turn (TeacherError)
                if time.monotonic() >= deadline:
                    raise out_of_time(last) from None
                failure = failure_kind(err)
                failures += failure == "failed"
                if failures > cfg.retries:
                    raise TeacherError(f"teacher {endpoint.url} failed after {attempts} attempt(s): {last}") from None
                pause = backoff(attempts, retry_after(err) if failure == "rate_limited" else None)
                if time.monotonic() + pause >= deadline:
                    raise out_of_time(last) from None
                await asyncio.sleep(pause)
        done = time.monotonic()
        latency = done - sent
        self.t.wait_s += done - t0 - latency
        if not resp.choices:
            raise TeacherError(f"teacher {endpoint.url} returned no choices")
        choice = resp.choices[0]
        msg = choice.message
        calls = None
        if msg.tool_calls:
            calls = [tool_call_from(c, i) for i, c in enumerate(msg.tool_calls)]
        usage = resp.usage
        token_ids = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
        prompt_ids = (resp.model_extra or {}).get("prompt_token_ids")  # vLLM, with return_token_ids
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content:
            logprobs = [round(float(t.logprob), 5) for t in choice.logprobs.content]
        reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
        return Turn(Message(role="assistant", content=msg.content, tool_calls=calls, reasoning_content=reasoning),
                    prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0,
                    latency_s=latency, wait_s=done - t0 - latency, finish_reason=choice.finish_reason,
                    completion_token_ids=list(token_ids) if token_ids else None, logprobs=logprobs,
                    endpoint=endpoint.url, prompt_token_ids=list(prompt_ids) if prompt_ids else None)


class OpenAITeacher:
    """Any OpenAI-compatible chat endpoint(s); one client pool per shard driver (event loop)."""

    def __init__(self, cfg: OpenAIClientConfig, endpoints: list[str], limiter: LimiterFactory | None = None,
                 dead_files: dict[str, str] | None = None):
        """`dead_files`: {endpoint: URL of the file that appears once its server is dead for good}."""
        if not cfg.served_model:
            raise ValueError("teacher.model is required for an OpenAI-compatible teacher")
        self.cfg, self.label = cfg, cfg.label
        self.pool = EndpointPool(cfg, endpoints, limiter, dead_files)
        self.wait_s = 0.0  # teacher time of every answered turn (queue, retries, backoff)

    def session(self, env: EnvSpec, sample: int, rollout_id: str) -> _Session:
        return _Session(self, rollout_id)

    def endpoint_stats(self) -> dict[str, dict[str, int]]:
        """Per endpoint: requests, deaths (`errors`: connection errors, 5xx, stalls), `rate_limited` (429s)."""
        return {e.url: {"requests": e.requests, "errors": e.errors, "rate_limited": e.rate_limited}
                for e in self.pool.endpoints}

    async def aclose(self) -> None:
        await self.pool.aclose()


def probe(url: str, timeout: float = 5) -> str | None:
    """None when `GET <url>/models` answers 200, else the reason."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except Exception as err:
        return f"{err.__class__.__name__}: {err}"


class OpenAIBackend(TeacherBackend):
    name = "openai"
    config = OpenAITeacherConfig

    def make(self, cfg: OpenAITeacherConfig, runtime: dict[str, Any], limiter: LimiterFactory | None = None):
        return OpenAITeacher(cfg, cfg.all_endpoints(), limiter)

    @contextlib.contextmanager
    def service(self, cfg: OpenAITeacherConfig, ctx: StageContext, console: Any) -> Iterator[dict[str, Any]]:
        """Probe each endpoint once: a dead one is reported, not fatal (the pool takes it out of
        rotation and its episodes end as `teacher_error`)."""
        for url in cfg.all_endpoints():
            problem = probe(url)
            if problem:
                console.print(f"[yellow]![/] teacher endpoint {url} is not healthy ({problem}); "
                              "its episodes move to other endpoints or end as teacher_error")
        yield {"teacher_endpoints": cfg.all_endpoints()}
