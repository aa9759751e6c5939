"""The secrets gate (issue 12, part 6): planted keys (an `sk-...` key, an AWS key pair, a private key block,
a Hugging Face token) in tool outputs, verifier output and environment files never reach exported Parquet
in `redact` mode; `reject` drops the row with reason `secret`; counts per detector land in stats.json's
`secrets` section. Settings (build.json, flow-run parameters, the vLLM log) keep env values and secret
`extra_args` out."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_export_columns import build_export, files

from trajforge.schemas.common import FileSpec, Reject
from trajforge.tasks.redaction.secrets import REDACTED, Scanner, redact_args, redact_settings

OPENAI = "sk-proj-Q8mZt1Rk4VwXy7NbC2dLfG5hJ0pSa3Te"
AWS_ID, AWS_SECRET = "AKIAQ3EXAMPLEZ7KQ2WX", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HF = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----")
PLANTED = [OPENAI, AWS_ID, AWS_SECRET, HF, "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"]
ENV_FILE = (f"OPENAI_API_KEY={OPENAI}\nAWS_ACCESS_KEY_ID={AWS_ID}\nAWS_SECRET_ACCESS_KEY={AWS_SECRET}\n"
            f"HF_TOKEN={HF}\n")


def leaked(out: str) -> list[str]:
    """Planted values found in any exported Parquet file (every column, nested included)."""
    text = "".join(json.dumps(pq.read_table(f).to_pylist(), default=str) for f in Path(out).rglob("*.parquet"))
    return [v for v in PLANTED if v in text or v.replace("/", "\\/") in text]


def test_scanner_finds_each_planted_key():
    text, found = Scanner().redact(ENV_FILE + PEM + "\nthe end")
    assert not [v for v in PLANTED if v in text] and text.endswith("the end")
    assert sorted(found) == ["AWS Access Key", "AWS Secret Key", "Hugging Face Token", "OpenAI-style Key", "Private Key"]
    # ordinary coding-agent output is left alone (no entropy detectors: hashes and ids are data)
    plain = "commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39\nsha256  e3b0c44298fc1c149afbf4c8996fb924\ndisk-usage-report ok"
    assert Scanner().redact(plain) == (plain, [])


@pytest.fixture(scope="module")
def redacted(tmp_path_factory):
    return build_export(tmp_path_factory.mktemp("redact"), n=4,
                        output=lambda i: ENV_FILE if i == 0 else (PEM if i == 1 else "nothing here"),
                        verifier_output=lambda i: f"E   assert token == '{HF}'" if i == 2 else "1 passed",
                        env_files=[FileSpec(path=".env", content=ENV_FILE), FileSpec(path="id_rsa", content=PEM)])


def test_redact_mode_leaves_no_planted_key_in_parquet(redacted):
    _, out, stats, _ = redacted
    assert leaked(out) == []
    rows = {r["rollout_id"]: r for r in pq.read_table(files(out, "trajectories")).to_pylist()}
    assert len(rows) == 4  # nothing dropped in redact mode
    assert "[REDACTED:OpenAI-style Key]" in rows["r0000"]["messages"][3]["content"]
    assert "[REDACTED:Hugging Face Token]" in rows["r0002"]["verifier_output_tail"]
    assert "[REDACTED:Private Key]" in pq.read_table(files(out, "rl")).column("env_spec_json").to_pylist()[0]
    saved = json.loads(Path(out, "stats.json").read_text()) if Path(out, "stats.json").exists() else stats
    s = saved["secrets"]
    assert s["action"] == "redact" and s["rows_redacted"] == 3 and s["rows_rejected"] == 0
    assert s["rl_rows_redacted"] == 2
    assert {"AWS Access Key", "AWS Secret Key", "Hugging Face Token", "OpenAI-style Key",
            "Private Key"} <= set(s["detectors"])


def test_reject_mode_drops_rows_with_reason(tmp_path):
    ctx, out, stats, infos = build_export(tmp_path, {"export.secrets.action": "reject"}, n=4,
                                          output=lambda i: ENV_FILE if i == 0 else "fine",
                                          env_files=[FileSpec(path=".env", content=ENV_FILE)])
    ids = pq.read_table(files(out, "trajectories")).column("rollout_id").to_pylist()
    assert sorted(ids) == ["r0001", "r0002", "r0003"]
    rejects = ctx.store.read_records([str(p) for p in Path(out, "_rejects").glob("*.parquet")], Reject)
    assert [(r.key, r.reason) for r in rejects] == [("r0000", "secret")] and "AWS Access Key" in rejects[0].detail
    assert stats["secrets"]["rows_rejected"] == 1 and stats["secrets"]["rl_rows_rejected"] == 2
    assert not files(out, "rl") and leaked(out) == []


def test_settings_are_redacted_once_for_every_place():
    cfg = {"teacher": {"backend": "vllm", "vllm": {"env": {"HF_TOKEN": HF, "OMP_NUM_THREADS": "2"},
                                                   "extra_args": ["--api-key", "abc123", f"--hf-token={HF}",
                                                                  "--enable-prefix-caching", OPENAI]}},
           "dataset": "d"}
    out = redact_settings(cfg)
    assert out["teacher"]["vllm"]["env"] == {"HF_TOKEN": REDACTED, "OMP_NUM_THREADS": REDACTED}
    assert out["teacher"]["vllm"]["extra_args"][:4] == ["--api-key", REDACTED, f"--hf-token={REDACTED}",
                                                        "--enable-prefix-caching"]
    assert OPENAI not in json.dumps(out) and HF not in json.dumps(out) and cfg["teacher"]["vllm"]["env"]["HF_TOKEN"] == HF
    assert redact_args(["--max-model-len", "4096"]) == ["--max-model-len", "4096"]


def test_flow_parameters_hold_the_redacted_config_and_the_flow_the_real_one():
    from trajforge.tasks.redaction.secrets import real_config, shown_config

    cfg = {"dataset": "d", "teacher": {"vllm": {"env": {"HF_TOKEN": HF}, "extra_args": ["--api-key", OPENAI]}}}
    shown = shown_config(cfg)
    assert HF not in json.dumps(shown) and OPENAI not in json.dumps(shown)
    assert real_config(json.loads(json.dumps(shown))) == cfg  # what Prefect hands the flow back
    assert real_config({"dataset": "other"}) == {"dataset": "other"}


def test_vllm_log_holds_no_secret_argument(tmp_path):
    import sys

    from trajforge.schemas.config import parse_config
    from trajforge.tasks.teachers.vllm_server import TeacherServerError, VLLMServer

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = parse_config({"dataset": "x", "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "vllm", "vllm": {
                            "model": str(tmp_path / "model"), "python": sys.executable, "env": {"HF_TOKEN": HF},
                            "extra_args": ["--api-key", OPENAI, f"--hf-token={HF}", "--max-num-batched-tokens", "512"]}}})
    with pytest.raises(TeacherServerError):  # an interpreter without vLLM: exits at once, after the log line
        with VLLMServer(cfg.teacher, tmp_path / "vllm.log"):
            pass
    log = (tmp_path / "vllm.log").read_text()
    assert "vllm.entrypoints.openai.api_server" in log and "--max-num-batched-tokens 512" in log
    assert OPENAI not in log and HF not in log and f"--api-key {REDACTED}" in log


def test_build_json_stores_env_values_and_secret_args_redacted(tmp_path):
    from trajforge.flows.build import DEFAULT_PIPELINE, _Build
    from trajforge.schemas.config import parse_config

    cfg = parse_config({"dataset": "x", "runs": str(tmp_path), "synthesize": {"families": [{"name": "log_report"}]},
                        "teacher": {"backend": "vllm", "vllm": {"env": {"HF_TOKEN": HF},
                                                                 "extra_args": ["--api-key", OPENAI, "--seed", "3"]}}})
    _Build(DEFAULT_PIPELINE, cfg, "b1", ["rollout"], set())
    text = (tmp_path / "x" / "b1" / "build.json").read_text()
    stored = json.loads(text)["config"]["teacher"]["vllm"]
    assert HF not in text and OPENAI not in text
    assert stored["env"] == {"HF_TOKEN": REDACTED} and stored["extra_args"] == ["--api-key", REDACTED, "--seed", "3"]


DEMO_ARGS = ["--return-tokens-as-token-ids", "--max-num-batched-tokens", "512"]


def _demo(**vllm):
    from trajforge.schemas.config import load_config

    cfg = load_config(Path(__file__).parents[1] / "configs" / "demo.yaml",
                      {f"teacher.vllm.{k}": v for k, v in {"extra_args": DEMO_ARGS, **vllm}.items()})
    return cfg


def test_redaction_keeps_non_secret_flags_and_the_rollout_fingerprint():
    from trajforge.flows.build import config_hash
    from trajforge.schemas.config import parse_config
    from trajforge.tasks.pipeline import PIPELINE

    cfg = _demo()
    shown = redact_settings(cfg.model_dump(mode="json"))
    assert shown["teacher"]["vllm"]["extra_args"] == DEMO_ARGS and shown == cfg.model_dump(mode="json")
    back = parse_config(shown, "build.json", stored=True)
    rollout = PIPELINE.stage("rollout")
    assert json.dumps(rollout.config_section(back), sort_keys=True, default=str) == \
        json.dumps(rollout.config_section(cfg), sort_keys=True, default=str)
    assert config_hash(back) == config_hash(cfg)
    assert redact_args(["--api-key", "--seed", "3", "--token", "t0", "--db-password=pw", "--tokenizer", "x",
                        "--key-file", "k"]) == ["--api-key", "--seed", "3", "--token", REDACTED,
                                               f"--db-password={REDACTED}", "--tokenizer", "x", "--key-file", "k"]


def test_a_redacted_stored_config_needs_the_real_one_to_rerun():
    from trajforge.flows.build import config_hash, stored_build_config
    from trajforge.schemas.config import ConfigError

    real = _demo(extra_args=[*DEMO_ARGS, "--api-key", OPENAI])
    stored = redact_settings(real.model_dump(mode="json"))
    with pytest.raises(ConfigError, match="--config FILE"):
        stored_build_config(stored, "b1/build.json")
    got = stored_build_config(stored, "b1/build.json", real.model_copy(update={"runs": "elsewhere"}))
    assert OPENAI in got.teacher.vllm.extra_args and config_hash(got.model_copy(update={"runs": real.runs})) == \
        config_hash(real)
    with pytest.raises(ConfigError, match="not the config of b1/build.json"):
        stored_build_config(stored, "b1/build.json", _demo(extra_args=["--api-key", OPENAI]))
    plain = _demo().model_dump(mode="json")  # nothing hidden: the stored config as it is
    assert stored_build_config(plain, "b1/build.json") == _demo()


# -- review fixes: hack evidence, JSON-escaped keywords, rl_tokens of redacted rollouts, the fingerprint ---------
def test_hack_flag_command_and_detail_are_scanned():
    import pyarrow as pa

    flags = pa.array([[{"kind": "k", "command": f"curl -H 'Authorization: Bearer {HF}' x", "detail": OPENAI}]],
                     pa.list_(pa.struct([("kind", pa.string()), ("command", pa.string()), ("detail", pa.string())])))
    col, hit = Scanner().redact_column(flags)
    assert HF not in str(col.to_pylist()) and OPENAI not in str(col.to_pylist())
    assert hit == {0: {"Hugging Face Token", "OpenAI-style Key"}}


def test_json_escaped_keyword_secret_is_found_decoded():
    import pyarrow as pa

    doc = json.dumps({"files": [{"path": "settings.py", "content": 'db_password = "Sup3rS3cretValue"\n'}]})
    col, hit = Scanner().redact_json_column(pa.array([doc, '{"a": "plain"}']))
    assert "Sup3rS3cretValue" not in col[0].as_py() and json.loads(col[0].as_py())["files"][0]["path"] == "settings.py"
    assert col[1].as_py() == '{"a": "plain"}' and hit == {0: {"Secret Keyword"}}


def test_rl_tokens_leaves_out_redacted_rollouts_and_rl_spec_is_scanned_decoded(tmp_path):
    _, out, stats, _ = build_export(tmp_path, {"export.configs": ["rl", "rl_tokens"]}, n=4,
                                    output=lambda i: ENV_FILE if i == 0 else "fine",
                                    env_files=[FileSpec(path="settings.py", content='db_password = "Sup3rS3cretValue"\n')])
    assert pq.read_table(files(out, "rl_tokens")).column("rollout_id").to_pylist() == ["r0001"]
    assert stats["secrets"]["rl_tokens_rows_dropped"] == 1
    specs = pq.read_table(files(out, "rl")).column("env_spec_json").to_pylist()
    assert specs and all("Sup3rS3cretValue" not in s and "[REDACTED:Secret Keyword]" in s for s in specs)


def test_export_fingerprint_holds_file_bytes_and_the_scanner_version():
    from trajforge.schemas.config import load_config
    from trajforge.tasks.export import ExportStage, scanner_version

    root = Path(__file__).resolve().parent.parent
    cfg = load_config(root / "configs/replay.yaml", {"runs": "/tmp/x", "dataset": "d"})
    section = ExportStage().config_section(cfg)
    assert section["scanner"] == scanner_version() and "detect-secrets" in section["scanner"]
    other = load_config(root / "configs/replay.yaml", {"runs": "/tmp/x", "dataset": "d",
                                                       "export.parquet.file_bytes": 1 << 20})
    assert ExportStage().config_section(other) != section  # the shard plan depends on it
    layout = load_config(root / "configs/replay.yaml", {"runs": "/tmp/x", "dataset": "d",
                                                        "export.parquet.row_group_bytes": 1 << 20})
    assert ExportStage().config_section(layout) == section  # row-group layout stays operational


def test_cli_stage_of_a_build_with_redacted_secrets_asks_for_its_config(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from trajforge.flows.build import DEFAULT_PIPELINE, _Build
    from trajforge.flows.cli import app

    real = _demo(extra_args=[*DEMO_ARGS, "--api-key", OPENAI]).model_copy(update={"runs": str(tmp_path / "runs")})
    _Build(DEFAULT_PIPELINE, real, "b1", ["rollout"], set())
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(_demo().model_dump(mode="json")))
    for extra, want in (([], "pass the build's real config with --config FILE"),
                        (["--config", str(other)], "--config FILE: not the config of")):
        r = CliRunner().invoke(app, ["stage", "verify", "--build", "b1", "--runs", str(tmp_path / "runs"), *extra],
                               env={"COLUMNS": "200"})  # in-process: it stops at the config check
        assert r.exit_code != 0 and want in " ".join(r.output.split()), r.output
