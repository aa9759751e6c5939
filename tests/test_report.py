"""The build report (`<build>/report/index.html`), written by a real replay build (Prefect + Dask +
Docker) with a planted hack, and checked in a real headless Chromium (Debian's package, driven by
Playwright): no console errors, the plots are drawn, every number on the page equals the build's
stats files, filtering the trajectory browser to the flagged rollout shows its evidence. The
screenshot is saved as a test artifact (and to $TRAJFORGE_REPORT_SCREENSHOT when set: docs/report.png)."""

from __future__ import annotations

import ast
import json
import os
import posixpath
import re
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import run_cli, small_config

from trajforge.flows.report import report_path, write_report_safely
from trajforge.flows.report.episodes import CHUNK, EpisodeData, _turns, cut, script_json
from trajforge.tasks.engine.store import RunStore

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# -- pure logic (make test-fast) --------------------------------------------------------------------------
def test_inline_json_cannot_close_its_script_element():
    text = script_json({"out": "</script><script>alert(1)</script>\u2028"})
    assert "</" not in text and "\u2028" not in text
    assert json.loads(text.replace("<\\/", "</")) == {"out": "</script><script>alert(1)</script>\u2028"}


def test_turns_pair_commands_labels_and_observations():
    r = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                      {"role": "assistant", "content": "look", "tool_calls": [{"id": "1"}]},
                      {"role": "tool", "content": "[exit code 0]\na.txt"},
                      {"role": "assistant", "content": "oops"}, {"role": "user", "content": "format error"},
                      {"role": "assistant", "content": "write", "tool_calls": [{"id": "2"}, {"id": "3"}]},
                      {"role": "tool", "content": "ok"}, {"role": "tool", "content": "ok2"}],
         "steps": [{"turn": 1, "command": "ls", "exit_code": 0, "duration_s": 0.1},
                   {"turn": 3, "command": "echo x > a.txt", "exit_code": 0, "duration_s": 0.1},
                   {"turn": 3, "command": "cat a.txt", "exit_code": 1, "duration_s": 0.1}],
         "usage": [{"turn": 1, "completion_tokens": 7, "latency_s": 0.5}]}
    turns = _turns(r, ["inspect", "act", "verify"])
    assert [t["n"] for t in turns] == [1, 2, 3]
    assert [c["label"] for c in turns[0]["commands"]] == ["inspect"] and turns[0]["tokens"] == 7
    assert turns[1]["commands"] == [] and turns[1]["observations"] == ["format error"]
    assert [(c["command"], c["label"], c["exit"]) for c in turns[2]["commands"]] == [
        ("echo x > a.txt", "act", 0), ("cat a.txt", "verify", 1)]
    assert turns[2]["observations"] == ["ok", "ok2"]
    assert cut("x" * 5000, 10).startswith("x" * 10) and "4990 more characters" in cut("x" * 5000, 10)


def test_a_report_failure_is_printed_never_raised(tmp_path):
    store = RunStore(str(tmp_path), "d")
    said: list[str] = []
    assert write_report_safely(store, "20990101T000000Z-0000", said.append) is None
    assert len(said) == 1 and "20990101T000000Z-0000" in said[0] and "trajforge report" in said[0]


# -- a real build, a real browser --------------------------------------------------------------------------
def _expected(env) -> dict:
    line = re.search(r"^EXPECTED = json\.loads\((.*)\)$", env.tests[0].content, re.M).group(1)
    return json.loads(ast.literal_eval(line))


@pytest.fixture(scope="module")
def built(tmp_path_factory, prefect_api):
    """A replay build of two environments by two teachers: `replay:planted.jsonl` hard-codes the answer
    of file_search in sample 0 (a hack) and gives up on log_report in sample 1; `replay` replays the
    reference solutions. Then the same config again through the CLI: every stage reused, the report
    compared with the first build."""
    from typer.testing import CliRunner

    from trajforge.flows.cli import app
    from trajforge.flows.launch import run_build
    from trajforge.schemas.config import parse_config
    from trajforge.tasks.envs.families import get_family

    tmp = tmp_path_factory.mktemp("report")
    fs, lr = get_family("file_search").generate(1, 0), get_family("log_report").generate(1, 0)
    matches = _expected(fs)["matches"]
    rows = [{"env_id": fs.env_id, "commands": ["ls data", "printf '%s\\n' " + " ".join(matches) + " > matches.txt"]},
            {"env_id": fs.env_id, "commands": fs.solution},
            {"env_id": lr.env_id, "commands": lr.solution}, {"env_id": lr.env_id, "commands": ["true"]}]
    source = tmp / "planted.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config(tmp / "runs", dataset="rep", **{"teacher": {"backend": "replay", "replay": {"source": str(source)}},
                                                       "extra_teachers": [{"backend": "replay"}]})
    first = run_build(parse_config(cfg))
    assert first["status"] == "committed"
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    again = CliRunner().invoke(app, ["build", str(tmp / "cfg.yaml")])  # in this process: its Prefect API, no new server
    assert again.exit_code == 0, again.output[-3000:]
    store = RunStore(cfg["runs"], "rep")
    second = store.latest()
    assert second != first["build_id"]
    return store, first["build_id"], second, again.stdout, fs.env_id


def _stats(store: RunStore, build_id: str) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Each stage's stats.json (over its round instances; the final calibrate) and each manifest."""
    rec = store.read_json(store.build_record_path(build_id))
    stats: dict[str, list[dict]] = {}
    manifests = {}
    for inst, e in rec["stages"].items():
        manifests[inst] = store.read_json(posixpath.join(e["manifest"], "manifest.json"))
        s = store.read_json(posixpath.join(e["manifest"], "stats.json"))
        stats.setdefault(inst.split(".")[0], []).append(s)
    stats["calibrate"] = stats["calibrate"][-1:]  # each round's calibrate covers every verify so far
    return stats, manifests


def _value_at(stats: dict[str, list[dict]], manifests: dict[str, dict], key: list[str]) -> float | None:
    if key[0] == "@manifest":
        return manifests[key[1]][key[2]]
    stage, *path = key
    found = []
    for s in stats.get(stage, []):
        for p in path:
            s = s.get(p) if isinstance(s, dict) else None
        if s is not None:
            found.append(s)
    return sum(found) if found else None


@pytest.mark.docker
@pytest.mark.slow
def test_build_writes_the_report_and_the_cli_ends_with_its_path(built):
    store, first, second, stdout, _ = built
    for b in (first, second):
        assert store.exists(report_path(store, b)), b
    last = [line for line in stdout.strip().splitlines() if line.strip()][-1]
    assert last.split() == ["report:", report_path(store, second)]
    page = store.read_text(report_path(store, second))
    assert f"the previous committed build <b>{first}</b>" in page  # every stage reused: nothing changed
    changed = re.findall(r'<tr class="changed"><td>([^<]*)<', page)
    assert re.search(r'id="changed-count">0<', page) and not changed, changed
    chunk = store.read_text(posixpath.join(store.build_dir(second), "report", "episodes", "chunk-00000.js"))
    assert chunk.startswith("window.tfChunk(0,") and chunk.count('"instruction"') == 8 <= CHUNK


@pytest.mark.docker
@pytest.mark.slow
def test_report_compare_command_writes_the_comparison(built):
    store, first, second, _, _ = built
    out = run_cli("report", "--compare", second, first, "--runs", store.runs_url, "--dataset", "rep", cwd=Path(store.root))
    assert out.returncode == 0, out.stderr
    path = report_path(store, first, compare_to=second)
    assert out.stdout.split() == ["report:", path] and store.exists(path)
    assert f"with build <b>{second}</b>" in store.read_text(path)
    bad = run_cli("report", "nosuchbuild", "--runs", store.runs_url, "--dataset", "rep", cwd=Path(store.root))
    assert bad.returncode != 0 and "build 'nosuchbuild' not found" in bad.stderr + bad.stdout


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make setup installs it)")
def test_report_in_headless_chromium(built, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    store, first, _, _, hacked_env = built
    stats, manifests = _stats(store, first)
    shots = tmp_path_factory.mktemp("report-artifacts")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"requestfailed: {r.url}"))
            page.goto(Path(report_path(store, first)).as_uri())
            page.wait_for_load_state("load")

            # the plots are drawn (an SVG inside each plotly div), the ones this build must have among them
            drawn = page.eval_on_selector_all(".plotly-graph-div", "ds => ds.filter(d => d.querySelector('.main-svg')).map(d => d.id)")
            assert {"plot-funnel", "plot-stage-time", "plot-labels", "plot-solve-rates", "plot-family-levels", "plot-status",
                    "plot-turns", "plot-tokens", "plot-hacks", "plot-modes", "plot-step-shares"} <= set(drawn), drawn
            # every number on the page is the stats files' number at the key it names
            figures = page.eval_on_selector_all("[data-figure]", "es => es.map(e => [e.dataset.figure, e.textContent])")
            assert len(figures) >= 30
            for key, text in figures:
                want = _value_at(stats, manifests, json.loads(key))
                got = None if text == "–" else float(text.replace(",", ""))
                assert got == pytest.approx(want, abs=1e-3), (key, text, want)
            assert ['["verify", "hacks", "hardcoded_answer"]', "1"] in figures
            # the per-teacher breakdowns add up to the stats (they are computed from the same rows)
            status = page.evaluate("document.getElementById('plot-status').data.map(t => [t.name, t.y.reduce((a, b) => a + b, 0)])")
            assert dict(status) == stats["rollout"][0]["status"]
            labels = page.evaluate("document.getElementById('plot-labels').data.flatMap(t => t.x.map((x, i) => [x, t.y[i]]))")
            totals: dict[str, int] = {}
            for lab, n in labels:
                totals[lab] = totals.get(lab, 0) + n
            assert {k: v for k, v in totals.items() if v} == stats["calibrate"][-1]["labels"]
            assert page.inner_text("#tf-count") == "8 of 8 rollouts"
            page.screenshot(path=str(shots / "report-top.png"))

            # filter the browser to the flagged rollout: its evidence, instruction, turns and verdict show
            page.select_option("#f-flagged", "kind:hardcoded_answer")
            assert page.inner_text("#tf-count") == "1 of 8 rollouts"
            row = page.locator("#tf-table tbody tr")
            assert row.count() == 1 and hacked_env in row.inner_text()
            row.click()
            evidence = page.locator("#tf-episode .evidence[data-kind=hardcoded_answer]")
            evidence.wait_for()
            assert "matches.txt" in evidence.inner_text()
            episode = page.locator("#tf-episode")
            assert "DATA-" in episode.locator("pre.instruction").inner_text()
            assert episode.locator(".turn").count() >= 2 and episode.locator(".cmd .label.inspect").count() >= 1
            assert "not passed" in episode.locator(".verdict").inner_text()
            assert episode.locator("ul.tests li").count() >= 1 and "matches.txt" in episode.locator("ul.changes").inner_text()
            page.screenshot(path=str(shots / "report-flagged.png"), full_page=False)
            # the trust table links to the same trajectory
            page.select_option("#f-flagged", "")
            page.click("a.flag-link[data-kind=hardcoded_answer]")
            page.wait_for_function("document.getElementById('tf-count').textContent.startsWith('1 of')")
            page.select_option("#f-passed", "yes")
            assert page.inner_text("#tf-count") == "0 of 8 rollouts"  # a hack is never a pass
            assert problems == []
        finally:
            browser.close()
    wanted = os.environ.get("TRAJFORGE_REPORT_SCREENSHOT")
    if wanted:
        shutil.copy(shots / "report-top.png", wanted)


def test_episode_chunks_stream_by_part(tmp_path):
    """The browser's data is written CHUNK episodes a file, whatever the parts' sizes."""
    from trajforge.flows.report.gather import BuildFacts
    from trajforge.schemas.build import BuildRecord, StageEntry
    from trajforge.schemas.trajectory import Message, Rollout

    store = RunStore(str(tmp_path), "d")
    parts = []
    for i, n in enumerate((CHUNK + 30, 45)):  # two parts, 175 rollouts: chunks of 100 and 75
        rows = [Rollout(rollout_id=f"r{i}-{k}", env_id="e", teacher="t", harness="h", sample=k, status="ok",
                        messages=[Message(role="system", content="s"), Message(role="user", content="do it")])
                for k in range(n)]
        parts.append(posixpath.join(store.root, f"part-{i}.parquet"))
        store.write_records(parts[-1], Rollout, rows)
    rec = BuildRecord(build_id="b1", dataset="d", created_at="2026-01-01T00:00:00+00:00", stages={
        "rollout": StageEntry(fingerprint="f", components={}, status="committed", manifest="m")})
    facts = BuildFacts(build_id="b1", dataset="d", status="committed", created_at=rec.created_at, stages=[],
                       stats={}, manifests={"rollout": {"parts": parts}})
    index = EpisodeData(store, rec, facts).write(posixpath.join(store.root, "report"))
    assert len(index) == 175 and [r["chunk"] for r in index[::CHUNK]] == [0, 1]
    chunks = sorted(store.fs.glob(posixpath.join(store.root, "report", "episodes", "*.js")))
    assert [c.rsplit("/", 1)[1] for c in chunks] == ["chunk-00000.js", "chunk-00001.js"]
    second = store.read_text(chunks[1])
    assert second.count('"instruction":"do it"') == 75


def test_report_texts_are_redacted_and_labels_are_the_schemas(tmp_path):
    """Every text the report writes (messages, commands, hack evidence, verifier output, test messages)
    goes through export's scanner in redact mode; the difficulty plot knows every label."""
    from typing import get_args

    from trajforge.flows.report.gather import BuildFacts
    from trajforge.flows.report.plots import LABELS
    from trajforge.schemas.build import BuildRecord, StageEntry
    from trajforge.schemas.calibration import Label
    from trajforge.schemas.trajectory import Message, Rollout, Step
    from trajforge.schemas.verdict import HackFlag, TestResult, Verdict

    assert LABELS == list(get_args(Label)) and "unverified" in LABELS
    hf, key = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "sk-proj-Q8mZt1Rk4VwXy7NbC2dLfG5hJ0pSa3Te"
    store = RunStore(str(tmp_path), "d")
    long = "x" * 3990 + hf  # a cut at CUT characters would split the token
    r = Rollout(rollout_id="r0", env_id="e", teacher="t", harness="h", sample=0, status="ok", turns=1,
                messages=[Message(role="system", content="s"), Message(role="user", content="do it"),
                          Message(role="assistant", content=f"I will use {key}"),
                          Message(role="tool", content=long)],
                steps=[Step(turn=1, command=f"export OPENAI_API_KEY={key}", exit_code=0, duration_s=0.1)])
    v = Verdict(rollout_id="r0", env_id="e", teacher="t", sample=0, status="ok", verified=True,
                tests=[TestResult(name="a", passed=False, message=f"token == '{hf}'")], verifier_output=f"E {hf}",
                hacks=[HackFlag(kind="k", command=f"echo {key}", detail=f"read {hf}")])
    paths = {}
    for name, model, row in (("rollout", Rollout, r), ("verify", Verdict, v)):
        paths[name] = posixpath.join(store.root, f"{name}.parquet")
        store.write_records(paths[name], model, [row])
    rec = BuildRecord(build_id="b1", dataset="d", created_at="2026-01-01T00:00:00+00:00", stages={
        n: StageEntry(fingerprint="f", components={}, status="committed", manifest="m") for n in paths})
    facts = BuildFacts(build_id="b1", dataset="d", status="committed", created_at=rec.created_at, stages=[],
                       stats={}, manifests={n: {"parts": [p]} for n, p in paths.items()})
    EpisodeData(store, rec, facts).write(posixpath.join(store.root, "report"))
    text = store.read_text(posixpath.join(store.root, "report", "episodes", "chunk-00000.js"))
    assert hf not in text and key not in text and hf[:20] not in text
    assert "[REDACTED:OpenAI-style Key]" in text and "[REDACTED:Hugging Face Token]" in text


# -- the charts show what the tables hold (issue 28) --------------------------------------------------------
def _two_teacher_build(tmp_path) -> tuple[RunStore, str, dict]:
    """A committed build written straight to a run store (no Docker): two environments, teacher `model`
    solves none (both `unsolved`), `reference` solves all (`trivial`); 8 episodes whose teacher calls
    overlap (summed call time 40 s, rollout wall time 10 s)."""
    from trajforge.schemas.build import BuildRecord, StageEntry
    from trajforge.schemas.calibration import Calibration
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.environment import EnvSpec
    from trajforge.schemas.trajectory import Message, Rollout, TurnUsage
    from trajforge.schemas.verdict import Verdict

    store, build_id, created = RunStore(str(tmp_path), "d"), "20260101T000000Z-0001", "2026-01-01T00:00:00+00:00"
    envs = [EnvSpec(env_id=f"e{k}", family="fam", level=1, seed=k, source="procedural:fam", instruction="do it",
                    tests=[FileSpec(path="test_x.py", content="def test_a(): pass")], solution=["true"])
            for k in range(2)]
    rollouts = [Rollout(rollout_id=f"r{i}", env_id=f"e{i % 2}", teacher=t, harness="h", sample=i // 2, status="ok",
                        turns=1, messages=[Message(role="system", content="s"), Message(role="user", content="do it"),
                                           Message(role="assistant", content="done")],
                        usage=[TurnUsage(turn=1, completion_tokens=100, latency_s=5.0)], completion_tokens=100,
                        wall_s=6.0)
                for t in ("model", "reference") for i in range(4)]
    verdicts = [Verdict(rollout_id=r.rollout_id, env_id=r.env_id, teacher=r.teacher, sample=r.sample, status="ok",
                        verified=True, passed=r.teacher == "reference", reward=float(r.teacher == "reference"))
                for r in rollouts]
    calib = [Calibration(env_id=e.env_id, family="fam", level=1, teacher=t, attempts=2, passes=2 * (t == "reference"),
                         excluded=0, solve_rate=float(t == "reference"), ci_low=0.0, ci_high=1.0,
                         label="trivial" if t == "reference" else "unsolved", certain=True)
             for e in envs for t in ("model", "reference")]
    stats = {"synthesize": {"yield": {"procedural|kept": 2}},
             "rollout": {"episodes": 8, "status": {"ok": 8}, "completion_tokens": 800, "teacher_seconds": 40.0,
                         "driver_wall_seconds": 10.0, "turns": 8},
             "verify": {"verified": 8, "passed": 4},
             "calibrate": {"labels": {"unsolved": 2, "trivial": 2}, "environments": 4, "certain": 4}}
    stages = {}
    for name, model, rows in (("synthesize", EnvSpec, envs), ("rollout", Rollout, rollouts),
                              ("verify", Verdict, verdicts), ("calibrate", Calibration, calib)):
        folder = posixpath.join(store.build_dir(build_id), name, "fp")
        part = posixpath.join(folder, "part-00000.parquet")
        store.write_records(part, model, rows)
        store.write_json(posixpath.join(folder, "manifest.json"), {
            "stage": name, "fingerprint": "fp", "build_id": build_id, "dir": folder, "parts": [part], "rows": len(rows),
            "rejects": 0, "reject_reasons": {}, "stats": stats[name], "components": {}, "gate": {"success": True},
            "created_at": created})
        stages[name] = StageEntry(fingerprint="fp", components={}, status="committed", manifest=folder, rows=len(rows),
                                  rejects=0)
    store.write_build(BuildRecord(build_id=build_id, dataset="d", created_at=created, status="committed",
                                  stages=stages))
    return store, build_id, stats


def _plot_data(html: str, name: str) -> list[dict]:
    """The traces of figure `plot-<name>` as the page passes them to Plotly.newPlot."""
    call = html.index(f'"plot-{name}"', html.index(f'id="plot-{name}"') + 1)  # Plotly.newPlot("plot-<name>", [...]
    return json.JSONDecoder().raw_decode(html[html.index("[", call):])[0]


def test_report_charts_show_every_label_and_the_aggregate_throughput(tmp_path):
    """The labels chart holds every label of the difficulty table (`unsolved` as well as `trivial`), and
    the throughput chart's aggregate is completion tokens over the rollout wall time (the figure the build
    prints), shown beside the per-call figure, each named."""
    from trajforge.flows.report import write_report
    from trajforge.flows.report.plots import AGGREGATE, PER_CALL
    from trajforge.tasks.teachers.cpu_profile import throughput_line

    store, build_id, stats = _two_teacher_build(tmp_path)
    html = Path(write_report(store, build_id)).read_text()
    totals: dict[str, int] = {}
    for trace in _plot_data(html, "labels"):
        for label, n in zip(trace["x"], trace["y"]):
            totals[label] = totals.get(label, 0) + n
    assert {k: v for k, v in totals.items() if v} == stats["calibrate"]["labels"] == {"unsolved": 2, "trivial": 2}
    traces = {t["name"]: dict(zip(t["x"], t["y"])) for t in _plot_data(html, "throughput")}
    assert traces[AGGREGATE] == {"all teachers": 80.0, "model": 40.0, "reference": 40.0}  # 800 tok / 10 s wall
    assert "80.0 completion tokens/s" in throughput_line(stats["rollout"])  # what the build printed
    assert traces[PER_CALL] == {"model": 20.0, "reference": 20.0}  # 400 tok / 20 s of one teacher's calls


def test_report_layout_charts_fit_their_columns_in_chromium(tmp_path):
    """In a real headless Chromium: every figure is drawn at its box's width (the first of two side by
    side is not drawn at the full row and clipped under the second), no table overlaps a figure, and no
    title runs under its figure's mode bar."""
    from playwright.sync_api import sync_playwright

    from trajforge.flows.report import write_report

    store, build_id, _ = _two_teacher_build(tmp_path)
    page_path = write_report(store, build_id)
    overlap = """([a, b]) => !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top)"""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(Path(page_path).as_uri())
            page.wait_for_load_state("load")
            boxes = page.evaluate("""() => [...document.querySelectorAll('.plotly-graph-div')].map(d => {
                const r = d.getBoundingClientRect(), box = e => e && e.getBoundingClientRect().toJSON();
                return {id: d.id, drawn: d._fullLayout.width, box: r.width, rect: r.toJSON(),
                        title: box(d.querySelector('.gtitle')), modebar: box(d.querySelector('.modebar'))}; })""")
            assert {"plot-labels", "plot-solve-rates", "plot-status", "plot-throughput", "plot-funnel"} <= {
                b["id"] for b in boxes}
            for b in boxes:
                assert abs(b["drawn"] - b["box"]) <= 1, b  # drawn at its own width: nothing clipped
                if b["title"] and b["modebar"] and b["modebar"]["width"]:
                    assert not page.evaluate(overlap, [b["title"], b["modebar"]]), b
            tables = page.evaluate("() => [...document.querySelectorAll('table')].map(t => t.getBoundingClientRect().toJSON())")
            for b in boxes:
                for t in tables:
                    assert not page.evaluate(overlap, [b["rect"], t]), (b["id"], t)
        finally:
            browser.close()
