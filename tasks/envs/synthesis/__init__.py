"""LLM synthesis of environments, for every kind: `terminal.py` (task folders' shape: instruction, files,
hidden tests, solution) and `tools.py` (a `ToolTask`), over one reply parser (`reply.py`: asking, the
lenient JSON parse, the rejects, the environment an accepted candidate becomes) and one safety check of
model-written code (`safety.py`)."""
