"""Every family, every level, in real Docker, through the validator: the image builds, the reference solution
passes, doing nothing fails, nothing of the tests or solution is in the image, the tests are deterministic, and
the answer of one seed fails the tests of another. Each family's levels run on three different seeds (level k on
seed k-1), so every family is validated on three seeds; the seeds' generation itself (determinism, distinct
instances) is checked without Docker below. One validation per level, not three: each builds its own image."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from trajforge.schemas.config import SandboxConfig, SynthesizeConfig
from trajforge.tasks.envs.catalogue import sibling_of
from trajforge.tasks.envs.families import FAMILIES, get_family
from trajforge.tasks.envs.validator import validate_env


def validate_generated(docker_client, cases: list[tuple[str, int, int]]) -> list:
    """The validator's verdict on the generated environment of each (family, level, seed), three at a
    time, each with its sibling for the instance-specificity check."""
    s, sandbox = SynthesizeConfig(families=[{"name": cases[0][0]}]), SandboxConfig()

    def one(case: tuple[str, int, int]):
        env = get_family(case[0]).generate(case[1], case[2])
        return validate_env(docker_client, env, sandbox, sandbox.base_image, s.image_aliases, 60, 60,
                            sibling=sibling_of)

    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(one, cases))


# terminal families here; the tool families' Docker checks are in tests/test_tool_families.py (one seed)
TERMINAL = [f for f in sorted(FAMILIES) if FAMILIES[f].kind == "terminal"]


def level_seeds(family: str) -> list[tuple[int, int]]:
    """(level, seed) of each of the family's levels: the seeds 0, 1, 2, ... in turn."""
    return [(lvl, i % 3) for i, lvl in enumerate(FAMILIES[family].levels)]


def test_at_least_eight_families_with_three_levels():
    assert len(FAMILIES) >= 8 and all(len(f.levels) >= 3 for f in FAMILIES.values())


def test_generation_is_deterministic_and_seeded():
    for name, fam in FAMILIES.items():
        a, b, c = fam.generate(1, 0), fam.generate(1, 0), fam.generate(1, 1)
        assert a == b, name
        assert a.env_id != c.env_id and a.tests != c.tests, name
        assert all("test_" not in f.path for f in a.files), "hidden tests must not be in the image"
        assert len(a.instruction) > 80 and a.knobs_json != "{}", name


def test_levels_turn_real_knobs():
    for name, fam in FAMILIES.items():
        knobs = [fam.generate(lvl, 0).knobs_json for lvl in fam.levels]
        assert len(set(knobs)) == len(knobs), name


def test_unknown_family_and_level():
    with pytest.raises(KeyError, match="known: "):
        get_family("nope")
    with pytest.raises(ValueError, match="levels"):
        get_family("log_report").generate(9, 0)


@pytest.mark.docker
@pytest.mark.parametrize("family", TERMINAL)
def test_every_check_passes_at_every_level_on_three_seeds(docker_client, family):
    cases = level_seeds(family)
    assert len({seed for _, seed in cases}) >= 3, cases
    results = validate_generated(docker_client, [(family, lvl, seed) for lvl, seed in cases])
    for case, v in zip(cases, results):
        assert v.ok, (case, v.reject)
        assert v.checks == {"image": "pass", "noop_fails": "pass", "no_leak": "pass", "solution_passes": "pass",
                            "deterministic": "pass", "instance_specific": "pass", "test_audit": "pass"}, (case, v.checks)


@pytest.mark.docker
@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if FAMILIES[f].replay_invariant))
def test_replay_invariant_solutions_solve_any_instance(docker_client, family):
    """What the hard-coded-answer check relies on: the reference commands of one instance solve another."""
    from trajforge.tasks.envs.images import ensure_image
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS, run_hidden_tests
    from trajforge.tasks.sandbox import Sandbox

    env = get_family(family).generate(2, 0)
    sib = sibling_of(env, replay=True)
    sib.image, _ = ensure_image(docker_client, "trajforge/base:latest", sib)
    with Sandbox(docker_client, sib.image, SandboxConfig(), workdir=sib.workdir, cap_add=VERIFIER_CAPS) as sb:
        for cmd in env.solution:
            assert sb.exec(cmd, 60).exit_code == 0
        assert run_hidden_tests(sb, sib, 60).passed
