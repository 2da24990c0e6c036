"""MPS in the device plugin's layout does what upstream's mps-control-daemon and plugin do
(k8s-device-plugin 1b826ac). The pipe directory's SELinux context (cmd/mps-control-daemon/mps/
daemon.go: where /sys/fs/selinux exists it is labelled system_u:object_r:container_file_t:s0,
recursively, so confined client containers can reach the daemon; nothing where SELinux is
disabled), with a fake `chcon` on PATH that records its arguments or fails as chcon does on a
file system without SELinux labels; and what the plugin refuses (MPS beside MIG devices, MPS on
a subset of `nvidia.com/gpu`) refused by `nodeagent mps start`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.errors import MpsError
from nodeagent.mps.layout import CONTAINER_FILE_LABEL, DEVICE_PLUGIN, FLAT, paths, prepare
from tests.integration.mps.conftest import FAILURE
from tests.support.cli import Result


def _selinux(tmp_path: Path, enabled: bool) -> Path:
    fs = tmp_path / "selinuxfs"
    if enabled:
        fs.mkdir()
    return fs


@pytest.mark.parametrize(
    ("where", "enabled", "labelled"),
    [(DEVICE_PLUGIN, True, True), (DEVICE_PLUGIN, False, False), (FLAT, True, False)],
)
def test_the_pipe_directory_is_labelled_only_where_upstream_labels_it(
    tmp_path: Path, chcon: Callable[..., Path], where: str, enabled: bool, labelled: bool
) -> None:
    calls = chcon()
    p = paths(where, tmp_path / "mps")
    said = prepare(p, _selinux(tmp_path, enabled))
    assert p.pipe_dir.is_dir()
    if labelled:
        assert calls.read_text().split() == ["-R", CONTAINER_FILE_LABEL, str(p.pipe_dir)]
        assert said == f"{p.pipe_dir} labelled {CONTAINER_FILE_LABEL}"
    else:
        assert not calls.exists()
        assert "not set" in said or "left as it is" in said


def test_a_context_that_cannot_be_set_is_one_sentence(
    tmp_path: Path, chcon: Callable[..., Path]
) -> None:
    chcon(fail=True)
    p = paths(DEVICE_PLUGIN, tmp_path / "mps")
    with pytest.raises(MpsError) as err:
        prepare(p, _selinux(tmp_path, True))
    assert str(err.value) == (
        f"SELinux is enabled but the MPS pipe directory {p.pipe_dir} cannot be labelled"
        f" {CONTAINER_FILE_LABEL} for containers: {FAILURE}"
    )
    assert err.value.exit_code == 3


MIG_HALF = """version: v1
mig-configs:
  half:
    - {devices: [0], mig-enabled: true, mig-devices: {"7g.141gb": 1}}
    - {devices: [1], mig-enabled: false}
"""


@pytest.mark.parametrize(
    ("mig", "devices", "words"),
    [
        (True, None, "does not serve MPS on a node with MIG devices"),
        (False, "0", "cannot serve GPU 0 mps x2; GPU 1 whole"),
    ],
)
def test_mps_start_in_the_plugins_layout_refuses_what_the_plugin_refuses(
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
    mig: bool,
    devices: str | None,
    words: str,
) -> None:
    """`nodeagent mps start` in the device plugin's layout: MPS beside a MIG GPU, or on a
    subset of the full GPUs, is one sentence and exit 2, no daemon started."""
    node = ["--simulate", "h200x2", "--sim-state", str(tmp_path / "s.json")]
    if mig:
        (tmp_path / "mig.yaml").write_text(MIG_HALF)
        assert cli(*node, "mig", "apply", "-f", "mig.yaml", "-c", "half").returncode == 0
    flags = ["--mps-control", fake_mps_control, "--mps-layout", "device-plugin",
             "--mps-root", str(tmp_path / "mps"), "--mps-replicas", "2"]  # fmt: skip
    if devices is not None:
        flags += ["--mps-devices", devices]
    got = cli(*node, "mps", "start", *flags)
    assert got.returncode == 2 and words in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "mps").rglob("*.pid"))
