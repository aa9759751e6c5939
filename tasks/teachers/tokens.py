"""A rollout's sampled token sequence, stored without quadratic prompts and rebuilt exactly.

Each turn the server tokenises the whole conversation again (its chat template over the messages) and
samples a completion. A turn is stored as the length of the prefix its prompt shares with the previous
turn's prompt + completion (`prompt_shared_len`), the prompt ids after it (`prompt_new_token_ids`), and
the completion ids as sampled. Invariants:

- prompt(k) == sequence(k-1)[:prompt_shared_len(k)] + prompt_new_token_ids(k), with sequence(0) == [] and
  sequence(k) == prompt(k) + completion(k): every turn's exact prompt comes back, whatever the template did;
- the rollout is *prefix-preserving* when every turn's prompt extends the previous sequence
  (prompt_shared_len(k) == len(sequence(k-1))); then sequence(last) is the whole rollout as one token
  sequence and the completions sit in it where the model sampled them. When re-rendering a turn changed
  tokens the model had sampled (retokenisation drift, a template that rewrites history), it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


def split_prompt(previous: Sequence[int], prompt: Sequence[int]) -> tuple[int, list[int]]:
    """(shared, new): the length of the common prefix of `previous` (the last turn's prompt + completion)
    and `prompt`, and `prompt`'s ids after it."""
    n = min(len(previous), len(prompt))
    shared = next((i for i in range(n) if previous[i] != prompt[i]), n)
    return shared, list(prompt[shared:])


@dataclass
class Assembled:
    """A rollout's tokens rebuilt from its turns. `prompts[k]` is turn k's exact prompt. When
    `prefix_preserving`, `token_ids` is the rollout as one sequence and `loss_mask[i]` says whether
    `token_ids[i]` was sampled by the model (the completions); otherwise both are empty (train per turn:
    `prompts[k]` + that turn's completion). `prefix_preserving` is None when a turn has no prompt ids."""

    prompts: list[list[int]]
    prefix_preserving: bool | None
    token_ids: list[int]
    loss_mask: list[bool]


def assemble(turns: Sequence[Any]) -> Assembled:
    """Rebuild from turns with `prompt_shared_len`, `prompt_new_token_ids`, `completion_token_ids`
    (records or dicts, e.g. `rl_tokens` rows' `turns`)."""
    get = (lambda t, k: t.get(k)) if turns and isinstance(turns[0], dict) else getattr
    if not turns or any(get(t, "prompt_new_token_ids") is None or get(t, "completion_token_ids") is None
                        for t in turns):
        return Assembled([], None, [], [])
    prompts, sequence, preserving, mask = [], [], True, []
    for t in turns:
        shared, new, completion = get(t, "prompt_shared_len") or 0, get(t, "prompt_new_token_ids"), get(t, "completion_token_ids")
        if shared > len(sequence):
            raise ValueError(f"turn {get(t, 'turn')}: prompt_shared_len {shared} exceeds the previous sequence "
                             f"({len(sequence)} ids)")
        preserving = preserving and shared == len(sequence)
        prompt = sequence[:shared] + list(new)
        prompts.append(prompt)
        mask = mask[:shared] + [False] * len(new) + [True] * len(completion)
        sequence = prompt + list(completion)
    return Assembled(prompts, preserving, sequence if preserving else [], mask if preserving else [])
