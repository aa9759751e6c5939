"""The pipeline graph, as data: the stages in order, what each reads, and the adaptive loop.

`flows.build` executes whatever `Pipeline` it is given; a new stage is a new `Step` here, never a
special case in the flow. Instances: a stage runs once as `<name>`, and as `<name>.r<k>` in adaptive
round k. Input selectors name what a step reads from the manifests committed so far:

- `"x"`: the newest instance of stage x, under the key `x`;
- `"x*"`: every instance of x, each under its instance name (`verify`, `verify.r1`, …);
- `"x@"`: the instance of x from the same round, under the key `x`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..schemas.calibration import RoundPlan
from ..schemas.config import BuildConfig
from .calibrate import CalibrateStage
from .engine import Manifest, Stage
from .export import ExportStage
from .propose import ProposeStage
from .rollout import RolloutStage
from .synthesize import SynthesizeStage
from .verify import VerifyStage


@dataclass(frozen=True)
class Step:
    stage: Stage
    inputs: tuple[str, ...] = ()
    round_inputs: tuple[str, ...] | None = None  # inputs in an adaptive round (default: `inputs`)

    @property
    def name(self) -> str:
        return self.stage.name


@dataclass(frozen=True)
class Loop:
    """Rounds of `body` after `after` committed, while `next_round` returns a plan, at most
    `max_rounds(config)` times. The plan is a typed record the deciding stage committed."""

    body: tuple[str, ...]
    after: str
    max_rounds: Callable[[BuildConfig], int]
    next_round: Callable[[Manifest], RoundPlan | None]
    describe: Callable[[RoundPlan], str]


@dataclass(frozen=True)
class Pipeline:
    steps: tuple[Step, ...]
    loop: Loop | None = None

    def __post_init__(self) -> None:
        for step in self.steps:  # the graph must feed every stage what its contract requires
            for inputs in (step.inputs, step.round_inputs or ()):
                given = {_base(sel) for sel in inputs}
                if inputs and not set(step.stage.requires) <= given:
                    raise ValueError(f"pipeline: step {step.name!r} reads {sorted(given)}, "
                                     f"its stage requires {list(step.stage.requires)}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    @property
    def stages(self) -> list[Stage]:
        return [s.stage for s in self.steps]

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"unknown stage {name!r}; valid stages: {', '.join(self.names)}")

    def stage(self, name: str) -> Stage:
        return self.step(name.split(".")[0]).stage

    def downstream(self, name: str) -> list[str]:
        """The stages after `name` that read its output (`inputs`, directly or through others), in pipeline order.
        An adaptive round's inputs (`round_inputs`: rollout reading calibrate) are no edge here: whether a round
        runs is decided later."""
        found: set[str] = {name}
        for s in self.steps[self.names.index(name) + 1:]:
            if {_base(sel) for sel in s.inputs} & found:
                found.add(s.name)
        return [n for n in self.names if n in found and n != name]

    def select(self, from_: str | None = None, only: list[str] | None = None) -> list[str]:
        """Stages to run (others are resolved from committed manifests). Validates names."""
        for n in [from_, *(only or [])]:
            if n is not None:
                self.step(n)
        if only:
            return [n for n in self.names if n in only]
        start = self.names.index(from_) if from_ else 0
        return self.names[start:]


def instance_name(stage: str, round_: int) -> str:
    return stage if round_ == 0 else f"{stage}.r{round_}"


def _base(selector: str) -> str:
    return selector.rstrip("*@").split(".")[0]


def resolve_inputs(step: Step, committed: dict[str, Manifest], round_: int = 0) -> dict[str, Manifest]:
    """The upstream manifests of `step` in `round_`, keyed as the stage expects (see module docstring).
    `committed` maps instance names to manifests in the order they were committed."""
    selectors = step.round_inputs if round_ and step.round_inputs is not None else step.inputs
    out: dict[str, Manifest] = {}
    for sel in selectors:
        base = _base(sel)
        if sel.endswith("*"):
            out.update({k: m for k, m in committed.items() if k.split(".")[0] == base})
        elif sel.endswith("@"):
            key = instance_name(base, round_)
            if key in committed:
                out[base] = committed[key]
        else:
            latest = [m for k, m in committed.items() if k.split(".")[0] == base]
            if latest:
                out[base] = latest[-1]
    return out


def _adaptive_plan(manifest: Manifest) -> RoundPlan | None:
    plan = RoundPlan.of(manifest.stats)
    return plan if plan.needs_more else None


PIPELINE = Pipeline(
    steps=(
        Step(ProposeStage()),
        Step(SynthesizeStage(), ("propose",)),
        Step(RolloutStage(), ("synthesize",), round_inputs=("synthesize", "calibrate")),
        Step(VerifyStage(), ("rollout@", "synthesize")),
        Step(CalibrateStage(), ("verify*", "synthesize")),
        Step(ExportStage(), ("rollout*", "verify*", "calibrate", "synthesize")),
    ),
    loop=Loop(
        body=("rollout", "verify", "calibrate"), after="calibrate",
        max_rounds=lambda cfg: cfg.calibrate.adaptive.max_rounds if cfg.calibrate.adaptive else 0,
        next_round=_adaptive_plan,
        describe=lambda plan: (f"{plan.episodes} more rollouts for {len(plan.needs_more)} environment(s) "
                               "whose label is not certain yet"),
    ),
)
STAGES: list[Stage] = PIPELINE.stages
STAGE_NAMES: list[str] = PIPELINE.names


def get_stage(name: str) -> Stage:
    return PIPELINE.stage(name)


def select(from_: str | None = None, only: list[str] | None = None) -> list[str]:
    return PIPELINE.select(from_, only)
