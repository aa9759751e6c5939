"""The code procedural tool families ship into the sandbox (`.tools/tools.py` and the hidden checks),
kept as real modules that ruff and the tests read: `common` (helpers every family's tools share, the
end-state checks every family appends, the tools more than one family offers) and one module per family.

These modules are never imported inside the sandbox: their functions' source text is what the image and
the tests hold (tasks/envs/tools/code_text.py), so it is part of each environment's content hash. They
use only the standard library and what the sandbox defines for them (`ToolError` in tools.py, `EXPECTED`,
`rows`, `value` in the test file), imported here from tasks/envs/tools for ruff and for host-side tests.
"""
