"""The image of a repository task: the project's tree at the task's starting state, without its tests, on the local
base image, with its dependencies installed (issue 43).

`split(tree)` parts a tree into code files and test files (`history.is_test_path`); `recipe(...)` gives the
Dockerfile, its build context and binary blobs. The environment that carries them is an ordinary Dockerfile
environment (`EnvSpec.dockerfile`), so its image is built as imported tasks' are (`images.ensure_image`): tagged by
the hash of the base image, the Dockerfile and every context file (the tree's digest, the requirements), built
once, under `synthesize.build.egress` (pip reaches PyPI through the egress proxy, with the build CA bundle).

Invariants:
- No test file (`is_test_path`) is in the context: the hidden tests never enter the agent's image.
- Nothing outside the tree is read: a link leading out of it, `.git` and Python caches are skipped; a file that is
  not UTF-8 travels as a blob (by content hash), never inlined.
- Dependencies install into `DEPS` (pip run from its pinned wheel, `--target`: Debian's Python is left as it is),
  named by a `.pth` that comes before Debian's packages; the project itself is never installed: the work dir (or
  its `src/`) is on `sys.path` through a `.pth` read after every installed package, so a file the agent adds cannot
  shadow an installed module (the grader's pytest above all). The project's own top-level packages and modules (as
  the revision has them) are the exception: a finder first on `sys.meta_path` (`PROJECT_FINDER`, root's file)
  takes them from the work dir only, so an installed copy of the project (Debian's `python3-more-itertools`, which
  its pytest depends on) never stands in for the code the agent edits, and a package the agent deletes is a
  `ModuleNotFoundError`, never the installed copy.
- A requirement that names the project itself, or a path (`.`, `-e`), is dropped: the work dir stands for it.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path, PurePosixPath

from ....schemas.common import FileSpec
from ....schemas.environment import Blob
from ..blobs import BlobStore
from .history import is_test_path
from .project import PYTHON, Project, file_requirements, inside

DEPS = "/opt/trajforge/deps"
PIP_DIR = "/opt/trajforge/pip"
PROJECT_PTH = "/usr/lib/python3/dist-packages/zz-trajforge-project.pth"
PROJECT_FINDER = "/usr/lib/python3/dist-packages/trajforge_project_first.py"
FINDER = '''"""trajforge (repository tasks): the project's own top-level names import from {root} only."""
import sys
from importlib.machinery import PathFinder

ROOT = {root!r}
NAMES = frozenset({names!r})


class ProjectFirst:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or name not in NAMES:
            return None
        spec = PathFinder.find_spec(name, [ROOT])
        if spec is None:
            raise ModuleNotFoundError(f"No module named {{name!r}} in {{ROOT}}", name=name)
        return spec

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


if ProjectFirst not in sys.meta_path:
    sys.meta_path.insert(0, ProjectFirst)
'''
NOT_PACKAGES = frozenset({"setup", "conftest", "noxfile", "fabfile", "tasks", "docs", "doc", "tests", "test"})
# never taken from the work dir first: the standard library and the test runner the grader starts (a project of that
# name keeps the `.pth` order: installed first)
RUNNER = frozenset(sys.stdlib_module_names) | {"pytest", "_pytest", "pluggy", "py", "iniconfig"}
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".hg", ".svn", ".tox", ".nox", ".mypy_cache", ".pytest_cache"})
MAX_FILE = 4 << 20
NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

RECIPE = """FROM {base}
USER root
COPY .tf-pip/ {pip_dir}/
COPY .tf-requirements.txt /opt/trajforge/requirements.txt
RUN site=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p "$site" {deps} \\
 && echo {deps} > "$site/00-trajforge-deps.pth"{install}
COPY project/ {workdir}/
COPY .tf-project-first.py {project_finder}
RUN printf '%s\\nimport trajforge_project_first\\n' {import_root} > {project_pth}{commands}
"""
PIP = "python3 {pip_dir}/{wheel}/pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore " \
      "--no-compile --break-system-packages --target {deps}"


def split(tree: Path, test_globs: tuple[str, ...] = ()) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(code files, test files) of `tree`: relative path -> bytes, sorted, links out of the tree and `SKIPPED_DIRS`
    left out."""
    tree = Path(tree)
    code: dict[str, bytes] = {}
    tests: dict[str, bytes] = {}
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if any(part in SKIPPED_DIRS for part in PurePosixPath(rel).parts) or not path.is_file() \
                or not inside(tree, path) or path.suffix == ".pyc":
            continue
        (tests if is_test_path(rel, test_globs) else code)[rel] = path.read_bytes()
    return code, tests


def src_layout(code: dict[str, bytes]) -> bool:
    """Whether the project's code (relative path -> bytes) is imported from `src/` (a `.py` file there)."""
    return any(PurePosixPath(p).parts[0] == "src" and p.endswith(".py") for p in code)


def import_names(code: dict[str, bytes], src: bool) -> list[str]:
    """The project's top-level packages and modules (relative path -> bytes of its code files): a folder of the
    import root with an `__init__.py`, or a `.py` file in it (set-up and task-runner scripts, `RUNNER` left out)."""
    prefix = ("src",) if src else ()
    names = set()
    for rel in code:
        parts = PurePosixPath(rel).parts
        if parts[:len(prefix)] != prefix or len(parts) <= len(prefix):
            continue
        rest = parts[len(prefix):]
        name = rest[0][:-3] if len(rest) == 1 and rest[0].endswith(".py") else \
            rest[0] if len(rest) == 2 and rest[1] == "__init__.py" else None
        if name and name.isidentifier() and name not in NOT_PACKAGES and name not in RUNNER:
            names.add(name)
    return sorted(names)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(project: Project, tree: Path) -> list[str]:
    """What the image installs: the project's runtime requirements, those of its test extras and groups, and the
    lines of its requirement files, without the project itself or a path; each once, in that order."""
    own = _norm(project.name) if project.name else None
    lines = [*project.requires, *project.test_requires,
             *(r for f in project.requirement_files for r in file_requirements(tree, f))]
    out: list[str] = []
    for line in lines:
        m = NAME.match(line)
        if not m or line.startswith((".", "/", "-")) or (own and _norm(m.group(1)) == own) or "://" in line:
            continue
        if line not in out:
            out.append(line)
    return out


def _install_commands(project: Project, wheel: str) -> list[str]:
    """The override's install commands as shell steps (`python -m pip install` becomes trajforge's pip into
    `DEPS`, `python` is `python3`)."""
    steps = []
    for argv in project.install:
        argv = list(argv)
        if argv[:4] == [PYTHON, "-m", "pip", "install"]:
            rest = [a for a in argv[4:] if a != "-e"]
            steps.append(PIP.format(pip_dir=PIP_DIR, wheel=wheel, deps=DEPS) + " " + shlex.join(rest))
        else:
            steps.append(shlex.join(["python3" if argv[0] == PYTHON else argv[0], *argv[1:]]))
    return steps


def recipe(base: str, workdir: str, project: Project, tree: Path, code: dict[str, bytes], pip_wheel: bytes,
           wheel_name: str, install_override: bool) -> tuple[str, list[FileSpec], list[Blob]]:
    """(Dockerfile, text context files, binary blobs) of the image with `code` (relative path -> bytes) in
    `workdir`; `pip_wheel` is pip's own wheel (`wheel_name`), the installer."""
    store = BlobStore()
    blobs = [Blob(path=f".tf-pip/{wheel_name}", sha256=store.put(pip_wheel), size=len(pip_wheel))]
    reqs = [] if install_override else requirements(project, tree)
    context = [FileSpec(path=".tf-requirements.txt", content="".join(f"{r}\n" for r in reqs))]
    for rel, data in code.items():
        mode = 0o644
        try:
            if len(data) > MAX_FILE or b"\0" in data:
                raise UnicodeDecodeError("utf-8", data[:1], 0, 1, "binary")
            context.append(FileSpec(path=f"project/{rel}", content=data.decode("utf-8"), mode=mode))
        except UnicodeDecodeError:
            blobs.append(Blob(path=f"project/{rel}", sha256=store.put(data), size=len(data), mode=mode))
    pip = PIP.format(pip_dir=PIP_DIR, wheel=wheel_name, deps=DEPS)
    install = f" \\\n && {pip} -r /opt/trajforge/requirements.txt" if reqs else ""
    src = src_layout(code)
    root = f"{workdir}/src" if src else workdir
    context.append(FileSpec(path=".tf-project-first.py", content=FINDER.format(root=root,
                                                                               names=import_names(code, src))))
    dockerfile = RECIPE.format(base=base, pip_dir=PIP_DIR, deps=DEPS, install=install, workdir=workdir,
                               import_root=shlex.quote(root), project_pth=PROJECT_PTH, project_finder=PROJECT_FINDER,
                               commands="".join(f" \\\n && cd {shlex.quote(workdir)} && {step}" for step in
                                                _install_commands(project, wheel_name)) if install_override else "")
    return dockerfile, context, blobs
