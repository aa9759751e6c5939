"""Environments as a Hub artifact: a Harbor export of an environment imports back to its env id."""

from __future__ import annotations

from trajforge.tasks.envs.families import get_family
from trajforge.tasks.envs.formats import export_harbor, import_task

# -- pure logic (no Docker) ------------------------------------------------------------------------------


def test_a_harbor_export_imports_back_to_its_env_id_unless_edited(tmp_path):
    env = get_family("log_report").generate(1, 0)
    folder = export_harbor(env, tmp_path / "a")
    assert import_task(folder).env_id == env.env_id
    bare = export_harbor(env.model_copy(update={"solution": [], "oracle": "absent"}), tmp_path / "b")
    back = import_task(bare)
    assert back.env_id == env.env_id and back.oracle == "absent" and not (bare / "solution").exists()
    (folder / "tests" / "extra.txt").write_text("x\n")  # an edited folder is another environment
    assert import_task(folder).env_id.startswith(f"harbor-{env.env_id}-")
    toml = (bare / "task.toml").read_text().replace("timeout_sec = 600.0", "timeout_sec = 60.0")
    (bare / "task.toml").write_text(toml)  # task.toml counts too (except the digest itself)
    assert import_task(bare).env_id != env.env_id

