from typing import get_args

import pytest

from trajforge.schemas.config import CalibrateConfig
from trajforge.tasks.calibrate import difficulty_label, wilson_interval


def test_wilson_matches_known_values():
    lo, hi = wilson_interval(5, 10)  # textbook: 0.2366, 0.7634
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_interval_narrows_with_more_attempts():
    w = [wilson_interval(n // 2, n) for n in (4, 16, 64)]
    widths = [hi - lo for lo, hi in w]
    assert widths[0] > widths[1] > widths[2]


NEW, OLD = CalibrateConfig(), CalibrateConfig(unsolved_below=0.0, trivial=0.9)


@pytest.mark.parametrize("passes,n,label", [(0, 4, "unsolved"), (4, 4, "trivial"), (3, 4, "easy"),
                                            (2, 4, "medium"), (1, 4, "hard"), (0, 0, "unlabelled"),
                                            (1, 100, "unsolved"), (2, 100, "hard"), (98, 100, "trivial"),
                                            (97, 100, "easy"), (9, 10, "easy")])
def test_labels(passes, n, label):
    """Issue 14: `unsolved` is p < unsolved_below (0.02), `trivial` symmetric: p >= 1 - 0.02."""
    assert NEW.trivial == 0.98
    assert difficulty_label(passes, n, NEW) == label


@pytest.mark.parametrize("passes,n,label", [(1, 100, "hard"), (0, 100, "unsolved"), (9, 10, "trivial")])
def test_the_definitions_before_issue_14_are_a_config(passes, n, label):
    assert difficulty_label(passes, n, OLD) == label


def test_unverified_until_a_pass_proves_the_environment_solvable():
    assert difficulty_label(0, 8, NEW, solvable=False) == "unverified"
    assert difficulty_label(1, 8, NEW, solvable=False) == "hard"
    assert difficulty_label(0, 0, NEW, solvable=False) == "unlabelled"
    with pytest.raises(ValueError, match="unsolved_below < medium"):
        CalibrateConfig(unsolved_below=0.4)


def test_every_label_has_one_printable_definition():
    from trajforge.schemas.calibration import Label
    from trajforge.schemas.value_sets import field_values
    from trajforge.tasks.calibrate import label_definitions

    text = label_definitions(CalibrateConfig(unsolved_below=0.05))
    assert set(get_args(Label)) | {"certain", "pooled"} == set(text)
    assert set(field_values("Calibration.label")) == set(field_values("Calibration.pooled_label")) == set(get_args(Label))
    assert "p < 0.05" in text["unsolved"] and "p >= 0.95" in text["trivial"] and "{" not in "".join(text.values())


def test_gain_rule_spends_rollouts_where_they_buy_accuracy():
    from trajforge.tasks.calibrate import label_gain

    pop = [(0, 8)] * 30 + [(8, 8)] * 10 + [(4, 8)] * 10 + [(2, 8)] * 10
    few, boundary, more_boundary, settled = label_gain([(1, 4), (9, 30), (12, 40), (0, 64)] + pop,
                                                       CalibrateConfig(), batch=2)[:4]
    assert few > boundary > more_boundary > 0  # each settled rollout buys less on a boundary
    assert settled < 1e-3 < few  # 0 of 64 among many never-solved environments: p < 0.02 is settled
    # the same counts give the same gain (computed once per distinct count)
    g = label_gain([(2, 4), (2, 4), (3, 4)], CalibrateConfig(), batch=2)
    assert g[0] == g[1] != g[2]


def _adaptive(**kw) -> CalibrateConfig:
    from trajforge.schemas.config import AdaptiveConfig

    return CalibrateConfig(adaptive=AdaptiveConfig(**kw))


def test_zero_of_n_stops_once_the_posterior_says_below_unsolved_below():
    """0 of n is certain `unsolved` once P(p < 0.02 | 0 of n) reaches `confidence`, and then gets no more
    rollouts whatever the rule (here one that would want 0.999)."""
    from trajforge.tasks.calibrate import label_confidence, next_rollouts

    pop = [(0, 24)] * 300 + [(12, 24)] * 100 + [(24, 24)] * 50
    counts = [(0, 24), (0, 2)] + pop
    conf = label_confidence(counts, NEW)
    assert conf[0] >= NEW.confidence > conf[1], conf[:2]
    more = next_rollouts(counts, [24, 2] + [24] * len(pop), _adaptive(rule="posterior", target=0.999, max_samples=64))
    assert 0 not in more and more[1] == 2
    small = label_confidence([(0, 4), (2, 4), (4, 4)], NEW)  # three environments: ~uniform prior, nothing certain
    assert max(small) < NEW.confidence


def test_a_global_budget_goes_to_the_highest_gains_first():
    from trajforge.tasks.calibrate import label_gain, next_rollouts

    counts = [(1, 4), (2, 4), (0, 4), (4, 4), (0, 0), (3, 4)] + [(0, 8)] * 20 + [(8, 8)] * 10
    samples = [4] * 6 + [8] * 30
    free = next_rollouts(counts, samples, _adaptive(batch=2, max_samples=16, min_gain=0.001))
    capped = next_rollouts(counts, samples, _adaptive(batch=2, max_samples=16, min_gain=0.001, budget=10), spent=4)
    assert sum(capped.values()) == 6 and set(capped) < set(free), "spent 4 of 10: 6 are left"
    labelled = [i for i, c in enumerate(counts) if c[1]]
    gain = dict(zip(labelled, label_gain([counts[i] for i in labelled], CalibrateConfig(), batch=2)))
    by_gain = sorted((i for i in free if i in gain), key=lambda i: -gain[i])
    assert list(capped) == [4] + by_gain[:2], "the unlabelled pair first, then the highest expected gains"
    split = next_rollouts(counts, samples, _adaptive(batch=2, max_samples=16, min_gain=0.001, budget=12),
                          rounds_left=3)
    assert sum(split.values()) == 4, "a round takes its share of what is left, later rounds see the answers"
    assert next_rollouts(counts, samples, _adaptive(budget=10), spent=10) == {}


def test_pooled_difficulty_puts_every_teacher_on_the_strongest_ones_scale():
    import math
    import random

    from trajforge.tasks.difficulty import fit_pooled

    rng = random.Random(3)
    counts, truth = {}, {}
    for i in range(150):  # teacher `strong` solves at rate p, `weak` at sigmoid(logit(p) - 2)
        p = rng.choice([0.0, 1.0, rng.random()])
        weak = p / (p + (1 - p) * math.e ** 2)
        counts[f"e{i}"] = {"strong": (sum(rng.random() < p for _ in range(8)), 8),
                           "weak": (sum(rng.random() < weak for _ in range(8)), 8)}
        truth[f"e{i}"] = p
    fit = fit_pooled(counts, CalibrateConfig())
    assert fit.reference == "strong" and fit.ability["strong"] == 0 and -3 < fit.ability["weak"] < -1, fit.ability
    only_weak = {e: {"weak": c["weak"]} for e, c in counts.items()}
    only_weak["e0"]["strong"] = counts["e0"]["strong"]
    assert fit_pooled(only_weak, CalibrateConfig(pooled_reference="weak")).reference == "weak"
    one = fit_pooled({e: {"weak": c["weak"]} for e, c in counts.items()}, CalibrateConfig())
    assert all(one.rate[e] == pytest.approx(c["weak"][0] / 8, abs=1e-9) for e, c in counts.items()), \
        "one teacher: the pooled rate is passes / attempts"
    mixed = next(e for e, c in counts.items() if 0 < c["weak"][0] < 8)
    assert fit.rate[mixed] > one.rate[mixed], "on the strong teacher's scale the same passes mean an easier task"
    assert sum(fit.band_mass[mixed].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="calibrate.pooled_reference: 'nobody'"):
        fit_pooled(counts, CalibrateConfig(pooled_reference="nobody"))


def test_the_stage_labels_unverified_and_pools_teachers_through_its_gate(tmp_path):
    """Through the engine (gate included): an environment without a reference solution that no teacher
    passed is `unverified` for every teacher; once one teacher passes it, the others' 0 of n is
    `unsolved`; the pooled columns are the environment's, on the strongest teacher's scale."""
    import posixpath

    from helpers import small_config

    from trajforge.schemas.build import BuildRecord
    from trajforge.schemas.calibration import Calibration, RoundPlan
    from trajforge.schemas.config import parse_config
    from trajforge.schemas.environment import EnvSpec
    from trajforge.schemas.verdict import Verdict
    from trajforge.tasks.calibrate import CalibrateStage
    from trajforge.tasks.engine import Manifest, StageContext, commit, execute_shard, prepare
    from trajforge.tasks.envs.families import get_family

    cfg = parse_config(small_config(tmp_path / "runs", dataset="cal", **{
        "rollout.samples_per_env": 4, "calibrate.adaptive": {"batch": 2, "max_samples": 8, "budget": 2}}))
    ctx = StageContext.create(cfg, "b1")
    ctx.store.write_build(BuildRecord(build_id="b1", dataset=cfg.dataset, created_at=""))
    names = ("log_report", "file_search", "csv_convert")
    envs = [get_family(n).generate(1, 0) for n in names]
    envs = [e.model_copy(update={"oracle": "absent"}) if e.family != "csv_convert" else e for e in envs]
    wins = {("log_report", "strong"): 4, ("log_report", "weak"): 0, ("file_search", "strong"): 0,
            ("file_search", "weak"): 0, ("csv_convert", "strong"): 3, ("csv_convert", "weak"): 1}
    verdicts = [Verdict(rollout_id=f"{e.env_id}-{t}-{k}", env_id=e.env_id, teacher=t, sample=k, status="ok",
                        verified=True, passed=k < wins[(e.family, t)], tests_passed=k < wins[(e.family, t)])
                for e in envs for t in ("strong", "weak") for k in range(4)]
    root = ctx.store.root
    ctx.store.write_records(posixpath.join(root, "up", "envs.parquet"), EnvSpec, envs)
    ctx.store.write_records(posixpath.join(root, "up", "verdicts.parquet"), Verdict, verdicts)
    up = {s: Manifest(stage=s, fingerprint="up", build_id="b0", dir="", parts=[posixpath.join(root, "up", f)],
                      rows=0, rejects=0, reject_reasons={}, stats={}, components={}, gate={}, created_at="")
          for s, f in (("synthesize", "envs.parquet"), ("verify", "verdicts.parquet"))}
    stage = CalibrateStage()
    plan = prepare(stage, ctx, up)
    for s in plan.pending:
        execute_shard(stage, ctx, plan.dir, s, up)
    m = commit(stage, ctx, plan, up)
    rows = {(r.family, r.teacher): r for r in ctx.store.read_records(m.parts, Calibration)}
    label = {k: r.label for k, r in rows.items()}
    assert label == {("log_report", "strong"): "trivial", ("log_report", "weak"): "unsolved",
                     ("file_search", "strong"): "unverified", ("file_search", "weak"): "unverified",
                     ("csv_convert", "strong"): "easy", ("csv_convert", "weak"): "hard"}, label
    assert not rows[("file_search", "weak")].certain and 0 < rows[("file_search", "weak")].label_confidence <= 1
    for fam in names:
        a, b = rows[(fam, "strong")], rows[(fam, "weak")]
        assert (a.pooled_label, a.pooled_solve_rate, a.pooled_teacher) == (b.pooled_label, b.pooled_solve_rate, "strong")
    assert rows[("file_search", "weak")].pooled_label == "unverified"
    assert rows[("csv_convert", "weak")].pooled_solve_rate >= 0.5, "weak's pass counts as evidence on strong's scale"
    assert m.stats["pooled"]["reference"] == "strong" and m.stats["pooled"]["ability"]["weak"] < 0
    assert RoundPlan.of(m.stats).episodes == 2, "the budget (2) is one batch: the highest expected gain gets it"
