"""The grader of a repository task, shipped with its hidden tests (`/tests/grade.py`, beside `/tests/testlists.py`,
a copy of this package's `testlists.py`, and `/tests/lists.json`): stdlib only, run as `python3 -I` in the task's
container from the project's work dir.

- `grade.py outcomes [SECONDS]`: runs the project's whole suite (the test paths; within SECONDS, default
  `lists.json`'s `timeout_s`) and prints one line after `MARK`: JSON
  `{"outcomes": {node id: outcome}, "messages": {node id: first line of its failure}, "exit": code, "tail": ...}`
  (what `probe.py` reads, before and after the reference solution).
- `grade.py reward`: runs the fail-to-pass and pass-to-pass tests only and writes `/logs/verifier/reward.json`:
  `{"reward": 1.0 or 0.0, "tests": [{"name", "passed", "message"}]}` (SWE-style: every listed test passed; a test
  the run did not report is `missing`).
The test command is `lists.json`'s `command` (the project's own, `project.test_command`) with `REPORT` replaced by
the JUnit report's path and the selection appended, run from `tree/` beside this file (the project's test files as
they are in its tree: node ids are the project's), `PYTEST_ADDOPTS` emptied, bytecode read only from this run's own
`PYTHONPYCACHEPREFIX`, and pytest plugins loaded only from distributions outside the work dir (`lists.json`'s
`workdir`); the project's code is imported from the
work dir (on `sys.path` through the image's `.pth`), so nothing is written into the agent's files.
"""

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "__TF_REPO_OUTCOMES__ "
REPORT = "@REPORT@"
REWARD = "/logs/verifier/reward.json"


def _testlists():
    """The copy of `testlists.py` beside this file (imported only when run: importing this module does nothing)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import testlists

    return testlists


def _trusted_plugins(workdir) -> list:
    """The modules of the pytest plugins (`pytest11` entry points) installed in the image, outside `workdir`: the
    run loads these with `-p` and autoloads none (a distribution's metadata the agent adds to the work dir is on
    `sys.path` through the image's .pth, and would otherwise be loaded as a plugin)."""
    from importlib import metadata

    root = os.path.realpath(workdir) + os.sep if workdir else None
    found = set()
    for dist in metadata.distributions():
        where = os.path.realpath(str(dist.locate_file(""))) + os.sep
        if root and where.startswith(root):
            continue
        found.update(ep.module for ep in dist.entry_points if ep.group == "pytest11")
    return sorted(found)


def _run(spec: dict, selection: list, timeout_s: float | None = None) -> tuple:
    """(node id -> outcome, node id -> message, exit code, output tail) of one run of the test command."""
    testlists = _testlists()
    folder = tempfile.mkdtemp(prefix="tf-junit-")
    report = os.path.join(folder, "junit.xml")
    plugins = [a for module in _trusted_plugins(spec.get("workdir")) for a in ("-p", module)]
    argv = [report if a == REPORT else a.replace("--junitxml=" + REPORT, "--junitxml=" + report)
            for a in spec["command"]] + plugins + list(selection)
    # No bytecode but what this run compiles (an unchecked-hash .pyc the agent put beside an untouched source is
    # never run), and no plugin the agent's files declare (a [pytest11] entry point in a dist-info in the work dir).
    env = dict(os.environ, PYTEST_ADDOPTS="", PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=folder,
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    try:
        proc = subprocess.run(argv, cwd=os.path.join(HERE, "tree"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, timeout=timeout_s or spec.get("timeout_s", 600))
        code, out = proc.returncode, proc.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        code, out = -9, (e.stdout or b"").decode("utf-8", "replace") + "\n[timed out]"
    try:
        with open(report, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    outcomes = testlists.parse_junit(text)
    messages = {}
    if text.strip():
        for case in ET.fromstring(text).iter("testcase"):
            bad = next((c for c in case if c.tag in ("failure", "error")), None)
            if bad is not None:
                key = testlists.node_id(case.get("classname") or "", case.get("name") or "", case.get("file"))
                first = (bad.get("message") or (bad.text or "").strip() or bad.tag).strip().splitlines()
                messages[key] = (first[0] if first else bad.tag)[:300]
    return outcomes, messages, code, out[-3000:]


def main(mode: str, timeout_s: float | None = None) -> int:
    testlists = _testlists()
    with open(os.path.join(HERE, "lists.json"), encoding="utf-8") as f:
        spec = json.load(f)
    if mode == "outcomes":
        outcomes, messages, code, tail = _run(spec, spec["paths"], timeout_s)
        print("\n" + MARK + json.dumps({"outcomes": outcomes, "messages": messages, "exit": code, "tail": tail}))
        return 0
    lists = testlists.TestLists(tuple(spec["fail_to_pass"]), tuple(spec["pass_to_pass"]), (), (), 0, 0)
    outcomes, messages, code, tail = _run(spec, [*lists.fail_to_pass, *lists.pass_to_pass])
    value, results = testlists.reward(lists, outcomes)
    tests = [{"name": name, "passed": result == "passed", "message": result if result == "passed"
              else f"{result}: {messages.get(name, '')}"[:300]} for name, result in results.items()]
    os.makedirs(os.path.dirname(REWARD), exist_ok=True)
    with open(REWARD, "w", encoding="utf-8") as f:
        json.dump({"reward": value, "tests": tests}, f)
    print(tail)
    print(f"reward {value:g}: {sum(t['passed'] for t in tests)}/{len(tests)} listed tests passed")
    return 0 if value >= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "reward", float(sys.argv[2]) if len(sys.argv) > 2 else None))
