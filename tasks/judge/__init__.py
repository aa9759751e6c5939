"""Judging: the hidden-test runner (`verifier.py`), what the agent changed and the counterfactual
(`changes.py`), hack detectors (`hacks.py`), quality signals (`quality.py`) and the ordered checks of
one rollout (`checks.py`: `CHECKS`, which `tasks/verify.py` runs).

Invariant: judging trusts nothing the agent touched. It reads the episode through `tasks/sandbox` (the
engine's API, its view of the writable layer, a fresh container) and never through the agent's
container's programs. Imports point down: judge ← sandbox; nothing in `tasks/sandbox` imports this package.
"""
