"""The test audit (tasks/envs/audit.py, tasks/envs/mutants.py): mutators and the equivalence rule without
Docker; in Docker, the weak fixtures (tests/fixtures/weak: one weak task per kind of weakness, Harbor and
Terminal-Bench, each with a wrong solution a naive harness scores 1.0) are rejected `weak_tests` naming their
surviving mutant, and their sound look-alikes are kept with every mutant killed."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
from trajforge.tasks.envs.audit import AuditSettings
from trajforge.tasks.envs.formats import import_task
from trajforge.tasks.envs.mutants import DELETE, MUTATORS, Inputs, Mutator, equivalent, output_class, register
from trajforge.tasks.envs.validator import validate_env

SUITE_GROUP = "naive-harness"  # its cleanup removes every naive-harness image: one worker (tests/conftest.py)

WEAK = Path(__file__).parent / "fixtures" / "weak"
CASES = [json.loads(line) for line in (WEAK / "cases.jsonl").read_text().splitlines()]
NO_INPUTS = Inputs("Write the answer.", {})


def mutate(name: str, text: str, inputs: Inputs = NO_INPUTS, path: str = "out.csv"):
    return MUTATORS[name].make(path, text, inputs)


def test_data_mutators_change_what_a_sound_test_compares():
    rows = "cy,30\nana,12\nbo,7\n"
    assert mutate("emptied", rows) == "" and mutate("deleted", rows) is DELETE
    assert mutate("line_added", rows) == "cy,30\nana,12\nbo,7\nbo,8\n"
    assert mutate("numbers_perturbed", rows) == "cy,30\nana,12\nbo,8\n"
    assert mutate("numbers_perturbed", "mean 3.50\n") == "mean 3.95\n"  # beyond two decimals' precision
    assert mutate("values_swapped", rows) == "cy,30\nana,7\nbo,12\n"
    assert mutate("line_dropped", rows) == "cy,30\nana,12\n"
    assert mutate("lines_reordered", rows) == "bo,7\nana,12\ncy,30\n"
    assert mutate("truncated", rows) == "cy,30\n"
    assert mutate("line_duplicated", rows) == "cy,30\nana,12\nbo,7\nbo,7\n"
    assert mutate("inputs_echoed", "54\n", Inputs("", {"scores.csv": rows, "notes.txt": "x"}), "total.csv") == rows


def test_code_mutators_stub_functions_and_scripts():
    code = "def add_all(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    assert "return 0" in mutate("functions_return_constant", code, path="calc.py")
    assert "pass" in mutate("functions_do_nothing", code, path="calc.py")
    assert mutate("functions_return_constant", "print(1)\n", path="calc.py") is None  # no function to stub
    assert mutate("script_exits_0", "#!/bin/bash\ngrep -c x \"$1\"\n", path="r.sh") == "#!/bin/sh\nexit 0\n"
    assert output_class("r.sh", b"echo") == "script" and output_class("calc.py", b"x = 1") == "code"
    assert output_class("db", b"SQLite\0") == "binary" and output_class("a.txt", b"\xff\xfe") == "binary"
    assert output_class("a.txt", b"1\n") == "data"
    asked = "Write the count to /app/errors.txt. Also write a short summary of the log to /app/report.txt."
    assert output_class("/app/report.txt", b"4 errors", asked) == "prose"  # free text: only emptied or deleted
    assert output_class("/app/errors.txt", b"4", asked) == "data"
    assert output_class("/app/summary.json", b"{}", "Write a summary to /app/summary.json.") == "data"


def test_equivalence_is_conservative():
    assert equivalent("line_added", "a  b\n", "a b\n\n", NO_INPUTS) == "a whitespace-only change"
    assert equivalent("lines_reordered", "a\nb\n", "b\na\n", NO_INPUTS) is None  # order may matter
    free = Inputs("List the names, in any order.", {})
    assert "order is free" in equivalent("lines_reordered", "a\nb\n", "b\na\n", free)
    assert equivalent("line_duplicated", "a\n", "a\na\n", free) is None  # an extra item is never the same answer
    obj = '{\n  "a": 1,\n  "mode": "x"\n}\n'
    swapped = mutate("values_swapped", obj)  # a value between two keys, never the keys (that only reorders them)
    assert swapped == '{\n  "a": "x",\n  "mode": 1\n}\n' and equivalent("values_swapped", obj, swapped, NO_INPUTS) is None
    assert "same JSON value" in equivalent("lines_reordered", obj, '{"mode": "x", "a": 1}', NO_INPUTS)
    assert equivalent("numbers_perturbed", obj, obj.replace("1", "3"), NO_INPUTS) is None


def test_a_mutator_registration_is_checked():
    with pytest.raises(ValueError, match="registered twice"):
        register(Mutator("emptied", ("data",), "", lambda p, t, i: ""))
    with pytest.raises(ValueError, match="unknown output class"):
        register(Mutator("new_one", ("video",), "", lambda p, t, i: ""))


def test_every_weakness_has_a_harbor_or_tbench_fixture_and_a_sound_look_alike():
    kinds = {c["weakness"] for c in CASES}
    assert kinds >= {"exists_only", "substring", "line_count", "first_rows", "wide_tolerance", "format_regex",
                     "exit_status", "trivial_input", "extra_items"}
    assert {c["env"].split("/")[0] for c in CASES} == {"harbor", "tbench"}
    for c in CASES:
        assert (WEAK / c["env"]).is_dir(), c
        assert c["expect"] == ("weak_tests" if c["case"].endswith("-weak") else "kept")


def test_strength_column_and_buckets():
    import pyarrow as pa

    from trajforge.schemas.arrow import arrow_schema
    from trajforge.schemas.environment import EnvSpec, TestAudit
    from trajforge.tasks.dataset.columns import test_strength
    from trajforge.tasks.synthesize import strength_bucket

    audits = [TestAudit(status="strong", tried=8, killed=8), TestAudit(status="weak", tried=4, killed=3),
              TestAudit(status="skip", reason="no reference solution")]
    arr = pa.array([a.model_dump() for a in audits], arrow_schema(EnvSpec).field("audit").type)
    assert test_strength(arr).to_pylist() == [1.0, 0.75, None] == [a.strength for a in audits]
    assert [strength_bucket(a.strength) for a in audits] == ["1.0", "0.75-1", "not audited"]
    assert strength_bucket(0.2) == "0-0.5"


def test_audit_settings_are_config_with_a_named_error():
    s = SynthesizeConfig(families=[{"name": "log_report"}])
    assert (s.audit, s.audit_mutants) == ("reject", 4)
    with pytest.raises(ValueError, match="audit"):
        SynthesizeConfig(families=[{"name": "log_report"}], audit="sometimes")
    with pytest.raises(ValueError, match="audit_mutants"):
        SynthesizeConfig(families=[{"name": "log_report"}], audit_mutants=0)


def test_the_audit_is_one_entry_of_the_validation_table():
    from trajforge.tasks.envs.validator import CHECKS, check_names

    assert [c.name for c in CHECKS][-1] == "test_audit" and "weak_tests" in CHECKS[-1].reasons
    assert check_names()[:3] == ("image", "noop_fails", "no_leak") and check_names()[-1] == "test_audit"
    assert "tools_serve" in check_names()  # a kind's checks are recorded under their own names


# ---------------------------------------------------------------------------------------------------- Docker


@pytest.fixture(scope="module")
def audited(docker_client):
    """Every fixture folder imported and validated once with the default settings (two at a time; a weak task
    and its look-alike share an image)."""
    s, sandbox = SynthesizeConfig(imports=[str(WEAK)]), SandboxConfig()

    def one(case: dict):
        env = import_task(WEAK / case["env"])
        return case["case"], (env, validate_env(docker_client, env, sandbox, sandbox.base_image, s.image_aliases,
                                                60, 60, audit=AuditSettings(s.audit, s.audit_mutants)))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, CASES))


@pytest.mark.docker
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "weak_tests"], ids=lambda c: c["case"])
def test_weak_tests_are_rejected_naming_the_surviving_mutant(audited, case):
    env, v = audited[case["case"]]
    assert not v.ok and v.reject.reason == "weak_tests", (v.reject, v.checks)
    survivor = env.audit.survivors[0]
    assert f"mutant `{survivor.mutator}` of {survivor.path} survived" in v.reject.detail
    assert "every test passed" in v.reject.detail and survivor.path.startswith("/app/")
    assert env.audit.status == "weak" and env.audit.tried >= 1 and env.audit.strength < 1


@pytest.mark.docker
def test_flag_keeps_a_weak_environment_marked_with_every_mutant_tried(docker_client):
    s, sandbox = SynthesizeConfig(imports=[str(WEAK)]), SandboxConfig()
    env = import_task(WEAK / "tbench" / "mean-value-weak")
    v = validate_env(docker_client, env, sandbox, sandbox.base_image, s.image_aliases, 60, 60,
                     audit=AuditSettings("flag", s.audit_mutants))
    assert v.ok and v.checks["test_audit"] == "flag" and env.audit.status == "weak", (v.reject, env.audit)
    assert "numbers_perturbed" in {m.mutator for m in env.audit.survivors}
    assert env.audit.tried == env.audit.test_runs >= 4 and 0 < env.audit.killed < env.audit.tried
    off = import_task(WEAK / "tbench" / "mean-value-weak")
    v = validate_env(docker_client, off, sandbox, sandbox.base_image, s.image_aliases, 60, 60,
                     audit=AuditSettings("off"))
    assert v.ok and v.checks["test_audit"] == "skip" and off.audit.status == "off" and off.audit.strength is None


@pytest.mark.docker
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "kept"], ids=lambda c: c["case"])
def test_sound_look_alikes_are_kept_with_every_mutant_killed(audited, case):
    env, v = audited[case["case"]]
    assert v.ok, v.reject
    assert v.checks["test_audit"] == "pass" and env.audit.status == "strong", env.audit
    assert env.audit.tried >= 2 and env.audit.killed == env.audit.tried and env.audit.strength == 1.0
    assert env.audit.test_runs == env.audit.tried and env.audit.seconds > 0


@pytest.mark.docker
@pytest.mark.parametrize("case", [c for c in CASES if c["expect"] == "weak_tests"], ids=lambda c: c["case"])
def test_a_naive_harness_scores_the_wrong_solution_of_a_weak_task_1(case):
    from naive_harness import naive_reward

    assert naive_reward(WEAK / case["env"], case["wrong"]) == case["naive_reward"] == 1.0


BAD_TESTS = """import pathlib, time
W = pathlib.Path(WORK)


def test_answer():
    while not (W / "answer.txt").read_text().strip():  # hangs on an emptied answer
        time.sleep(1)
    assert (W / "answer.txt").read_text() == "12\\n"


def test_blob_and_side_file():
    assert (W / "blob.bin").read_bytes() == bytes(range(256))
    assert pathlib.Path("/tmp/side.txt").read_text() == "side\\n"
"""


@pytest.mark.docker
def test_bad_outputs_and_hanging_tests_get_named_outcomes(docker_client, monkeypatch):
    """Binary and outside-the-work-dir outputs, tests that hang on a mutant, and the audit's own fault."""
    from trajforge.schemas.common import FileSpec
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.envs import mutants

    def env(env_id: str) -> EnvSpec:
        return EnvSpec(env_id=env_id, family="planted", level=1, seed=0, source="procedural:planted",
                       instruction="Write the sum of numbers.txt to answer.txt, the bytes 0..255 to blob.bin and "
                                   "'side' to /tmp/side.txt.",
                       files=[FileSpec(path="numbers.txt", content="3 4 5\n")], test_timeout_s=8,
                       tests=[FileSpec(path="test_task.py", content=BAD_TESTS)],
                       solution=["python3 -c \"print(sum(map(int, open('numbers.txt').read().split())))\" > answer.txt",
                                 "python3 -c \"import sys; sys.stdout.buffer.write(bytes(range(256)))\" > blob.bin",
                                 "echo side > /tmp/side.txt"])

    s, sandbox = SynthesizeConfig(families=[{"name": "log_report"}]), SandboxConfig()
    e = env("planted-bad-outputs")
    v = validate_env(docker_client, e, sandbox, sandbox.base_image, s.image_aliases, 30, 30,
                     audit=AuditSettings("reject", 12))
    assert v.ok and e.audit.status == "strong", (v.reject, e.audit)
    by = {(m.mutator, m.path.rsplit("/", 1)[-1]): m for m in e.audit.mutants}
    assert "timed out" in by["emptied", "answer.txt"].cause and by["emptied", "answer.txt"].outcome == "killed"
    blob = {m for m, p in by if p == "blob.bin"}
    assert "emptied" in blob and blob <= {"emptied", "deleted"}  # binary: never rewritten as text
    side = by["*", "side.txt"]
    assert side.outcome == "not_built" and "outside the work dir" in side.cause

    def boom(path, text, inputs):
        raise RuntimeError("a mutator bug")

    monkeypatch.setitem(mutants.MUTATORS, "boom", Mutator("boom", ("data",), "boom", boom))
    e = env("planted-audit-bug")
    v = validate_env(docker_client, e, sandbox, sandbox.base_image, s.image_aliases, 30, 30)
    assert v.reject.reason == "verifier_error" and "the test audit failed: RuntimeError: a mutator bug" in v.reject.detail


@pytest.mark.docker
def test_envs_audit_cli_prints_each_mutant_and_fails_on_weak_tests(docker_client, tmp_path):
    from helpers import run_cli

    out = run_cli("envs", "audit", str(WEAK / "harbor" / "sum-scores-weak"), "--mutants", "3", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "survived emptied /app/total.txt" in out.stdout and "weak_tests: " in out.stdout
    out = run_cli("envs", "audit", str(WEAK / "harbor" / "sum-scores-sound"), "--mutants", "3", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "killed emptied /app/total.txt" in out.stdout and "3/3 mutants killed" in out.stdout
