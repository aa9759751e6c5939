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


@pytest.mark.parametrize("passes,n,label", [(0, 4, "unsolved"), (4, 4, "trivial"), (3, 4, "easy"),
                                            (2, 4, "medium"), (1, 4, "hard"), (0, 0, "unlabelled")])
def test_labels(passes, n, label):
    assert difficulty_label(passes, n, CalibrateConfig()) == label


def test_gain_rule_spends_rollouts_where_they_buy_accuracy():
    from trajforge.schemas.config import CalibrateConfig
    from trajforge.tasks.calibrate import label_gain

    pop = [(0, 8)] * 30 + [(8, 8)] * 10 + [(4, 8)] * 10 + [(2, 8)] * 10
    few, boundary, more_boundary, sure = label_gain([(2, 4), (9, 30), (12, 40), (20, 20)] + pop,
                                                    CalibrateConfig(), batch=2)[:4]
    assert few > boundary > more_boundary > 0  # each settled rollout buys less on a boundary
    assert sure < 1e-3 < few
    # the same counts give the same gain (computed once per distinct count)
    g = label_gain([(2, 4), (2, 4), (3, 4)], CalibrateConfig(), batch=2)
    assert g[0] == g[1] != g[2]
