"""Judging: the hidden-test runner (`verifier.py`), what the agent changed and the counterfactual
(`changes.py`), hack detectors (`hacks.py`) and quality signals (`quality.py`).

Invariant: judging trusts nothing the agent touched. It reads the episode through `tasks/sandbox` (the
engine's API, its view of the writable layer, a fresh container) and never through the agent's
container's programs. Imports point down: judge ← sandbox; nothing in `tasks/sandbox` imports this package.
"""
