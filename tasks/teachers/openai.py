"""Backend `openai`: teachers behind OpenAI-compatible endpoints (a fleet of vLLM servers, a hosted API).

Owns its settings (`OpenAIClientConfig`: the endpoints and how to talk to them), the session that
turns one request into one `Turn` exactly as the model produced it, and a start-up health probe.
Retries with exponential backoff (tenacity) on 429, 5xx, timeouts and dropped connections; routing,
in-flight caps and dead endpoints are `endpoints.EndpointPool`'s. Requests carry a seed derived from
(teacher.seed, rollout id, turn) when `seed` is set: a rerun asks the same thing.
"""

from __future__ import annotations

import contextlib
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
    request_timeout_s: float = operational(120, gt=0)
    retries: int = operational(3, ge=0)
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


def _is_context_error(err: BaseException) -> bool:
    text = str(err).lower()
    return any(k in text for k in ("context length", "maximum context", "context window", "too long",
                                   "max_model_len", "maximum model length"))


class _Session:
    def __init__(self, teacher: "OpenAITeacher", rollout_id: str):
        self.t, self.rollout_id, self.turn = teacher, rollout_id, 0

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        from openai import BadRequestError
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        cfg, pool = self.t.cfg, self.t.pool
        self.turn += 1
        kwargs: dict[str, Any] = dict(model=cfg.served_model, messages=[m.api_dict() for m in messages],
                                      temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
        if cfg.seed is not None:
            kwargs["seed"] = stable_hash(f"{cfg.seed}|{self.rollout_id}|{self.turn}") % (2 ** 31)
        if cfg.tool_calling and tools:
            kwargs["tools"] = tools
        if cfg.logprobs:
            kwargs["logprobs"] = True
        if cfg.return_token_ids:
            kwargs["extra_body"] = {"return_token_ids": True}

        t0 = time.monotonic()
        endpoint = None
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(cfg.retries + 1), reraise=True,
                                               wait=wait_exponential(multiplier=0.5, max=8),
                                               retry=retry_if_exception(_transient)):
                with attempt:
                    endpoint = pool.pick(self.rollout_id)
                    try:
                        async with endpoint.gate.hold():
                            resp = await endpoint.client.chat.completions.create(**kwargs)
                    except Exception as err:
                        pool.report(endpoint, ok=not _transient(err))
                        raise
                    pool.report(endpoint, ok=True)
        except BadRequestError as err:
            if _is_context_error(err):
                raise ContextOverflow(str(err)[:500]) from None
            raise TeacherError(f"teacher rejected the request: {str(err)[:500]}") from None
        except Exception as err:
            where = endpoint.url if endpoint else "?"
            raise TeacherError(f"teacher {where} failed after {cfg.retries + 1} attempt(s): "
                               f"{err.__class__.__name__}: {str(err)[:300]}") from None
        if not resp.choices:
            raise TeacherError(f"teacher {endpoint.url} returned no choices")
        choice = resp.choices[0]
        msg = choice.message
        calls = None
        if msg.tool_calls:
            calls = [ToolCall(id=c.id or f"call_{i}", function=FunctionCall(name=c.function.name,
                                                                            arguments=c.function.arguments or "{}"))
                     for i, c in enumerate(msg.tool_calls)]
        usage = resp.usage
        token_ids = getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content:
            logprobs = [round(float(t.logprob), 5) for t in choice.logprobs.content]
        return Turn(Message(role="assistant", content=msg.content, tool_calls=calls),
                    prompt_tokens=usage.prompt_tokens if usage else 0,
                    completion_tokens=usage.completion_tokens if usage else 0,
                    latency_s=time.monotonic() - t0, finish_reason=choice.finish_reason,
                    completion_token_ids=list(token_ids) if token_ids else None, logprobs=logprobs,
                    endpoint=endpoint.url)


class OpenAITeacher:
    """Any OpenAI-compatible chat endpoint(s); one client pool per shard driver (event loop)."""

    def __init__(self, cfg: OpenAIClientConfig, endpoints: list[str], limiter: LimiterFactory | None = None):
        if not cfg.served_model:
            raise ValueError("teacher.model is required for an OpenAI-compatible teacher")
        self.cfg, self.label = cfg, cfg.label
        self.pool = EndpointPool(cfg, endpoints, limiter)

    def session(self, env: EnvSpec, sample: int, rollout_id: str) -> _Session:
        return _Session(self, rollout_id)

    def endpoint_stats(self) -> dict[str, dict[str, int]]:
        return {e.url: {"requests": e.requests, "errors": e.errors} for e in self.pool.endpoints}

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
