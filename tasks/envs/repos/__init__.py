"""Environments from repositories (issue 43): software-engineering tasks from a Python project's own history
and from bugs planted in its code.

- `bugs`: program transformations that plant one bug in a function (a flipped comparison, an off-by-one, a
  removed branch, swapped arguments, a changed constant, a removed call); pure, deterministic, AST-based; the
  reference solution of a planted-bug task is the inverse patch.
- `history`: the commits of a git repository that change non-test code (with the tests they add or change):
  the candidates of commit tasks; the reference solution is the commit's diff of non-test files.
- `project`: how a Python project installs and runs its tests, read from its tree (never executing
  `setup.py`), and the test command that writes a JUnit report for chosen node ids.
- `testlists`: the hidden test lists from runs before and after (fail-to-pass, a pass-to-pass sample,
  flaky tests excluded) and the SWE-style reward of a run against them.

The source built on them (`synthesize.repos`, `trajforge envs from-repo`):
- `fetch`: the repository (a git repository, a folder, a git URL, or a PyPI project's released sdists as history);
- `plan`: the items a repository tries (commits, planted bugs; deduplicated, seeded, capped);
- `image`: the task's image (the tree without tests, dependencies installed under the build egress rules);
- `probe`: one container per candidate: the suite before and after the reference solution;
- `grade`: the verifier's runner shipped with the hidden tests (SWE-style reward, per-test results);
- `make`: an item made an environment, or a reject with its reason; `source`: what the `propose` stage calls.
"""
