"""MPS in NVIDIA's device-plugin layout (fake control daemon): the paths, markers, limits and
permissions the unmodified plugin relies on (k8s-device-plugin 1b826ac: cmd/mps-control-daemon,
internal/plugin/mps.go), replicas from the plugin's own config, and the plugin's probe."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent.service import Agent
from nodeagent.base.errors import MpsError
from nodeagent.mps import layout
from nodeagent.mps.control import MpsControl
from nodeagent.mps.layout import CONTAINER_FILE_LABEL, is_mounted
from nodeagent.nvml import NvmlSession
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.support.agent import make_agent

H200_MIB = 143771  # NVML memory total of the H200, MiB

PLUGIN_CONFIG = """version: v1
flags:
  mpsRoot: /run/nvidia/mps
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


@pytest.fixture
def plugin_node(
    tmp_path: Path, fake_mps_control: str
) -> Iterator[Callable[..., tuple[Agent, Path]]]:
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    # A short root: the daemon's unix sockets live in <root>/<resource>/pipe (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    agents: list[Agent] = []

    def start(config: str = PLUGIN_CONFIG, **mps: Any) -> tuple[Agent, Path]:
        cfg = tmp_path / "plugin-config.yaml"
        cfg.write_text(config)
        agent = make_agent(
            session,
            lib.reset,
            mps={
                "enabled": True,
                "layout": "device-plugin",
                "root": root,
                "device_plugin_config": cfg,
                "control": fake_mps_control,
                "replicas": 2,  # the plugin's config wins
                "stop_on_exit": True,
                **mps,
            },
            reconcile={"interval_seconds": 3600},
        )
        agent.start()
        agents.append(agent)
        return agent, root

    yield start
    for agent in agents:
        agent.stop()
    control = MpsControl(
        fake_mps_control, root / "nvidia.com/gpu/pipe", root / "nvidia.com/gpu/log"
    )
    if control.daemon_pid() is not None:
        control.command("quit")
    if is_mounted(root / "shm"):  # the agent mounted the tmpfs (this test runs as root)
        subprocess.run(["umount", str(root / "shm")], check=False, timeout=30)
    shutil.rmtree(root, ignore_errors=True)


def test_the_layout_the_plugin_expects(plugin_node: Callable[..., tuple[Agent, Path]]) -> None:
    agent, root = plugin_node()
    report = agent.pipeline.last_report
    assert report is not None and report.result == "success", report
    res = root / "nvidia.com" / "gpu"
    assert (res / "pipe" / "nvidia-cuda-mps-control.pid").exists()
    assert (res / "log").is_dir()
    # Empty markers, as upstream writes them, once the limits were read back.
    assert (res / ".started").read_bytes() == b"" and (root / ".ready").read_bytes() == b""
    assert (root / "shm").is_dir()
    # Traversable by non-root client containers.
    for folder in (root, root / "nvidia.com", res, res / "pipe"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    # Replicas from the plugin's config (4, not the settings' 2); limits as upstream computes
    # them: 100 // replicas, and memory / replicas in whole MiB (no rounding to GiB).
    status = agent.mps.status
    assert status is not None and status.thread_percentage == 25.0
    assert status.pinned_bytes == {0: (H200_MIB // 4) << 20, 1: (H200_MIB // 4) << 20}
    assert agent.mps.daemon is not None and agent.mps.daemon.settings.replicas == 4
    # The shared-memory tmpfs: mounted, or (no CAP_SYS_ADMIN here) said clearly.
    assert agent.mps.shm.startswith(("mounted a", "not mounted: cannot mount a tmpfs at"))


def test_the_pipe_directory_gets_the_containers_selinux_context(
    plugin_node: Callable[..., tuple[Agent, Path]],
    chcon: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SELinux enabled (its selinuxfs there): the agent labels the pipe directory for
    containers before the daemon starts, as upstream's daemon does."""
    calls = chcon()
    (tmp_path / "selinuxfs").mkdir()
    monkeypatch.setattr(layout, "SELINUX_FS", tmp_path / "selinuxfs")
    agent, root = plugin_node()
    report = agent.pipeline.last_report
    assert report is not None and report.result == "success", report
    pipe = root / "nvidia.com" / "gpu" / "pipe"
    assert calls.read_text().split() == ["-R", CONTAINER_FILE_LABEL, str(pipe)]
    assert agent.mps.daemon is not None


def test_the_plugins_probe_succeeds(
    plugin_node: Callable[..., tuple[Agent, Path]], fake_mps_control: str
) -> None:
    """What the plugin's waitForDaemon does (internal/plugin/mps.go): run the control program
    with the resource's pipe directory and ask for the default thread percentage."""
    _, root = plugin_node()
    env = dict(
        os.environ,
        CUDA_MPS_PIPE_DIRECTORY=str(root / "nvidia.com/gpu/pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(root / "nvidia.com/gpu/log"),
    )
    probe = subprocess.run(
        [fake_mps_control], input="get_default_active_thread_percentage", capture_output=True,
        text=True, env=env, timeout=10, check=False,
    )  # fmt: skip
    assert probe.returncode == 0 and probe.stdout.strip() == "25.0"


def test_rename_by_default_names_the_resource_shared(
    plugin_node: Callable[..., tuple[Agent, Path]],
) -> None:
    _, root = plugin_node(PLUGIN_CONFIG.replace("  mps:\n", "  mps:\n    renameByDefault: true\n"))
    assert (root / "nvidia.com/gpu.shared/pipe/nvidia-cuda-mps-control.pid").exists()
    assert (root / "nvidia.com/gpu.shared/.started").exists()


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ("version: v1\n", "no sharing.mps.resources"),
        ("version: v2\nsharing: {}\n", "version: v1"),
        (PLUGIN_CONFIG.replace("replicas: 4", "replicas: 1"), "replicas must be 2 or more"),
        (PLUGIN_CONFIG.replace("replicas: 4", "replicas: 49"), "replicas must be at most 48"),
        (PLUGIN_CONFIG.replace("replicas: 4", "replicas: " + "9" * 70), "at most 48"),
        (
            PLUGIN_CONFIG + "    - name: example.com/gpu\n      replicas: 2\n",
            "lists 2 MPS resources",
        ),
        ("sharing: [\n", "not valid YAML"),
    ],
)
def test_a_bad_plugin_config_fails_resolve_and_starts_nothing(
    plugin_node: Callable[..., tuple[Agent, Path]], config: str, words: str
) -> None:
    agent, root = plugin_node(config)
    report = agent.pipeline.last_report
    assert report is not None and report.step == "resolve", report
    assert words in (report.reason or "") and "device plugin config" in (report.reason or "")
    assert agent.mps.daemon is None and not (root / ".ready").exists()


def test_no_ready_marker_while_limits_do_not_hold(
    plugin_node: Callable[..., tuple[Agent, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_IGNORE_SETS", "1")
    agent, root = plugin_node()
    report = agent.pipeline.last_report
    assert report is not None and report.step == "apply"
    assert not (root / ".ready").exists() and not (root / "nvidia.com/gpu/.started").exists()


def test_ready_is_withdrawn_while_limits_change(
    plugin_node: Callable[..., tuple[Agent, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit change that does not read back leaves the plugin no ready marker: it never
    advertises shared devices on a daemon whose limits are not what they should be."""
    agent, root = plugin_node()
    assert (root / ".ready").exists()
    daemon = agent.mps.daemon
    assert daemon is not None
    seen: list[bool] = []

    def verify_fails() -> None:
        seen.append((root / ".ready").exists())
        raise MpsError("MPS limits did not hold: default active thread percentage is 25.0")

    monkeypatch.setattr(daemon, "verify", verify_fails)
    new = dataclasses.replace(
        agent.settings, mps=dataclasses.replace(agent.settings.mps, thread_percentage=40)
    )
    agent.settings = new  # as a reload would, without waking the worker
    report = agent.pipeline.run_once()
    assert report.step == "apply" and "did not hold" in (report.reason or "")
    assert seen == [False]  # already withdrawn while the new limits were checked
    assert not (root / ".ready").exists()


def test_a_renamed_resource_moves_the_daemon(
    plugin_node: Callable[..., tuple[Agent, Path]], tmp_path: Path
) -> None:
    """renameByDefault (or another name) puts the pipe elsewhere: the daemon restarts there
    (no clients), never a .started beside a pipe no daemon serves."""
    agent, root = plugin_node()
    old_pid = agent.mps.status.pid if agent.mps.status else None
    (tmp_path / "plugin-config.yaml").write_text(
        PLUGIN_CONFIG.replace("  mps:\n", "  mps:\n    renameByDefault: true\n")
    )
    report = agent.pipeline.run_once()
    assert report.result == "success" and report.mps_change == "restart", report.reason
    assert (root / "nvidia.com/gpu.shared/pipe/nvidia-cuda-mps-control.pid").exists()
    assert not (root / "nvidia.com/gpu/pipe/nvidia-cuda-mps-control.pid").exists()
    assert agent.mps.status is not None and agent.mps.status.pid != old_pid


def test_a_failed_limit_change_is_planned_again(
    plugin_node: Callable[..., tuple[Agent, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, root = plugin_node()
    daemon = agent.mps.daemon
    assert daemon is not None
    real_verify = daemon.verify
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise MpsError("MPS limits did not hold: default active thread percentage is 25.0")
        real_verify()

    monkeypatch.setattr(daemon, "verify", flaky)
    agent.settings = dataclasses.replace(
        agent.settings, mps=dataclasses.replace(agent.settings.mps, thread_percentage=40)
    )
    assert agent.pipeline.run_once().step == "apply"
    again = agent.pipeline.run_once()
    assert again.result == "success" and again.mps_change == "limits", again.reason
    assert agent.mps.refresh_status() is not None
    assert agent.mps.status is not None and agent.mps.status.thread_percentage == 40.0
    assert (root / ".ready").exists()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gpu", "nvidia.com/gpu"),  # as upstream: the nvidia.com/ prefix is added
        ("nvidia.com/../../../secret", None),
        ("/etc/passwd", None),
        ("Example.COM/gpu", None),
    ],
)
def test_resource_names_as_upstream_validates_them(
    tmp_path: Path, name: str, ok: str | None
) -> None:
    from nodeagent.base.errors import ConfigError
    from nodeagent.mps.layout import read_plugin_config

    path = tmp_path / "c.yaml"
    path.write_text(PLUGIN_CONFIG.replace("name: nvidia.com/gpu", f"name: {name!r}"))
    if ok is None:
        with pytest.raises(ConfigError, match=r"resource name like nvidia\.com/gpu"):
            read_plugin_config(path)
    else:
        assert read_plugin_config(path).resource == ok


def test_a_plugin_config_value_its_tag_cannot_build_is_one_sentence(tmp_path: Path) -> None:
    from nodeagent.base.errors import ConfigError
    from nodeagent.mps.layout import read_plugin_config

    path = tmp_path / "c.yaml"
    path.write_text(PLUGIN_CONFIG.replace("replicas: 4", "replicas: !!int abc"))
    with pytest.raises(ConfigError, match="a value cannot be read"):
        read_plugin_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\nsharing: &s {mps: *s}\n", r"c\.yaml:2:\d+: an alias \(\*name\) inside"),
        ("version: v1\nsharing: {mps: [\n", r"c\.yaml:\d+:\d+: not valid YAML"),
    ],
)
def test_a_plugin_config_is_read_by_the_bounded_reader(
    tmp_path: Path, text: str, message: str
) -> None:
    """The same reader as every config (nodeagent.base.configfile): aliases bounded, the
    position of a YAML error."""
    from nodeagent.base.errors import ConfigError
    from nodeagent.mps.layout import read_plugin_config

    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^device plugin config {tmp_path}/{message}"):
        read_plugin_config(path)


def test_shm_symlink_is_refused_and_a_symlinked_root_is_recognised(tmp_path: Path) -> None:
    from nodeagent.mps.layout import is_mounted, mount_shm

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "shm").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(MpsError, match="symbolic link"):
        mount_shm(tmp_path / "root" / "shm", 1024)
    real = tmp_path / "real"
    (real / "shm").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    try:
        first = mount_shm(tmp_path / "link" / "shm", 1024)
    except MpsError:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        assert first.startswith("mounted")
        assert is_mounted(tmp_path / "link" / "shm") and is_mounted(real / "shm")
        assert mount_shm(tmp_path / "link" / "shm", 1024).endswith("is a tmpfs already")
    finally:
        subprocess.run(["umount", str(real / "shm")], check=False, timeout=30)
