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

Machinery only: nothing here runs a container. The stage that turns candidates into validated environments
(the project's image, fail-to-pass and pass-to-pass lists from running its tests) builds on these.
"""
