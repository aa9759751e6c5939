"""Harness `trajforge-bash-v1`: tools `bash` (one command in a fresh shell in the work dir) and `submit`; a
model without tool calling answers with one ```bash fenced block per turn, or SUBMIT. The observation is
`[exit code N]` (plus why a command was killed) and its output; `submit` ends the episode. The replay teacher
sends each recorded command as one `bash` call (```bash block in fenced mode). The turn loop is
`_Episode`'s own (tasks/agent/harness.py): this is the `terminal` kind's harness and its trajectories are
those trajforge always wrote."""

from __future__ import annotations

from ....schemas.trajectory import BASH_HARNESS
from ..harness import MODES
from . import Harness, register

HARNESS = register(Harness(name=BASH_HARNESS, kinds=("terminal",), mode=MODES["bash"],
                           description="bash + submit (fenced ```bash without tool calling)"))
