"""LLM synthesis of environments (parser -> generator -> validator) driven by a scripted teacher that
returns prepared good and bad candidates; a build mixing procedural, imported and LLM sources reports
the yield per source and reason."""

from __future__ import annotations

import json
import posixpath
import shutil
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from helpers import small_config

from trajforge.flows.launch import run_build
from trajforge.schemas.config import parse_config
from trajforge.tasks.engine.store import RunStore
from trajforge.tasks.envs.synthesis.reply import extract_json
from trajforge.tasks.envs.synthesis.terminal import parse_candidate

FIXTURES = Path(__file__).parent / "fixtures"
GOOD = {"instruction": "Count the lines of events.log that contain the word FAILED and write the number to failed.txt.",
        "files": [{"path": "events.log", "content": "ok\nFAILED a\nFAILED b\nok\nFAILED c\n"}],
        "tests": "def test_count():\n    assert (W / 'failed.txt').read_text().strip() == '3'\n",
        "solution": ["grep -c FAILED events.log > failed.txt"], "level": 1}


def reply(req: dict, n: int) -> dict:
    prompt = req["messages"][-1]["content"]
    if "Variant 0." in prompt:
        text = "Here is the task:\n```json\n" + json.dumps(GOOD) + "\n```"
    elif "Variant 1." in prompt:
        text = "Sure! A great task would be counting words in a file."
    elif "Variant 2." in prompt:
        text = json.dumps({k: v for k, v in GOOD.items() if k != "tests"} | {"level": 7})
    else:
        text = json.dumps(GOOD | {"files": [{"path": "../../etc/passwd", "content": "x"}]})
    return {"role": "assistant", "content": text}


def test_parser_reasons():
    assert extract_json('noise {"a": {"b": "}"}} tail')[0] == {"a": {"b": "}"}}
    assert parse_candidate("no json here", "t", 0)[1].reason == "llm_no_json"
    assert parse_candidate('{"instruction": "x", }', "t", 0)[1].reason == "llm_bad_json"
    rej = parse_candidate(json.dumps({"instruction": "short"}), "t", 0)[1]
    assert rej.reason == "llm_schema" and "instruction" in rej.detail and "tests" in rej.detail
    bad_tests = parse_candidate(json.dumps(GOOD | {"tests": "def check():\n    pass\n"}), "t", 0)[1]
    assert bad_tests.reason == "llm_schema" and "no test_* function" in bad_tests.detail
    for tests, why in [
        ("import subprocess\ndef test_x():\n    assert subprocess.run(['python3', W / 'a.py']).returncode == 0\n",
         "imports 'subprocess'"),
        ("def test_x():\n    os.system('python3 solve.py')\n", "calls system()"),
        ("import sys\nsys.path.insert(0, str(W))\nfrom solution import f\ndef test_x():\n    assert f()\n",
         "imports 'sys'"),
        ("def test_x():\n    ns = {}\n    exec((W / 'sol.py').read_text(), ns)\n", "calls exec()"),
        ("def test_x():\n    m = __import__('solution')\n", "calls __import__()"),
    ]:
        rej = parse_candidate(json.dumps(GOOD | {"tests": tests}), "t", 0)[1]
        assert rej is not None and rej.reason == "llm_unsafe_tests" and why in rej.detail, (tests, rej)
    ok = "def test_x():\n    r = run_as_agent(['python3', 'sol.py'])\n    assert r.stdout.strip() == '3'\n"
    assert parse_candidate(json.dumps(GOOD | {"tests": ok}), "t", 0)[1] is None
    env, rej = parse_candidate(json.dumps(GOOD), "ops logs", 3)
    assert rej is None and env.source == "llm:ops logs" and env.family == "llm-ops-logs" and env.seed == 3
    assert "W = pathlib.Path" in env.tests[0].content and "def test_count" in env.tests[0].content


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_build_admits_good_candidates_from_every_source(tmp_path):
    imports = tmp_path / "tasks"
    shutil.copytree(FIXTURES / "harbor" / "count-words", imports / "count-words")
    shutil.copytree(FIXTURES / "harbor" / "count-words", imports / "no-instruction")
    (imports / "no-instruction" / "instruction.md").unlink()
    with FakeOpenAI("ok", reply) as srv:
        cfg = small_config(tmp_path / "runs", dataset="mixed", **{
            "synthesize": {"families": [{"name": "csv_convert", "levels": [1], "seeds": [0]}],
                           "imports": [str(imports)],
                           "llm": {"themes": ["log triage"], "candidates_per_theme": 4}},
            "teacher": {"backend": "openai", "endpoints": [srv.url], "model": "fake", "tool_calling": False}})
        rec = run_build(parse_config(cfg), only=["propose", "synthesize"])
    assert rec["stages"]["synthesize"]["status"] == "committed"
    store = RunStore(cfg["runs"], "mixed")
    propose = store.read_json(posixpath.join(rec["stages"]["propose"]["manifest"], "manifest.json"))
    assert propose["reject_reasons"] == {"llm_no_json": 1, "llm_schema": 1, "llm_unsafe_path": 1,
                                         "import_malformed": 1}
    rejects = store.read_table([posixpath.join(rec["stages"]["propose"]["manifest"], "rejects.parquet")]).to_pylist()
    malformed = next(r for r in rejects if r["reason"] == "import_malformed")
    assert "instruction.md: missing" in malformed["detail"]
    synth = store.read_json(posixpath.join(rec["stages"]["synthesize"]["manifest"], "manifest.json"))
    assert synth["rows"] == 3 and synth["stats"]["yield"] == {"procedural|kept": 1, "harbor|kept": 1, "llm|kept": 1}
