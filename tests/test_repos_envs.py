"""Repository environments in Docker (issue 43), on small fixture projects: a commit becomes an environment whose
fail-to-pass list names its new test; a commit whose tests never fail before it, a bug no test sees, a flaky suite and
a dependency that cannot install are each rejected with their reason. One module-scoped pass shared by the assertions
(37 s measured under load).

The real project's yield (more-itertools, `configs/swe.yaml`: at least 10 validated environments of each kind) is
tests/test_repos_real.py (`make test-real`). Also here: a looping bug stopped at its hang budget, and a solved state
past the ceiling raised as infrastructure."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from repos_kit import calc_repo, flaky_repo

from trajforge.schemas.config import RepoSourceConfig, SandboxConfig
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.envs.images import BuildOptions
from trajforge.tasks.envs.repos.bugs import plant
from trajforge.tasks.envs.repos.make import make_env
from trajforge.tasks.sandbox import Sandbox

pytestmark = [pytest.mark.docker]
ROOT = Path(__file__).resolve().parent.parent
CA = "/etc/ssl/certs/ca-certificates.crt"
OPTIONS = BuildOptions(egress="allowlist", allowlist=("pypi.org", "files.pythonhosted.org"), ca_bundle=CA,
                       timeout_s=600)
TIMES: dict[str, float] = {}


def _make_all(client, cfg: RepoSourceConfig, todo: list[dict]) -> list[tuple[dict, object]]:
    return [(it, make_env(client, 0, cfg, it, SandboxConfig(), OPTIONS, {})) for it in todo]


@pytest.fixture(scope="module")
def small(docker_client, tmp_path_factory):
    """The fixture projects' items: calc's commits and a bug in a function no test calls, a flaky suite, and a
    project whose requirement cannot install."""
    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("repos")
    out = {}
    calc = calc_repo(root / "calc")
    cfg = RepoSourceConfig(path=str(root / "calc"), bugs=0, project={"install": []})
    source = (root / "calc" / "calc" / "__init__.py").read_text()
    unseen = next(i for i, p in enumerate(plant(source, "calc/__init__.py")) if p.function == "unused")
    todo = [{"kind": "repo", "repo": 0, "task": "commit", "sha": calc["sub"]},
            {"kind": "repo", "repo": 0, "task": "commit", "sha": calc["refactor"]},
            {"kind": "repo", "repo": 0, "task": "planted_bug", "rev": calc["refactor"],
             "plants": [["calc/__init__.py", unseen]]}]
    out["calc"] = dict(zip(("sub", "refactor", "unseen"), (m for _, m in _make_all(docker_client, cfg, todo))))
    flaky = flaky_repo(root / "flaky")
    cfg = RepoSourceConfig(path=str(root / "flaky"), bugs=0, project={"install": []})
    out["flaky"] = make_env(docker_client, 0, cfg, {"kind": "repo", "repo": 0, "task": "commit", "sha": flaky["sub"]},
                            SandboxConfig(), OPTIONS, {})
    broken = calc_repo(root / "deps", extra={"requirements.txt": "trajforge-no-such-package-for-tests==0.0.1\n"})
    cfg = RepoSourceConfig(path=str(root / "deps"), bugs=0)
    out["deps"] = make_env(docker_client, 0, cfg, {"kind": "repo", "repo": 0, "task": "commit", "sha": broken["sub"]},
                           SandboxConfig(), OPTIONS, {})
    TIMES["small"] = time.monotonic() - t0
    return out


def test_each_unusable_candidate_is_rejected_with_its_reason(small):
    calc = small["calc"]
    assert isinstance(calc["sub"], EnvSpec), calc["sub"]
    assert '"tests/test_calc.py::test_sub"' in next(t for t in calc["sub"].tests if t.path == "lists.json").content
    assert "Add sub(a, b)" in calc["sub"].instruction and "test_sub" in calc["sub"].instruction
    assert "```python\n# new in calc/__init__.py\ndef sub(a, b):\n    ...\n```" in calc["sub"].instruction
    assert calc["refactor"].reason == "no_fail_to_pass", calc["refactor"]
    assert calc["unseen"].reason == "bug_not_seen", calc["unseen"]
    assert small["flaky"].reason == "flaky_suite", small["flaky"]
    deps = small["deps"]
    assert deps.reason == "image_build_failed", deps
    assert deps.detail.startswith("[package_not_found]") and "trajforge-no-such-package-for-tests" in deps.detail
    print(f"\nsmall projects: {TIMES['small']:.0f}s")


def test_a_project_the_base_image_has_installed_is_tested_from_the_work_dir(docker_client, tmp_path):
    """Debian's pytest depends on `python3-more-itertools`: a project of that name must not be shadowed by the copy
    installed in the base image (its tests would never see the code the agent edits: no task, or a task no edit
    can solve), and deleting the project's package must not hand the tests the installed copy."""
    shas = calc_repo(tmp_path / "mi", package="more_itertools")
    cfg = RepoSourceConfig(path=str(tmp_path / "mi"), bugs=0, project={"install": []})
    env = make_env(docker_client, 0, cfg, {"kind": "repo", "repo": 0, "task": "commit", "sha": shas["sub"]},
                   SandboxConfig(), OPTIONS, {})
    assert isinstance(env, EnvSpec), env  # the installed copy has no `add`: every test would fail before and after
    assert '"tests/test_more_itertools.py::test_sub"' in next(t.content for t in env.tests if t.path == "lists.json")
    with Sandbox(docker_client, env.image, SandboxConfig(), workdir=env.workdir) as sb:
        where = sb.exec("python3 -c 'import more_itertools; print(more_itertools.__file__)'", 60)
        assert where.output.strip() == f"{env.workdir}/more_itertools/__init__.py", where.output
        sb.exec("rm -rf more_itertools", 60)
        gone = sb.exec("python3 -I -c 'import more_itertools'", 60, user="root")
        assert gone.exit_code != 0 and f"No module named 'more_itertools' in {env.workdir}" in gone.output
        other = sb.exec("python3 -I -c 'import pluggy, _pytest; print(_pytest.__file__)'", 60, user="root")
        assert other.exit_code == 0 and other.output.startswith("/usr/lib/python3/dist-packages/"), other.output


def test_the_teacher_written_issue_is_the_instruction_and_the_row_says_so(docker_client, tmp_path):
    """`issue_text: teacher` through `make_env`: the instruction is the teacher's issue, then the failing tests; the
    row's knobs say it was written; a teacher reply that copies the solution leaves the commit's instruction."""
    from fake_openai import FakeOpenAI
    from helpers import small_config

    from trajforge.schemas.config import parse_config
    from trajforge.tasks.teachers import make_teacher

    shas = calc_repo(tmp_path / "calc")
    cfg = RepoSourceConfig(path=str(tmp_path / "calc"), bugs=0, project={"install": []}, issue_text="teacher")
    item = {"kind": "repo", "repo": 0, "task": "commit", "sha": shas["sub"]}
    issue = "Subtraction is missing\n\nThe calculator adds but cannot subtract: I expect sub(5, 3) to give 2."
    for reply, written in ((issue, True), (issue + "\n\nJust add `return a - b` to calc.", False)):
        with FakeOpenAI("ok", lambda req, n, reply=reply: {"role": "assistant", "content": reply}) as srv:
            teacher = parse_config(small_config(tmp_path, teacher={"backend": "openai", "endpoints": [srv.url],
                                                                   "model": "fake", "tool_calling": False})).teacher
            env = make_env(docker_client, 0, cfg, item, SandboxConfig(), OPTIONS, {},
                           make_teacher=lambda teacher=teacher: make_teacher(teacher))
        assert isinstance(env, EnvSpec), env
        knobs = json.loads(env.knobs_json)
        assert env.instruction.startswith(issue if written else "The Python project `calc`"), env.instruction
        assert "- `tests/test_calc.py::test_sub`:" in env.instruction and "return a - b" not in env.instruction
        assert knobs["issue_text"] == "written" if written else "reference solution" in knobs["issue_text"]


STEPS = '''def countdown(n):
    steps = 0
    while n > 0:
        n -= 1
        steps += 1
    return steps
'''
TEST_STEPS = "from calc.steps import countdown\n\n\ndef test_countdown():\n    assert countdown(3) == 3\n"


def test_a_bug_that_loops_is_stopped_at_its_hang_budget_not_the_ceiling(docker_client, tmp_path, monkeypatch):
    """A planted bug that makes a test loop forever (`n -= 0`) is `tests_hang` once its suite has run a few times
    the revision's own suite time: far below `test_timeout_s` (what a loop cost before, and what made a busy
    machine's slow suite look like a hang)."""
    from trajforge.tasks.envs.repos import probe

    monkeypatch.setattr(probe, "HANG_FLOOR_S", 5.0)  # the default 30 s floor would only cost the suite time here
    monkeypatch.setattr(probe, "HANG_FACTOR", 3)
    shas = calc_repo(tmp_path / "calc", extra={"calc/steps.py": STEPS, "tests/test_steps.py": TEST_STEPS})
    cfg = RepoSourceConfig(path=str(tmp_path / "calc"), bugs=0, project={"install": []}, test_timeout_s=300)
    loop = next(i for i, p in enumerate(plant(STEPS, "calc/steps.py")) if p.description.startswith("`1` became `0`"))
    out = make_env(docker_client, 0, cfg, {"kind": "repo", "repo": 0, "task": "planted_bug", "rev": shas["sub"],
                                           "plants": [["calc/steps.py", loop]]}, SandboxConfig(), OPTIONS, {})
    assert not isinstance(out, EnvSpec) and out.reason == "tests_hang", out
    budget = float(out.detail.split("timed out after ")[1].split("s ")[0])
    assert 5.0 <= budget < 300 and "the hang budget" in out.detail, out.detail


def test_a_solved_state_past_the_ceiling_is_infrastructure_never_a_reject(docker_client, tmp_path):
    """A suite that runs past `test_timeout_s` on the commit's own (solved) revision says nothing about the task
    (a busy machine, or a ceiling too small): `SuiteTooSlow`, so the stage's shard fails and runs again."""
    from trajforge.tasks.envs.repos.probe import SuiteTooSlow

    slow = "import time\n\n\ndef test_slow():\n    time.sleep(8)\n"
    shas = calc_repo(tmp_path / "calc", extra={"tests/test_slow.py": slow})
    cfg = RepoSourceConfig(path=str(tmp_path / "calc"), bugs=0, project={"install": []}, test_timeout_s=3)
    with pytest.raises(SuiteTooSlow, match="solved state's own suite ran past test_timeout_s=3s"):
        make_env(docker_client, 0, cfg, {"kind": "repo", "repo": 0, "task": "commit", "sha": shas["sub"]},
                 SandboxConfig(), OPTIONS, {})
