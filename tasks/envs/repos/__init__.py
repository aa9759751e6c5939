"""Environments from repositories (issue 43): software-engineering tasks from a Python project's own history
and from bugs planted in its code.

- `bugs`: program transformations that plant one bug in a function (a flipped comparison, an off-by-one, a
  removed branch, swapped arguments, a changed constant, a removed call); pure, deterministic, AST-based; the
  reference solution of a planted-bug task is the inverse patch.
- `history`: the commits of a git repository that change non-test code (with the tests they add or change):
  the candidates of commit tasks; the reference solution is the commit's diff of non-test files.

Machinery only: nothing here runs a container. The stage that turns candidates into validated environments
(the project's image, fail-to-pass and pass-to-pass lists from running its tests) builds on these.
"""
