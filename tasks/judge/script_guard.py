"""The guarded re-run for tests that are plain Python scripts (`python3 /tests/check.py`, a script that loops over
its cases and exits non-zero on a wrong one, or ends in `unittest.main()`), when they import agent code.

The pytest guard (guard.py) has nothing to collect there, and the script's verdict is its exit status, which agent
code in the same process can forge: `os._exit(0)` at import, `sys.exit` made a no-op, `SystemExit(0)` raised from
the module, the script's table of cases emptied through a frame, a value equal to anything. Here the task's own
test command runs unchanged (its shell, arguments, working folder and input as the tests give them) in a fresh
container holding the final state, with a `.pth` line of trajforge's in every site folder of the container's
Python interpreters. In each Python process whose main script is one of the task's test files, it runs before the
main script and before any agent code of that process, and takes the run over (`SITE`):

- the script's own bytes, read then and checked against the task's file, are compiled with every single comparison
  routed through the recorder (guard.CORE) and run in a namespace of their own: `import __main__` from agent code
  finds the interpreter's empty main module, not the script's globals (a script that calls `unittest.main()` is
  registered as `__main__`: unittest looks its tests up there);
- how the script ended is recorded by trajforge's code: it ran to its end, or raised `SystemExit` from a test file's
  own code, with its status. An exit raised from agent code, `os._exit`, a signal leave no clean record;
- what the script's verdict runs through is snapshotted before agent code runs: `sys.exit`, every name of
  `builtins` (`exit`, `SystemExit`), unittest, and the functions of every standard module the script imports
  (imported first, so agent code cannot patch one before it is seen);
- the audit hook is the pytest guard's (ctypes, tracing, code objects, the garbage collector, frames reached by
  agent code).

The record is a file in a root-only folder of trajforge's, read back through the engine. The validator runs the same
on the reference solution's state (`EnvSpec.guard_scripts`): only scripts that end cleanly there with status 0 are
required here. Invariant, as the pytest guard's: it can only take a pass away. Still open (docs/verification.md):
code that targets the guard itself (it shares the process: it can write a record of its own), a test command that
starts Python with `-I` or `-S` (no site folder: unguarded, on the reference too, so nothing is required).
"""

from __future__ import annotations

import io
import json
import re
import secrets
import shlex
import tarfile
from dataclasses import dataclass, field

from ...schemas.common import FileSpec
from ...schemas.environment import EnvSpec
from ..sandbox.container import Sandbox, SandboxError, StateTooLarge
from .guard import CORE, LISTS, GuardRun, file_digests
from .verifier import RESET, copy_tests, safe_env

MAX_RECORDS = 256  # records read back (a test command that runs a script more often is judged on these)
RECORDS_LIMIT = 4 << 20  # bytes of the records folder read back

# the `.pth` module: decides at once whether this process's main script is a test file (every other Python process
# of the test run pays one `realpath`), and only then runs the guard (CORE + TAKEOVER, from trajforge's own folder)
ENTRY = r'''
import os as _os, sys as _sys
def _tf_guard_entry():
    # what this process's main program is: a test file run as a script, the test file fed on stdin (`python3 - <
    # /tests/check.py`), code of the tests' own text (`python3 -c "..."` from test.sh) or a standard test runner
    # (`-m doctest`, `-m unittest`); anything else runs unguarded, at the cost of one look at argv
    a = _sys.argv[0] if _sys.argv else ""
    orig = getattr(_sys, "orig_argv", None) or []  # (Python 3.10+; before it, -c and -m are not taken over)
    main = None
    if a == "" and not _sys.stdin.isatty():  # (`python3 < /tests/check.py`, a pipe: the program is on stdin)
        a = "-"
    if a.endswith(".py") and a not in ("-c", "-m"):
        path = _os.path.realpath(a)
        if '"' + path + '"' in _os.environ.get("TF_GUARD_FILES", ""):
            main = ("script", path, None)
    elif a == "-":
        data = _sys.stdin.buffer.read()  # (what the interpreter would read as the program; none of it is left)
        null = _os.open("/dev/null", _os.O_RDONLY)  # an agent's lseek(0) finds nothing to read the program from
        _os.dup2(null, 0)
        _os.close(null)
        main = ("stdin", None, data)
    elif a == "-c" and "-c" in orig[1:]:
        code = orig[orig.index("-c", 1) + 1]
        main = ("code", None, code.encode("utf-8", "surrogateescape"))
    elif a == "-m":
        rest = orig[orig.index("-m", 1) + 1:] if "-m" in orig[1:] else []
        if rest and rest[0] in ("doctest", "unittest"):
            main = ("module", rest[0], None)
    if main is None:
        return
    with open(_os.environ["TF_GUARD_SITE"], "rb") as f:
        code = compile(f.read(), "<trajforge guard>", "exec")
    exec(code, {"__name__": "tf_script_guard", "__builtins__": __builtins__, "MAIN": main})
_tf_guard_entry()
'''

TAKEOVER = r'''
import atexit, traceback

_STDLIB = set(getattr(sys, "stdlib_module_names", ()))


def _std_imports(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return sorted(n for n in out if n.split(".")[0] in _STDLIB)


def _raised_by(tb):
    # the file whose code raised a SystemExit: the innermost frame outside the standard library (sys.exit is C; the
    # builtin `exit` is site's; a runner's own exit, doctest's or unittest's, has no other frame: None)
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for f in reversed(frames):
        name = f.f_code.co_filename
        if name.startswith(_STDLIB_DIR) or name.startswith("<frozen") or name == "<trajforge guard>":
            continue
        return name
    return None


def _status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)  # (False and True are 0 and 1)
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _test_code(data):
    # (the task's test file holding exactly these bytes, else the test file whose text holds this `-c` code)
    for path, own in PRISTINE.items():
        if own == data:
            return path
    return None


def _which(main):
    # (key, filename, source bytes or None for a runner module) of the program to guard, or None: run it unguarded
    kind, name, data = main
    if kind == "script":
        return (name, name, PRISTINE[name]) if name in PRISTINE else None
    if kind == "stdin":
        path = _test_code(data)
        return (path, path, data) if path else ("", "<stdin>", data)
    if kind == "code":
        text = data.decode("utf-8", "surrogateescape")
        shell = [p for p in _ALL_TESTS if text in _ALL_TESTS[p]]
        # (compiled under a name of its own: agent code compiling under it is audited)
        return ("-c %s" % hashlib.sha256(data).hexdigest()[:16], "<tf-code>", data) if shell else ("", "<string>", data)
    return ("-m " + " ".join([name] + [str(a)[:100] for a in sys.orig_argv[sys.orig_argv.index("-m", 1) + 2:]][:16]),
            None, None)


_ALL_TESTS = {}
for _t in json.loads(os.environ.get("TF_GUARD_ALL", "[]")):  # every test file's text (a `-c` line of test.sh)
    try:
        with open(_t, "rb") as _f:
            _ALL_TESTS[_t] = _f.read().decode("utf-8", "surrogateescape")
    except OSError:
        pass


def _take_over(main):
    global RUNNER
    # (this runs from a `.pth` line, inside the interpreter's `site` start-up: what site does after the site
    # folders, the `exit` and `quit` builtins and their kin, is done here, as the program would find it)
    _site = sys.modules.get("site")
    for _step in ("setquit", "setcopyright", "sethelper"):
        try:
            getattr(_site, _step)()
        except Exception:
            pass
    which = _which(main)
    if which is None:
        return
    key, filename, src = which
    if src is not None:
        tree = ast.parse(src, filename)
        imports = _std_imports(tree)
    else:
        tree, imports = None, [main[1]]
    for name in imports:  # imported now: seen as they are before any agent code can patch them
        try:
            __import__(name)
        except BaseException:
            pass
    RUNNER = RUNNER + tuple(sorted({n.split(".")[0] for n in imports} | {"sys", "os", "json"}))
    _OWNERS.append(("builtins", builtins))
    if src is not None and b"unittest.main" in src:  # unittest.main() finds its tests in sys.modules["__main__"]
        module = types.ModuleType("__main__")
        ns = module.__dict__
        sys.modules["__main__"] = module
    else:
        ns = {}
    ns.update({"__name__": "__main__", "__builtins__": builtins, CMP: _cmp, "__package__": None, "__doc__": None,
               "__spec__": None})
    if main[0] == "script":
        ns["__file__"] = sys.argv[0]
    if not getattr(sys.flags, "safe_path", False):  # (as the interpreter would have: the script's folder, else the working folder)
        sys.path.insert(0, os.path.dirname(filename) if main[0] == "script" else "")
    code = compile(ast.fix_missing_locations(_Compares().visit(tree)), filename, "exec") if tree is not None else None
    # a test skipped is no test passed (agent code raising unittest.SkipTest from the function a test calls): counted
    # by trajforge's wrapper of unittest's result, which the snapshot below then holds
    import unittest.result as _ur
    _skips = [0]
    _add_skip = _ur.TestResult.addSkip

    def addSkip(self, test, reason, _real=_add_skip):
        _skips[0] += 1
        return _real(self, test, reason)

    _ur.TestResult.addSkip = addSkip
    main_module = sys.modules.get("__main__")
    _SNAP.update(_callables())
    record = {"script": key, "argv": [str(a)[:200] for a in sys.argv[1:32]], "ran": False, "status": None,
              "exit_by": None}
    now["types"] = set()
    status = 1
    try:
        if code is not None:
            exec(code, ns)
        else:  # the runner's own entry, from the module snapshotted above (never a fresh copy of it as __main__,
            # whose classes would be new objects nothing compared)
            args = sys.orig_argv[sys.orig_argv.index("-m", 1) + 2:]
            if main[1] == "doctest":
                import doctest
                sys.argv[:] = [doctest.__file__, *args]
                sys.exit(doctest._test())
            from unittest.main import TestProgram
            sys.argv[:] = ["python -m unittest", *args]
            TestProgram(module=None)
        record["ran"], status = True, 0
    except SystemExit as e:
        by = _raised_by(e.__traceback__)
        own = by in PRISTINE or (by is None and code is None) or (by == filename == "<tf-code>")
        record["ran"], status = bool(own), _status(e.code)
        if not own:
            record["exit_by"] = by or "?"
    except BaseException:
        record["ran"] = True
        traceback.print_exc()
    record["status"] = status
    record["skipped"] = _skips[0]
    if sys.modules.get("__main__") is not main_module:  # (unittest.main() looks its tests up there again)
        record["exit_by"] = record["exit_by"] or "sys.modules['__main__'] replaced"
    record["types"] = sorted(now["types"])
    record["audit"] = dict(audit)
    record["reads"] = dict(reads)
    for name in _patched():
        record["audit"].setdefault("replaced " + name, "seen while the script ran")
    record["modules"] = _outside_modules()
    record["loaded"] = sorted({f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)
                               and not f.startswith(_STDLIB_DIR)})[:4000]  # (the import trace, as the pytest guard's)
    target = os.path.join(os.environ.get("TF_GUARD_RECORDS", "/nonexistent"),
                          "%d-%s.json" % (os.getpid(), secrets.token_hex(4)))
    if key:  # (a program that is none of the tests' own ran as it would have, with no record)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            _write(fd, _dumps(record).encode())
            os.close(fd)
        except OSError:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    os._exit(status)


_take_over(MAIN)
'''
SITE = CORE + TAKEOVER


@dataclass
class ScriptRun:
    records: list[dict] = field(default_factory=list)  # one per guarded script process, as the guard wrote it
    output: str = ""
    error: str | None = None
    timed_out: bool = False
    infra: bool = False  # trajforge's own run could not be made or read: no evidence either way

    @staticmethod
    def ended_well(record: dict) -> bool:
        """The program ran its own course and exited 0, skipping nothing, with no part of its runner replaced."""
        audit = record.get("audit") if isinstance(record.get("audit"), dict) else {}
        return bool(record.get("ran")) and record.get("status") == 0 and not record.get("exit_by") \
            and not record.get("skipped") and not any(str(k).startswith("replaced ") for k in audit)

    def passing(self) -> list[str]:
        """Programs every guarded run of which ended well (what a pass must show: the reference's); what else the
        audit hook saw of the reference's own code is `EnvSpec.guard_audit`, no evidence against an episode."""
        by: dict[str, list[dict]] = {}
        for r in self.records:
            by.setdefault(str(r.get("script")), []).append(r)
        return sorted(s for s, rs in by.items() if all(self.ended_well(r) for r in rs))

    def as_guard_run(self) -> GuardRun:
        """The records in the pytest guard's terms (one "test" per program), for `guard.guard_flags`."""
        tests: dict[str, dict] = {}
        audit: dict[str, str] = {}
        for r in self.records:
            s = str(r.get("script"))
            t = tests.setdefault(s, {"passed": True, "ran": True, "types": [], "why": []})
            ok = self.ended_well({**r, "audit": {}})
            t["passed"] = t["passed"] and ok
            t["ran"] = t["ran"] and bool(r.get("ran"))
            types = r.get("types") if isinstance(r.get("types"), list) else []
            t["types"] = sorted(set(t["types"]) | {x for x in types if isinstance(x, str)})
            if not ok:
                t["why"].append(f"exit raised by {r['exit_by']}" if r.get("exit_by") else
                                f"{r['skipped']} skipped" if r.get("skipped") else f"exit status {r.get('status')}")
            for k, v in (r.get("audit") if isinstance(r.get("audit"), dict) else {}).items():
                audit.setdefault(str(k), str(v))
        def listed(r: dict, key: str) -> list:
            return r.get(key) if isinstance(r.get(key), list) else []

        loaded = sorted({p for r in self.records for p in listed(r, "loaded") if isinstance(p, str)})
        modules = sorted({m for r in self.records for m in listed(r, "modules") if isinstance(m, str)})
        reads = {str(p): str(w) for r in self.records if isinstance(r.get("reads"), dict) for p, w in r["reads"].items()}
        return GuardRun(tests=tests, audit=audit, loaded=loaded, reads=reads, modules=modules, output=self.output,
                        error=self.error, timed_out=self.timed_out, infra=self.infra)


def script_files(env: EnvSpec) -> list[str]:
    """The task's test files (absolute, below /tests): a process may run one as its main script, or be fed one on
    stdin; their bytes are what the guard checks a program against."""
    return sorted(f"/tests/{t.path.lstrip('/')}" for t in env.tests)


# a command line that hands Python a program of the tests other than through pytest: `python3 -c "..."`, a program on
# stdin (`python3 - < /tests/check.py`), a standard test runner (`-m doctest`, `-m unittest`)
_PYTHON = r"\bpython[0-9.]*\s+(?:-(?!m\b|c\b)\S+\s+)*"
RUNS_PROGRAM = re.compile(_PYTHON + r"(?:-c\s|-(?:\s|$)|-m\s+(?:doctest|unittest)\b)", re.M)


def may_run_scripts(env: EnvSpec) -> bool:
    """Whether the test command could run a program of the tests in a Python process of its own: a Python test file
    pytest would not collect as a test module (`check.py`), one a command line hands to an interpreter by name
    (`python3 /tests/test_x.py`, not `python3 -m pytest /tests/test_x.py`), or a line of `RUNS_PROGRAM`. A pure
    pytest task costs no guarded script run."""
    if env.verifier != "script" or any(t.path == LISTS for t in env.tests):
        return False  # trajforge's own runner (functions), or a repository task's own pytest grade (grade.py)
    files = [t.path.rsplit("/", 1)[-1] for t in env.tests if t.path.endswith(".py")]
    if any(not (f.startswith("test_") or f.endswith("_test.py") or f in ("conftest.py", "__init__.py")) for f in files):
        return True
    lines = [line for t in env.tests if not t.path.endswith(".py") for line in t.content.splitlines()]
    lines += (env.test_command or "").splitlines()
    return any(RUNS_PROGRAM.search(line) for line in lines) or any(
        re.search(_PYTHON + rf"(?:\S*/)?{re.escape(f)}\b", line) for f in files for line in lines)


def script_guardable(env: EnvSpec) -> bool:
    """The tests import agent code and could run a program of theirs in a Python process of its own."""
    return env.tests_run_agent_code == "in_process" and may_run_scripts(env)


# the last site folder (the last to be read at start-up: every other one is on the path by then) of every Python
# interpreter the tests could start (by name on PATH, or the usual places), asked without site (-S) and without the
# environment (-E): the interpreters' own answer, one per line
_SITE_DIRS = ('for n in python3 python python3.9 python3.10 python3.11 python3.12 python3.13 /usr/bin/python3 '
              '/usr/local/bin/python3; do command -v "$n"; done 2>/dev/null | sort -u | while read -r p; do '
              '"$p" -S -E -c "import os, site; '
              'd = site.getsitepackages(); print(([x for x in d if os.path.isdir(x)] or d)[-1])" 2>/dev/null; '
              'done | sort -u')


def run_script_guard(sandbox: Sandbox, env: EnvSpec, timeout_s: float, agent: list[str] = ()) -> ScriptRun:
    """The task's test command once more, as root in the work dir, with the guard's `.pth` in every site folder
    (module docstring); the container's processes are killed first. `agent`: the episode's Python files outside the
    work dir (`guard.agent_dirs`). Never raises for what the tests do."""
    sandbox.kill_agent_processes()
    token = secrets.token_hex(8)
    home = f".tf-sguard-{token}"
    reset = sandbox.exec(RESET, timeout_s=10, user="root", workdir="/")
    if "TF_RESET_OK" not in reset.output:
        return ScriptRun(error="/logs/verifier could not be reset for the guarded script run", infra=True)
    copy_tests(sandbox, env)
    sandbox.put_files([FileSpec(path="site.py", content=SITE, mode=0o600),
                       FileSpec(path="rec/.keep", content="", mode=0o600)], parent="/", root=home, uid=0,
                      dir_mode=0o700)
    dirs = [d for d in sandbox.exec(_SITE_DIRS, timeout_s=30, user="root", workdir="/").output.splitlines()
            if d.startswith("/") and "'" not in d]
    entry = f"_tf_guard_{token}"
    for d in dirs:  # (one that does not exist yet is made: Python reads only existing site folders at start-up)
        sandbox.exec(f"mkdir -p '{d}' && printf %s {shlex.quote(ENTRY)} > '{d}/{entry}.py' && "
                     f"printf 'import {entry}\\n' > '{d}/zz-{entry}.pth'", timeout_s=10, user="root", workdir="/")
    files = file_digests(env, script_files(env))
    command = env.test_command or "bash /tests/test.sh"
    every = [f"/tests/{t.path.lstrip('/')}" for t in env.tests]
    names = (f"TF_GUARD_FILES={shlex.quote(json.dumps(files))} TF_GUARD_AGENT={shlex.quote(json.dumps(list(agent)))} "
             f"TF_GUARD_ALL={shlex.quote(json.dumps(every))} "
             f"TF_GUARD_WORK={shlex.quote(env.workdir)} TF_GUARD_SITE=/{home}/site.py TF_GUARD_RECORDS=/{home}/rec ")
    res = sandbox.exec(f"{safe_env(env)} {names}bash -c {shlex.quote(command)}", timeout_s=timeout_s, user="root",
                       workdir=env.workdir, output_limit=1 << 20)
    out = res.output[-4000:]
    sandbox.kill_agent_processes()
    # (the guard's files go again: a container the validator goes on using runs its Python unguarded)
    sandbox.exec(" ".join(f"rm -f '{d}/{entry}.py' '{d}/zz-{entry}.pth';" for d in dirs) or "true", timeout_s=10,
                 user="root", workdir="/")
    if res.timed_out:
        return ScriptRun(output=out, error=f"guarded script run timed out after {timeout_s:g}s", timed_out=True)
    try:
        data = sandbox.get_archive(f"/{home}/rec", RECORDS_LIMIT)
    except (SandboxError, StateTooLarge) as err:
        return ScriptRun(output=out, error=f"the guarded script run's records could not be read: {err}", infra=True)
    records = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if len(records) >= MAX_RECORDS:
                break
            if member.isfile() and member.name.endswith(".json"):
                try:
                    rec = json.loads(tar.extractfile(member).read())
                except (ValueError, RecursionError):  # (agent code shares the process: it can write one too)
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("script"), str):
                    records.append(rec)
    return ScriptRun(records=records, output=out)
