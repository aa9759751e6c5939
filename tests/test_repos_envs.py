"""Repository environments in Docker (issue 43): a real third-party project (more-itertools from its released sdists,
`configs/swe.yaml`) gives at least 10 environments of each kind with fail-to-pass >= 1; the validator keeps them
(reference passes, untouched fails, no hidden test in the image); a commit whose tests never fail before it, a bug no
test sees, a flaky suite and a dependency that cannot install are each rejected with their reason.

Cost: one module-scoped pass over swe.yaml's items (each: one image build on a cached base layer, one container
running the suite before and twice after the reference) shared by every assertion; the small fixture projects
share another pass."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from repos_kit import calc_repo, flaky_repo

from trajforge.schemas.config import RepoSourceConfig, SandboxConfig, load_config
from trajforge.schemas.environment import EnvSpec
from trajforge.tasks.envs.audit import AuditSettings
from trajforge.tasks.envs.images import BuildOptions
from trajforge.tasks.envs.repos.bugs import plant
from trajforge.tasks.envs.repos.make import make_env
from trajforge.tasks.envs.repos.plan import items
from trajforge.tasks.envs.validator import validate_env
from trajforge.tasks.sandbox import Sandbox

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]  # the module fixture makes ~30 environments
ROOT = Path(__file__).resolve().parent.parent
CA = "/etc/ssl/certs/ca-certificates.crt"
OPTIONS = BuildOptions(egress="allowlist", allowlist=("pypi.org", "files.pythonhosted.org"), ca_bundle=CA,
                       timeout_s=600)
TIMES: dict[str, float] = {}


def _make_all(client, cfg: RepoSourceConfig, todo: list[dict]) -> list[tuple[dict, object]]:
    return [(it, make_env(client, 0, cfg, it, SandboxConfig(), OPTIONS, {})) for it in todo]


@pytest.fixture(scope="module")
def swe(docker_client):
    """Every item of configs/swe.yaml's repository, made (environment or reject)."""
    t0 = time.monotonic()
    cfg = load_config(ROOT / "configs" / "swe.yaml").synthesize.repos[0]
    todo, skipped = items(0, cfg)
    made = _make_all(docker_client, cfg, todo)
    TIMES["swe"] = time.monotonic() - t0
    return cfg, made, skipped


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


def _kept(made, kind: str) -> list[EnvSpec]:
    return [m for it, m in made if isinstance(m, EnvSpec) and it["task"] == kind]


def test_a_real_project_gives_ten_environments_of_each_kind(swe):
    cfg, made, skipped = swe
    rejects = {}
    for it, m in made:
        if not isinstance(m, EnvSpec):
            rejects.setdefault(m.reason, []).append(f"{it['task']}: {m.detail[:200]}")
    commits, bugs = _kept(made, "commit"), _kept(made, "planted_bug")
    assert len(commits) >= 10 and len(bugs) >= 10, (len(commits), len(bugs), rejects, skipped)
    for env in commits + bugs:
        spec = next(t for t in env.tests if t.path == "lists.json").content
        assert '"fail_to_pass": [\n  "' in spec, env.env_id  # at least one
        assert env.source.startswith("repo:pypi-more-itertools@") and env.family in ("repo:commit", "repo:planted_bug")
        assert '"repo": "pypi:more-itertools"' in env.knobs_json
        assert '"revision": "' in env.knobs_json and env.image
        assert not any(f.path.startswith("project/tests/") for f in env.context)
        assert "def test_" not in env.instruction
    print(f"\nswe.yaml: {len(made)} items in {TIMES['swe']:.0f}s: {len(commits)} commit and {len(bugs)} planted-bug "
          f"environments; rejected {({k: len(v) for k, v in rejects.items()})}; skipped {skipped}")


def test_the_validator_keeps_them_and_the_tests_are_not_in_the_image(swe, docker_client):
    """One environment of each kind through the validator every build runs: the untouched task fails, the reference
    passes, the hidden tests are nowhere in the image (its leak scan), the audit's wrong states fail."""
    _, made, _ = swe
    sandbox = SandboxConfig()
    for env in (_kept(made, "commit")[0], _kept(made, "planted_bug")[0]):
        v = validate_env(docker_client, env.model_copy(deep=True), sandbox, sandbox.base_image, {}, 120, 300,
                         build=OPTIONS, audit=AuditSettings("reject", 2))
        assert v.ok, (env.env_id, v.reject)
        assert v.checks["noop_fails"] == "pass" and v.checks["no_leak"] == "pass"
        assert v.checks["solution_passes"] == "pass"
        with Sandbox(docker_client, env.image, sandbox, workdir=env.workdir) as sb:
            found = sb.exec(f"find / -xdev -name 'test_more.py' -o -xdev -name 'test_recipes.py' 2>/dev/null; "
                            f"ls {env.workdir}", 60, user="root")
            assert "test_more.py" not in found.output and "test_recipes.py" not in found.output
            assert "more_itertools" in found.output


def test_each_unusable_candidate_is_rejected_with_its_reason(small):
    calc = small["calc"]
    assert isinstance(calc["sub"], EnvSpec), calc["sub"]
    assert '"tests/test_calc.py::test_sub"' in next(t for t in calc["sub"].tests if t.path == "lists.json").content
    assert "Add sub(a, b)" in calc["sub"].instruction and "test_sub" in calc["sub"].instruction
    assert calc["refactor"].reason == "no_fail_to_pass", calc["refactor"]
    assert calc["unseen"].reason == "bug_not_seen", calc["unseen"]
    assert small["flaky"].reason == "flaky_suite", small["flaky"]
    deps = small["deps"]
    assert deps.reason == "image_build_failed", deps
    assert deps.detail.startswith("[package_not_found]") and "trajforge-no-such-package-for-tests" in deps.detail
    print(f"\nsmall projects: {TIMES['small']:.0f}s")
