"""The environment validator in real Docker: each check rejects a planted broken environment with its
reason code, and a good one is kept; near-duplicates are found; procedural families validate across
levels and seeds (in test_families.py)."""

from __future__ import annotations

import pytest

from trajforge.schemas.common import FileSpec
from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.envs.validator import dedup, validate_env

pytestmark = pytest.mark.docker
ALIASES = SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases

GOOD_TESTS = """
def test_answer():
    assert (W / "answer.txt").read_text().strip() == str(sum(int(x) for x in (W / "numbers.txt").read_text().split()))
"""


def make_env(**over) -> EnvSpec:
    spec = dict(env_id="planted", family="planted", level=1, seed=0, source="procedural:planted",
                instruction="Add up the numbers in numbers.txt and write the sum to answer.txt.",
                files=[FileSpec(path="numbers.txt", content="3 4 5\n")],
                tests=[FileSpec(path="test_task.py", content="import json, os, pathlib\nW = pathlib.Path(WORK)\n" + GOOD_TESTS)],
                solution=["python3 -c \"print(sum(int(x) for x in open('numbers.txt').read().split()))\" > answer.txt"])
    spec.update(over)
    return EnvSpec(**spec)


def run(docker_client, env, sibling=None, solution_timeout=30):
    return validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", ALIASES, solution_timeout, 30,
                        sibling=sibling)


def test_good_environment_is_kept(docker_client):
    v = run(docker_client, make_env(env_id="good"))
    assert v.ok, v.reject
    assert v.checks == {"image": "pass", "noop_fails": "pass", "no_leak": "pass", "solution_passes": "pass",
                        "deterministic": "pass", "instance_specific": "skip", "test_audit": "pass"}


def _tests(body: str) -> list[FileSpec]:
    return [FileSpec(path="test_task.py", content="import json, os, pathlib\nW = pathlib.Path(WORK)\n" + body)]


PLANTED = {
    "image_build_failed": dict(dockerfile="FROM trajforge/base:latest\nRUN echo building && exit 3\n", workdir="/app"),
    "noop_passes": dict(tests=_tests("def test_nothing():\n    assert True\n")),
    "solution_fails": dict(solution=["echo 41 > answer.txt; exit 1"]),
    "nondeterministic_tests": dict(tests=_tests(GOOD_TESTS + """
def test_flaky():
    marker = pathlib.Path("/tmp/.seen")
    if (W / "answer.txt").exists():
        assert not marker.exists()
        marker.write_text("x")
""")),
    "verifier_error": dict(tests=_tests(GOOD_TESTS + """
if (W / "answer.txt").exists():
    os._exit(0)  # the runner dies before printing any result
""")),
}


@pytest.mark.parametrize("reason", sorted(PLANTED))
def test_planted_broken_environment_is_rejected_with_its_reason(docker_client, reason):
    v = run(docker_client, make_env(env_id=f"planted-{reason}", **PLANTED[reason]))
    assert not v.ok and v.reject.reason == reason, (v.reject, v.checks)
    if reason == "image_build_failed":
        assert "exit 3" in v.reject.detail or "returned a non-zero code: 3" in v.reject.detail


def test_hung_solution_is_a_reject_not_a_hang(docker_client):
    v = run(docker_client, make_env(env_id="hung", solution=["sleep 600"]), solution_timeout=2)
    assert v.reject.reason == "solution_fails" and "timed out" in v.reject.detail and v.seconds < 60


def test_tests_or_solution_inside_the_image_are_leaks(docker_client):
    env = make_env(env_id="leak-tests")
    env.files = env.files + [FileSpec(path=".cache/t.py", content=env.tests[0].content)]
    v = run(docker_client, env)
    assert v.reject.reason == "tests_leaked" and ".cache/t.py" in v.reject.detail
    long_solution = "python3 - <<'PY'\nimport pathlib\nn = sum(int(x) for x in pathlib.Path('numbers.txt').read_text().split())\npathlib.Path('answer.txt').write_text(str(n))\nPY"
    env = make_env(env_id="leak-solution", solution=[long_solution])
    env.dockerfile = "FROM trajforge/base:latest\nCOPY notes.sh /opt/notes.sh\nCOPY numbers.txt /app/numbers.txt\n"
    env.context = [FileSpec(path="notes.sh", content=long_solution), env.files[0]]
    env.workdir = "/app"
    v = run(docker_client, env)
    assert v.reject.reason == "solution_leaked" and "/opt/notes.sh" in v.reject.detail


def test_answer_that_fits_every_instance_is_not_instance_specific(docker_client):
    constant = _tests("def test_answer():\n    assert (W / 'answer.txt').read_text().strip() == '12'\n")
    env = make_env(env_id="const", tests=constant, solution=["echo 12 > answer.txt"])
    v = run(docker_client, env, sibling=lambda e: make_env(env_id="const-sibling", tests=constant))
    assert v.reject.reason == "not_instance_specific", v.checks
    # tests that carry their expected value (as families' do): the sibling expects its own sum
    v = run(docker_client, make_env(env_id="specific"), sibling=lambda e: make_env(
        env_id="specific-sibling", tests=_tests("def test_answer():\n    assert (W / 'answer.txt').read_text().strip() == '2'\n")))
    assert v.ok and v.checks["instance_specific"] == "pass"


def test_near_duplicates_are_found_and_the_first_is_kept():
    base = make_env(env_id="a", files=[FileSpec(path="numbers.txt", content=" ".join(map(str, range(400))))])
    near = make_env(env_id="b", files=[FileSpec(path="numbers.txt", content=" ".join(map(str, range(400))) + " 7")])
    other = make_env(env_id="c", instruction="Something else entirely: list every file under data/ sorted.",
                     files=[FileSpec(path="data/x", content="unrelated words here and there")])
    assert dedup([base, near, other], 0.8) == {"b": "a"}
    assert dedup([base, other], 0.8) == {}
