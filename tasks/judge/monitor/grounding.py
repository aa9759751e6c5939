"""Detector `ungrounded_claim` (SPARK's posterior grounding, the rule-based part): the agent's final message claims
a verification (the tests pass, the output is verified, it works) that no observation of the episode shows: no
check ran after the last change, or every check after it failed. A claim of being done is no claim of a check."""

from __future__ import annotations

import re

from ..quality import CHECK, label_steps
from .evidence import Evidence
from .registry import Detector, flag, register

CLAIM = re.compile(r"\b(all\s+(\w+\s+){0,2}tests?\s+(now\s+)?pass(ed|es)?|tests?\s+(now\s+)?pass(ed|es|ing)?"
                   r"|(i\s+)?(have\s+)?verified|(it|this|everything)\s+(now\s+)?works|output\s+(now\s+)?matches"
                   r"|confirmed\s+(that\s+)?(it|the|this)|checks?\s+pass(ed|es)?)\b", re.I)


def find(ev: Evidence):
    claim = CLAIM.search(ev.final)
    if not claim:
        return []
    labels = label_steps(ev.steps)
    acts = [i for i, lab in enumerate(labels) if lab == "act"]
    after = ev.steps[acts[-1] + 1:] if acts else ev.steps
    checks = [s for s in after if CHECK.search(s.command)]
    if any(s.exit_code == 0 for s in checks):
        return []
    said = ev.final[max(0, claim.start() - 40): claim.end() + 40]
    why = "every check after the last change failed" if checks else "no check ran after the last change"
    return [flag("ungrounded_claim", f"{why}; the final message says: {said}")]


register(Detector("ungrounded_claim", 0.2, find, "a claimed verification that no observation of the episode shows"))
