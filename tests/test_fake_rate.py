"""The fake teacher's aggregate token rate (tests/fake_openai.py `SharedRate`), used by
benchmarks/inflight_scale.py to stand in for a GPU server under continuous batching. Computed times on
a given clock, never wall-time thresholds."""

from __future__ import annotations

import json
import urllib.request

import pytest
from fake_openai import FakeOpenAI, SharedRate, tool_call


def test_share_splits_the_rate_and_respects_the_stream_cap():
    r = SharedRate(3000)
    assert r.share(0) == 0 and r.share(1) == 3000 and r.share(100) == pytest.approx(30)
    capped = SharedRate(3000, stream=100)
    assert capped.share(1) == 100 and capped.share(10) == 100 and capped.share(100) == pytest.approx(30)
    with pytest.raises(ValueError):
        SharedRate(0)


def test_two_concurrent_requests_take_twice_as_long_as_one():
    alone = SharedRate(100)
    a = alone.add(100, 0.0)
    assert alone.next_finish() == pytest.approx(1.0)
    assert alone.advance(5.0) == [(a, pytest.approx(1.0))]

    pair = SharedRate(100)
    x, y = pair.add(100, 0.0), pair.add(100, 0.0)
    assert pair.next_finish() == pytest.approx(2.0)
    assert pair.advance(1.99) == []
    assert sorted(pair.advance(5.0)) == [(x, pytest.approx(2.0)), (y, pytest.approx(2.0))]
    # busy while anything is in flight; two requests in flight for 2 s
    assert pair.busy_s == pytest.approx(2.0) and pair.inflight_s == pytest.approx(4.0)
    assert pair.tokens == 200


def test_staggered_arrivals_share_only_while_both_are_in_flight():
    r = SharedRate(100)
    a = r.add(100, 0.0)  # alone for 0.5 s: 50 tokens done
    b = r.add(100, 0.5)  # then 50 tok/s each: a is done at 1.5, b has 50 left, alone again: 2.0
    assert r.advance(10.0) == [(a, pytest.approx(1.5)), (b, pytest.approx(2.0))]
    assert r.busy_s == pytest.approx(2.0) and r.inflight_s == pytest.approx(0.5 + 2 * 1.0 + 0.5)
    c = r.add(10, 20.0)  # idle time is not busy
    assert r.advance(30.0) == [(c, pytest.approx(20.1))]
    assert r.busy_s == pytest.approx(2.1)


def test_rate_limited_server_reports_tokens_and_stats():
    with FakeOpenAI(script=lambda req, n: tool_call(None), rate_tok_s=20000, completion_tokens=40) as srv:
        body = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(srv.url + "/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert out["usage"]["completion_tokens"] == 40
        assert out["choices"][0]["finish_reason"] == "tool_calls"
        with urllib.request.urlopen(srv.url + "/stats", timeout=30) as resp:
            stats = json.loads(resp.read())
    assert stats["requests"] == 1 and stats["tokens"] == 40 and stats["inflight"] == 0
    assert len(stats["latencies"]) == 1 and stats["busy_s"] > 0


def test_monotonic_sized_clock_always_progresses():
    """At clock values like time.monotonic()'s, float rounding must never keep a request in flight
    (the scheduler would spin): every request is done, in arrival order for equal sizes."""
    r = SharedRate(3000, now=35012.123456)
    t = 35012.123456
    ids, done = [], []
    for _ in range(200):
        t += 0.0123
        ids.append(r.add(150, t))
        done += r.advance(t)
    done += r.advance(t + 3600)
    assert not r.heap and r.next_finish() is None
    assert [i for i, _ in done] == ids  # equal sizes: done in arrival order, each exactly once
    assert r.tokens == 200 * 150
    assert r.busy_s == pytest.approx(200 * 150 / 3000)  # all tokens at the full rate: no idle gap
