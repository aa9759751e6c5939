"""Re-verification of trajectories users already have (`trajforge verify --trajectories FILE --envs PATH`).

Each recorded trajectory (JSONL or Parquet; see tasks/teachers/recorded.py) is replayed command by command in
a fresh sandbox of its environment (no teacher), then verified exactly like the `verify` stage:
hidden tests, hack detectors, sibling replay, the contrastive check, quality signals. Environments
come from `--envs` (task folders, folders of them, or a JSONL of specs from `envs import --out`), a
task-folder path in the row itself, or a procedural id (`family-l<L>-s<S>`). A trajectory with an
unknown environment, a command list that is not a list, or a test run that hangs or prints garbage
is a reject with its reason; the rest of the batch is verified. Nothing is written under the config's
`runs` (a re-verification is not a build): only the caller's `--out` folder.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..schemas.common import Reject
from ..schemas.config import BuildConfig, parse_config
from ..schemas.environment import EnvSpec
from ..schemas.verdict import Verdict
from ..tasks.agent.driver import run_episodes
from ..tasks.engine import StageContext
from ..tasks.engine.store import RunStore
from ..tasks.envs.catalogue import EnvNotFound, load_paths, resolve
from ..tasks.envs.formats import TaskFormatError
from ..tasks.envs.images import ImageBuildError, ensure_image
from ..tasks.envs.validator import profile_reference
from ..tasks.sandbox import docker_client
from ..tasks.teachers import ReplayTeacher
from ..tasks.teachers.recorded import Recorded, load_recorded
from ..tasks.verify import verify_rollouts


def _resolve(rec: Recorded, envs: dict[str, EnvSpec]) -> EnvSpec | None:
    try:
        found = resolve(rec.env_id, known=envs)
    except (EnvNotFound, TaskFormatError):
        return None
    return found[0] if len(found) == 1 else None


def _limits_for(config: BuildConfig, records: list[Recorded]) -> BuildConfig:
    """Limits follow the recording: every recorded command is replayed (plus the `submit` turn),
    whatever `rollout.max_turns` says; the episode budget grows in proportion."""
    need = max((max(len(r.commands), len(r.tool_commands or [])) for r in records), default=0) + 1
    rollout = config.rollout
    if need <= rollout.max_turns:
        return config
    longer = rollout.model_copy(update={"max_turns": need,
                                        "episode_timeout_s": rollout.episode_timeout_s * need / rollout.max_turns})
    return config.model_copy(update={"rollout": longer})


def reverify(trajectories: str, env_paths: list[str], config: BuildConfig | None = None
             ) -> tuple[list[Verdict], list[Reject], dict[str, Any]]:
    """Verdicts (rollout_id = trajectory_id) and rejects for every row of `trajectories`."""
    config = config or parse_config({"dataset": "reverify", "synthesize": {"families": [{"name": "log_report"}]}})
    records, rejects = load_recorded(trajectories)
    envs, env_rejects = load_paths(env_paths)
    rejects += env_rejects
    client = docker_client(sandbox=config.sandbox)
    groups: dict[str, list[Recorded]] = defaultdict(list)
    used: dict[str, EnvSpec] = {}
    for rec in records:
        env = _resolve(rec, envs)
        if env is None:
            rejects.append(Reject(key=rec.trajectory_id, reason="unknown_env", detail=rec.env_id))
            continue
        if env.env_id not in used:
            try:
                env.image, _ = ensure_image(client, config.sandbox.base_image, env, config.synthesize.image_aliases,
                                            limits=config.sandbox)
            except ImageBuildError as err:
                rejects.append(Reject(key=rec.trajectory_id, reason="image_build_failed", detail=err.log_tail[-800:]))
                continue
            if env.tests_run_agent_code == "unknown":  # not validated: what the reference solution changes (the
                # yardstick of "unexpected"), what its test run reports, whether the tests run agent code
                profile_reference(client, env, config.sandbox, config.synthesize.solution_timeout_s,
                                  config.verify.test_timeout_s)
            used[env.env_id] = env
        groups[env.env_id].append(rec)
    config = _limits_for(config, [r for rs in groups.values() for r in rs])
    # no build, so no run store: the context's store lives in memory (the caller writes the results to
    # `--out`); a store under the config's `runs` would leave a dataset `reverify` there
    ctx = StageContext(config, "reverify", RunStore("memory://trajforge-reverify", config.dataset))
    teacher = ReplayTeacher(config.teacher, {e: [r.commands for r in rs] for e, rs in groups.items()},
                            {e: [r.commands if r.tool_commands is None else r.tool_commands for r in rs]
                             for e, rs in groups.items()})
    ids = {(e, k): r.trajectory_id for e, rs in groups.items() for k, r in enumerate(rs)}
    episodes = list(ids)
    verdicts: list[Verdict] = []
    stats: dict[str, Any] = {"trajectories": len(records) + sum(r.reason in ("bad_json", "no_env", "bad_commands",
                                                                           "bad_messages", "no_commands")
                                                              for r in rejects)}
    if episodes:
        result = run_episodes(ctx, used, episodes, teacher=teacher)
        for r in result.rows:  # the user's ids, not ours
            r.rollout_id = ids[(r.env_id, r.sample)]
            r.teacher = groups[r.env_id][r.sample].teacher
        verified = verify_rollouts(ctx, used, result.rows)
        verdicts, rejects = verified.rows, rejects + verified.rejects
        stats.update(verified.stats)
    stats["rejects"] = {}
    for r in rejects:
        stats["rejects"][r.reason] = stats["rejects"].get(r.reason, 0) + 1
    return verdicts, rejects, stats
