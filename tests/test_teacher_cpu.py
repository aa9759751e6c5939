"""The embedded teacher adapts to the CPU (issue 14): the choice of dtype, threads and KV cache
(`cpu_profile.choose`, pure), what the vLLM server is started with, what `trajforge doctor` prints,
and which of it the rollout fingerprint counts (the resolved dtype: yes; threads and KV cache: no).
No vLLM is started here (tests/test_vllm_e2e.py does that once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_cli

from trajforge.schemas.config import parse_config
from trajforge.tasks.engine import StageContext, fingerprint, fingerprint_components
from trajforge.tasks.rollout import RolloutStage
from trajforge.tasks.teachers.cpu_profile import GIB, Machine, choose, parse_flags, this_machine, throughput_line
from trajforge.tasks.teachers.vllm import VLLMServerConfig
from trajforge.tasks.teachers.vllm_server import VLLMServer

AVX = frozenset("fpu sse sse2 avx".split())
AVX512 = AVX | {"avx2", "avx512f"}


def machine(flags=AVX, cores=(0, 1), physical=None, mem_gib=16.0) -> Machine:
    return Machine(frozenset(flags), tuple(cores), tuple(physical or cores), int(mem_gib * GIB))


def cfg(teacher_vllm: dict | None = None, runs: str = "./runs", **teacher):
    return parse_config({"dataset": "d", "runs": runs, "synthesize": {"families": [{"name": "log_report"}]},
                         "teacher": {"backend": "vllm", "model": "smollm2", **teacher,
                                     "vllm": {"model": "embedded:smollm2-135m-instruct", **(teacher_vllm or {})}}})


@pytest.mark.parametrize("flags,dtype", [
    (AVX, "float32"),
    (AVX512, "float32"),  # AVX-512 without bf16 instructions: bf16 is converted, not fast
    (AVX512 | {"avx512_bf16"}, "bfloat16"),
    (AVX512 | {"amx_bf16"}, "bfloat16"),
])
def test_auto_dtype_follows_the_fast_bf16_path(flags, dtype):
    c = choose(machine(flags), VLLMServerConfig(), {})
    assert c.dtype == dtype
    assert ("has avx512_bf16" in c.reasons["dtype"] or "has amx_bf16" in c.reasons["dtype"]) == (dtype == "bfloat16")


def test_explicit_settings_are_kept():
    v = VLLMServerConfig(dtype="bfloat16", kv_cache_gib=2.5, enforce_eager=False)
    c = choose(machine(AVX), v, {"OMP_NUM_THREADS": "2"})
    assert (c.dtype, c.kv_cache_gib, c.threads, c.bind, c.env(), c.eager) == ("bfloat16", 2.5, None, None, {}, False)
    assert c.reasons == {"dtype": "set in teacher.vllm.dtype", "threads": "OMP_NUM_THREADS=2 set",
                         "kv_cache": "set in teacher.vllm.kv_cache_gib"}
    assert choose(machine(), VLLMServerConfig(), {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}).threads is None
    left = choose(machine(), VLLMServerConfig(kv_cache_gib=None), {})  # null: vLLM's own default
    assert left.kv_cache_gib is None and "left to vLLM" in left.reasons["kv_cache"]
    assert choose(machine(), VLLMServerConfig(), {"VLLM_CPU_KVCACHE_SPACE": "3"}).kv_cache_gib is None


def test_eager_mode_without_avx2_unless_set():
    """Without AVX2 the server starts eager (torch.compile's CPU kernels failed to build under the AVX-only
    emulation); with AVX2, or when the user set `enforce_eager`, nothing is forced."""
    bare = choose(machine(AVX), VLLMServerConfig(), {})
    assert bare.eager and "no AVX2" in bare.reasons["eager"] and bare.line().count("eager") >= 1
    assert bare.env()["TORCH_COMPILE_DISABLE"] == "1"  # vLLM's compiled sampler ops too (gather_logprobs)
    assert "TORCH_COMPILE_DISABLE" not in choose(machine(AVX512), VLLMServerConfig(), {}).env()
    assert not choose(machine(AVX512), VLLMServerConfig(), {}).eager
    assert not choose(machine(AVX), VLLMServerConfig(enforce_eager=False), {}).eager


def test_the_choice_survives_the_builds_config_round_trip():
    """The flow serializes the config and parses it again (Prefect parameters, Dask workers): every field
    is then "set". The automatic KV cache and eager mode must still apply to a config that never named
    them (they once keyed on `model_fields_set`, so a real build never got them), and explicit values
    must still win after the trip."""
    root = {"dataset": "d", "synthesize": {"families": [{"name": "log_report"}]},
            "teacher": {"backend": "vllm", "model": "m", "vllm": {"max_model_len": 2048}}}
    cfg = parse_config(root)
    again = parse_config(cfg.model_dump(mode="json"))
    for v in (cfg.teacher.vllm, again.teacher.vllm):
        c = choose(machine(AVX, mem_gib=10.0), v, {})
        assert c.eager and c.kv_cache_gib == 1.5 and "15%" in c.reasons["kv_cache"]
    root["teacher"]["vllm"].update(kv_cache_gib=2.0, enforce_eager=False)
    v = parse_config(parse_config(root).model_dump(mode="json")).teacher.vllm
    c = choose(machine(AVX, mem_gib=10.0), v, {})
    assert (c.eager, c.kv_cache_gib) == (False, 2.0)
    with pytest.raises(ValueError, match="kv_cache_gib"):
        VLLMServerConfig(kv_cache_gib=-1)


def test_a_gpu_server_is_left_to_vllm():
    c = choose(machine(AVX), VLLMServerConfig(gpu_memory_utilization=0.9), {})
    assert (c.cpu, c.dtype, c.threads, c.kv_cache_gib, c.env()) == (False, "auto", None, None, {})


@pytest.mark.parametrize("cores,physical,threads,bind", [
    ((0,), None, 1, "0"),                       # one core: the engine shares it
    ((0, 1), None, 1, "0"),                     # two: one left to the API server and scheduler
    ((2, 3, 4, 5), None, 3, "2,3,4"),           # the cores we may use (affinity), not 0..n
    ((0, 1, 2, 3), (0, 2), 1, "0"),             # SMT: one logical CPU per physical core
])
def test_threads_come_from_the_allowed_cores(cores, physical, threads, bind):
    c = choose(machine(AVX512, cores=cores, physical=physical), VLLMServerConfig(), {})
    assert (c.threads, c.bind) == (threads, bind)
    assert c.env() == {"VLLM_CPU_OMP_THREADS_BIND": bind, "OMP_NUM_THREADS": str(threads)}


@pytest.mark.parametrize("mem_gib,kv", [(1.0, 0.5), (10.0, 1.5), (64.0, 4.0)])
def test_default_kv_cache_is_a_bounded_share_of_available_memory(mem_gib, kv):
    c = choose(machine(mem_gib=mem_gib), VLLMServerConfig(), {})
    assert c.kv_cache_gib == kv and "available" in c.reasons["kv_cache"]


def test_this_machine_reads_affinity_and_flag_override(monkeypatch):
    monkeypatch.setenv("TRAJFORGE_CPU_FLAGS", "avx,avx512_bf16")
    import os

    m = this_machine()
    assert m.flags == {"avx", "avx512_bf16"} and m.flags_from == "TRAJFORGE_CPU_FLAGS"
    assert set(m.cores) == os.sched_getaffinity(0) and set(m.physical) <= set(m.cores) and m.mem_available > 0
    assert parse_flags("processor : 0\nflags\t\t: fpu avx\n") == {"fpu", "avx"}


def test_server_command_and_env_carry_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRAJFORGE_CPU_FLAGS", "sse avx")
    for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
              "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(k, raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    c = cfg({"model": str(model), "python": "/usr/bin/python3"})
    server = VLLMServer(c.teacher, tmp_path / "vllm.log")
    cmd = server.command()
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    kv = int(cmd[cmd.index("--kv-cache-memory-bytes") + 1]) / GIB
    assert kv == server.choice.kv_cache_gib and 0.5 <= kv <= 4
    env = server.env()
    assert env["OMP_NUM_THREADS"] == str(server.choice.threads) and env["VLLM_CPU_OMP_THREADS_BIND"] == server.choice.bind
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "torchinductor")
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    # the user's own settings win: vllm.env and an explicit dtype
    mine = cfg({"model": str(model), "python": "/usr/bin/python3", "dtype": "bfloat16",
                "env": {"OMP_NUM_THREADS": "2", "VLLM_CACHE_ROOT": "/elsewhere"}})
    server = VLLMServer(mine.teacher, tmp_path / "vllm2.log")
    cmd, env = server.command(), server.env()
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert env["OMP_NUM_THREADS"] == "2" and "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert env["VLLM_CACHE_ROOT"] == "/elsewhere"


def _rollout_fp(c, tmp_path) -> str:
    ctx = StageContext.create(c, "b")
    return fingerprint(fingerprint_components(RolloutStage(), ctx, {"synthesize": "s"}))


def test_the_resolved_dtype_is_fingerprinted_threads_and_kv_cache_are_not(tmp_path, monkeypatch):
    runs = str(tmp_path / "runs")
    monkeypatch.setenv("TRAJFORGE_CPU_FLAGS", "avx avx2 avx512f avx512_bf16")
    bf16 = _rollout_fp(cfg(runs=runs), tmp_path)
    assert _rollout_fp(cfg(runs=runs), tmp_path) == bf16  # auto resolving the same: reused
    assert _rollout_fp(cfg({"dtype": "bfloat16"}, runs=runs), tmp_path) == bf16  # auto == what it resolved to
    assert _rollout_fp(cfg({"kv_cache_gib": 3.0, "env": {"OMP_NUM_THREADS": "1"}}, runs=runs), tmp_path) == bf16
    monkeypatch.setenv("TRAJFORGE_CPU_FLAGS", "avx avx2 avx512f")
    f32 = _rollout_fp(cfg(runs=runs), tmp_path)
    assert f32 != bf16  # a machine resolving auto to float32: the cached build is not reused
    assert _rollout_fp(cfg({"dtype": "float32"}, runs=runs), tmp_path) == f32
    assert _rollout_fp(cfg({"dtype": "bfloat16"}, runs=runs), tmp_path) == bf16  # explicit: flags do not matter
    gpu = cfg({"gpu_memory_utilization": 0.9, "kv_cache_gib": None}, runs=runs)
    assert gpu.teacher.fingerprint()["vllm"]["dtype"] == "auto"


def test_throughput_line():
    assert throughput_line({"completion_tokens": 1200, "driver_wall_seconds": 60.0}).startswith(
        "teacher throughput 20.0 completion tokens/s")
    assert throughput_line({"completion_tokens": 0, "driver_wall_seconds": 5}) is None
    assert throughput_line({}) is None


def test_doctor_prints_the_embedded_teacher_setup(tmp_path):
    from conftest import ROOT

    r = run_cli("doctor", str(Path(ROOT) / "configs" / "demo.yaml"), cwd=tmp_path, timeout=180,
                # (thread variables a test runner may have set, e.g. Dask's OMP_NUM_THREADS=1, count as unset
                # when empty: the row must show the choice made from the cores)
                env={"DOCKER_HOST": "unix:///nonexistent", "TRAJFORGE_CPU_FLAGS": "fpu sse avx", "COLUMNS": "2000",
                     "OMP_NUM_THREADS": "", "VLLM_CPU_OMP_THREADS_BIND": ""})
    row = next((line for line in r.stdout.splitlines() if "setup" in line and "teacher" in line), None)
    assert row is not None, r.stdout + r.stderr
    assert "dtype float32" in row and "no avx512_bf16/amx_bf16" in row and "thread(s) on CPU" in row, row
    assert "KV cache" in row and "eager" in row and "no AVX2" in row


def test_dasks_omp_setting_is_not_taken_for_the_users(monkeypatch):
    """A LocalCluster started in this process writes OMP_NUM_THREADS=1 into os.environ (for its
    workers); the teacher's threads are still chosen from the cores, and the server gets the choice."""
    from trajforge.tasks.teachers import cpu_profile

    monkeypatch.setattr(cpu_profile, "STARTUP_THREAD_ENV", {})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what distributed's LocalCluster leaves behind
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    c = cpu_profile.resolve(VLLMServerConfig())
    assert c.threads is not None and "set" not in c.reasons["threads"]
    monkeypatch.setattr(cpu_profile, "STARTUP_THREAD_ENV", {"OMP_NUM_THREADS": "3"})  # the user's own
    assert cpu_profile.resolve(VLLMServerConfig()).reasons["threads"] == "OMP_NUM_THREADS=3 set"


def test_chat_template_is_a_shipped_name_or_a_file(tmp_path, monkeypatch):
    """`vllm.chat_template`: a name of one in tasks/teachers/chat_templates/ or a file; anything else is refused."""
    from trajforge.tasks.teachers.vllm_server import CHAT_TEMPLATES, TeacherServerError

    monkeypatch.setenv("TRAJFORGE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    mine = tmp_path / "mine.jinja"
    mine.write_text("{{ messages }}")
    for spec, path in [("smollm2-tools", CHAT_TEMPLATES / "smollm2-tools.jinja"), (str(mine), mine)]:
        c = cfg({"model": str(model), "python": "/usr/bin/python3", "tool_call_parser": "hermes", "chat_template": spec})
        cmd = VLLMServer(c.teacher, tmp_path / "vllm.log").command()
        assert cmd[cmd.index("--chat-template") + 1] == str(path) and path.is_file()
        assert cmd[cmd.index("--tool-call-parser") + 1] == "hermes"
    c = cfg({"model": str(model), "python": "/usr/bin/python3", "chat_template": "no-such-template"})
    with pytest.raises(TeacherServerError, match="smollm2-tools"):
        VLLMServer(c.teacher, tmp_path / "vllm.log").command()
    # fingerprinted by content: an edited template is a different teacher
    before = cfg({"chat_template": str(mine)}).teacher.fingerprint()["vllm"]["chat_template"]
    mine.write_text("{{ messages }}\n")
    after = cfg({"chat_template": str(mine)}).teacher.fingerprint()["vllm"]["chat_template"]
    assert before != after and before.startswith(f"{mine}@")


def test_the_shipped_smollm2_template_renders_tools_calls_and_results():
    """`smollm2-tools` (jinja2, as vLLM renders it): the tools and the Hermes call format in the system turn,
    an assistant's calls as <tool_call> blocks, a tool result as a user turn; without tools, the model's own."""
    import json

    import jinja2

    from trajforge.tasks.teachers.vllm_server import CHAT_TEMPLATES

    t = jinja2.Environment().from_string((CHAT_TEMPLATES / "smollm2-tools.jinja").read_text())
    tool = {"type": "function", "function": {"name": "set_counter", "parameters": {"type": "object"}}}
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Set alpha to 4."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "set_counter", "arguments": '{"name": "alpha", "value": 4}'}}]},
            {"role": "tool", "content": '{"ok": true}'}]
    text = t.render(messages=msgs, tools=[tool], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou have access to the following tools:\n<tools>"
                           + json.dumps([tool["function"]]) + "</tools>")
    assert '<|im_start|>assistant\n<tool_call>{"name": "set_counter", "arguments": {"name": "alpha", "value": 4}}' \
           "</tool_call><|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>{\"ok\": true}</tool_response><|im_end|>\n<|im_start|>assistant\n" in text
    plain = t.render(messages=msgs[1:2], add_generation_prompt=True)
    assert plain == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                     "<|im_start|>user\nSet alpha to 4.<|im_end|>\n<|im_start|>assistant\n")
