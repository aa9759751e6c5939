"""Small git repositories for the repository source's tests (tasks/envs/repos): a project whose history has one
commit of each kind the source must tell apart, and a project whose suite is flaky."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

CALC = '''"""A tiny calculator."""


def add(a, b):
    return a + b


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x


def unused(n):
    """No test calls it: a bug planted here is seen by none."""
    total = 0
    for i in range(n):
        total += i * 2
    return total
'''
TESTS = '''from calc import add, clamp


def test_add():
    assert add(2, 3) == 5


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5
'''
SUB = '''

def sub(a, b):
    return a - b
'''
TEST_SUB = '''

def test_sub():
    from calc import sub
    assert sub(5, 3) == 2
'''
PYPROJECT = '[project]\nname = "calc"\nversion = "0.1"\n'


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    env = {**os.environ, **IDENTITY}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message], check=True, env=env)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env, capture_output=True,
                          text=True).stdout.strip()


def calc_repo(root: Path, extra: dict[str, str] | None = None, package: str = "calc") -> dict[str, str]:
    """A git repository at `root`: `init` (the project), `sub` (adds `sub` and its test: a task), `refactor`
    (changes code and adds a test that passes before it too: `no_fail_to_pass`). Commit ids by name. `package`:
    the project's name and its package's (e.g. one the base image has installed: `more_itertools`)."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env={**os.environ, **IDENTITY})

    def commit(files: dict[str, str], message: str) -> str:
        return _commit(root, {k.replace("calc", package): v.replace("calc", package) if k in named else v
                              for k, v in files.items()}, message)

    named = {"pyproject.toml", "calc/__init__.py", "tests/test_calc.py"}
    shas = {"init": commit({"pyproject.toml": PYPROJECT, "calc/__init__.py": CALC,
                            "tests/test_calc.py": TESTS, **(extra or {})}, "init")}
    shas["sub"] = commit({"calc/__init__.py": CALC + SUB, "tests/test_calc.py": TESTS + TEST_SUB},
                         "Add sub(a, b)\n\nSubtraction, the inverse of add.")
    shas["refactor"] = commit({"calc/__init__.py": (CALC + SUB).replace("return a + b", "return b + a"),
                               "tests/test_calc.py": TESTS + TEST_SUB + "\n\ndef test_add_again():\n"
                                                                      "    assert add(1, 1) == 2\n"},
                              "Refactor add")
    return shas


FLAKY_TESTS = '''import os

COUNT = "/tmp/trajforge-flaky-count"


def test_stable():
    assert True


def test_alternates():
    """Passes on odd runs and fails on even ones (a counter outside the tree): flaky by construction."""
    n = int(open(COUNT).read()) + 1 if os.path.exists(COUNT) else 1
    with open(COUNT, "w") as f:
        f.write(str(n))
    assert n % 2 == 1
'''


def flaky_repo(root: Path) -> dict[str, str]:
    """A project whose suite is flaky, and a commit that adds `sub` with its test."""
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True, env={**os.environ, **IDENTITY})
    shas = {"init": _commit(root, {"pyproject.toml": PYPROJECT, "calc/__init__.py": CALC,
                                   "tests/test_flaky.py": FLAKY_TESTS}, "init")}
    shas["sub"] = _commit(root, {"calc/__init__.py": CALC + SUB, "tests/test_flaky.py": FLAKY_TESTS + TEST_SUB},
                          "Add sub")
    return shas



def make_and_validate(config_path: str, item: dict):
    """In a worker process, one item of the first repository of the build config at `config_path`, with its
    settings: (`make.make_env`'s environment or reject, or the `SuiteTooSlow` it raised; the `Validation` of the
    environment by the validator `trajforge envs from-repo` runs, `flows/envs_settings.validate_all`, or None)."""
    from trajforge.flows.envs_settings import validate_all
    from trajforge.schemas.config import load_config
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.envs.repos.make import make_env
    from trajforge.tasks.envs.repos.probe import SuiteTooSlow
    from trajforge.tasks.sandbox import docker_client
    from trajforge.tasks.synthesize import build_options

    config = load_config(config_path)
    s, sandbox = config.synthesize, config.sandbox
    try:
        env = make_env(docker_client(sandbox=sandbox), 0, s.repos[0], item, sandbox, build_options(s), s.image_aliases)
    except SuiteTooSlow as err:
        return err, None
    if not isinstance(env, EnvSpec):
        return env, None
    [(_, validation)] = validate_all([env.model_copy(deep=True)], s, sandbox, 1)
    return env, validation
