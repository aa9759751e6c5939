"""The `trajforge` distribution as `make setup` builds it (pip, build isolation: the newest setuptools): no
"importable package absent from `packages`" warning, and the data files (report templates, expectation suites,
chat templates, configs, deploy scripts) installed where the code reads them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ["trajforge/flows/report/templates/index.html.j2", "trajforge/flows/report/static/report.css",
        "trajforge/expectations/suites/rollout.json", "trajforge/configs/demo.yaml",
        "trajforge/deploy/images/build-base.sh", "trajforge/deploy/images/base/Dockerfile",
        "trajforge/deploy/images/tools/requirements.txt", "trajforge/deploy/automations/build-failed-webhook.yaml",
        "trajforge/deploy/teacher/setup-vllm.sh", "trajforge/deploy/teacher/convert_smollm2.py"]


def test_the_wheel_builds_without_a_package_warning_and_installs_its_data(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "absent from the `packages` configuration" not in out and "Package would be ignored" not in out, out
    [wheel] = (tmp_path / "dist").glob("trajforge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    chat = [n for n in names if n.startswith("trajforge/tasks/teachers/chat_templates/") and n.endswith(".jinja")]
    assert chat and not [d for d in DATA if d not in names], sorted(names)
    site = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all((site / d).is_file() for d in [*DATA, *chat])
