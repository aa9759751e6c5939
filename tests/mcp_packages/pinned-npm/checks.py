# ruff: noqa: F821  (db, rows, value, EXPECTED: given by the hidden test module these checks go into)
def test_alpha_is_set():
    assert value("SELECT value FROM counters WHERE name = 'alpha'") == EXPECTED["target"]


def test_others_untouched():
    assert rows("SELECT name, value FROM counters WHERE name != 'alpha' ORDER BY name") == [
        {"name": "beta", "value": 7}, {"name": "gamma", "value": 3}]
