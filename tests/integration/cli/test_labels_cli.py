"""`nodeagent labels` with GFD's options: the MIG strategy and the machine-type file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result, assert_one_error
from tests.support.words import assert_our_words


@pytest.fixture
def node(cli: Callable[..., Result], tmp_path: Path) -> Callable[..., Result]:
    """`nodeagent labels ARGS` on one emulated H200 whose 7 slices are 1g.18gb."""
    state = str(tmp_path / "node.json")
    gen = cli("--simulate", "h200", "--sim-state", state, "mig", "generate-config")
    assert gen.returncode == 0, gen.stderr
    (tmp_path / "mig.yaml").write_text(gen.stdout)
    res = cli("--simulate", "h200", "--sim-state", state, "mig", "apply", "-f",
              str(tmp_path / "mig.yaml"), "-c", "all-1g.18gb")  # fmt: skip
    assert res.returncode == 0, res.stderr

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return cli(
            "--simulate", "h200", "--sim-state", state, "labels", "-o", "json", *args, env=env
        )

    return run


def _labels(res: Result) -> dict[str, str]:
    assert res.returncode == 0, res.stderr
    labels: dict[str, str] = json.loads(res.stdout)["labels"]
    return labels


def test_single_strategy_and_machine_type(node: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "product_name").write_text("PowerEdge R760xa\n")
    got = _labels(
        node("--mig-strategy", "single", "--machine-type-file", str(tmp_path / "product_name"))
    )
    assert got["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert got["nvidia.com/gpu.count"] == "7"
    assert got["nvidia.com/gpu.machine"] == "PowerEdge-R760xa"
    assert got["nvidia.com/mig.strategy"] == "single"
    assert not any(k.startswith("nvidia.com/mig-") for k in got)


def test_strategy_from_the_environment_and_default_mixed(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    absent = {"NODEAGENT_MACHINE_TYPE_FILE": str(tmp_path / "absent")}
    mixed = _labels(node(env=absent))
    assert mixed["nvidia.com/mig.strategy"] == "mixed"
    assert mixed["nvidia.com/mig-1g.18gb.count"] == "7"
    assert mixed["nvidia.com/gpu.machine"] == "unknown"
    none = _labels(node(env=absent | {"NODEAGENT_MIG_STRATEGY": "none"}))
    assert "nvidia.com/mig.strategy" not in none
    assert none["nvidia.com/gpu.replicas"] == "0"


def test_bad_strategy_is_one_sentence(node: Callable[..., Result]) -> None:
    assert_one_error(node("--mig-strategy", "bogus"), 2, "--mig-strategy", "none, single, mixed")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "link-to-file", "huge"])
def test_a_machine_type_file_that_is_no_file_is_refused_at_once(
    node: Callable[..., Result], tmp_path: Path, kind: str
) -> None:
    """GFD's --machine-type-file: a FIFO blocked the publish, /dev/zero filled memory; now
    only a regular file (through a link too: ConfigMaps mount links) is read, at most 4 MiB."""
    path = tmp_path / "product_name"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    elif kind == "link-to-file":
        (tmp_path / "real").write_text("PowerEdge R760xa\n")
        path.symlink_to(tmp_path / "real")
    else:
        path.write_text("A" * 10_000_000)
    res = node("--machine-type-file", str(path))
    if kind == "link-to-file":
        assert _labels(res)["nvidia.com/gpu.machine"] == "PowerEdge-R760xa"
        return
    # A path that is there but no file to read is named wrong: one sentence, exit 2 (it was
    # taken, with a warning, and the label read `unknown`). Huge: over 4 MiB, refused.
    words = {"fifo": "a FIFO", "dev-zero": "a character device", "folder": "a directory",
             "huge": "larger than 4 MiB"}[kind]  # fmt: skip
    assert_our_words(res, 2, "machine-type file", words)


def test_an_absent_machine_type_file_reads_unknown(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    """No DMI (a VM, a container): `unknown`, as GFD says."""
    got = _labels(node("--machine-type-file", str(tmp_path / "absent")))
    assert got["nvidia.com/gpu.machine"] == "unknown"


PLUGIN = "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources:\n"


@pytest.mark.parametrize(
    ("args", "env", "replicas"),
    [
        (("--device-plugin-config-file", "{dir}/ts"), {}, "3"),
        ((), {"NODEAGENT_DEVICE_PLUGIN_CONFIG_DIR": "{dir}"}, "5"),  # the `named` fallback
        (("--device-plugin-config-dir", "{dir}", "--device-plugin-default-config", "ts"), {}, "3"),
        (
            ("--device-plugin-config-dir", "{dir}"),
            {"NODEAGENT_DEVICE_PLUGIN_FALLBACK_STRATEGIES": "single,empty"},
            "1",
        ),
    ],
)
def test_the_device_plugin_config_shares_the_mig_devices(
    node: Callable[..., Result],
    tmp_path: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    replicas: str,
) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "ts").write_text(PLUGIN + "    - {name: mig-1g.18gb, replicas: 3}\n")
    (configs / "default").write_text(PLUGIN + "    - {name: nvidia.com/mig-1g.18gb, replicas: 5}\n")
    fill = {"dir": str(configs)}
    got = _labels(
        node(*(a.format(**fill) for a in args), env={k: v.format(**fill) for k, v in env.items()})
    )
    assert got["nvidia.com/mig-1g.18gb.replicas"] == replicas
    shared = replicas != "1"
    assert got["nvidia.com/mig-1g.18gb.sharing-strategy"] == ("time-slicing" if shared else "none")
    assert got["nvidia.com/mig-1g.18gb.product"].endswith("-SHARED") == shared


def test_a_bad_device_plugin_config_is_one_sentence(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / "plugin.yaml").write_text(PLUGIN + "    - {name: gpu, replicas: 0}\n")
    res = node("--device-plugin-config-file", str(tmp_path / "plugin.yaml"))
    assert_one_error(res, 2, f"{tmp_path / 'plugin.yaml'}:6:", "replicas must be a number >= 2")
    both = node("--device-plugin-config-file", "a", "--device-plugin-config-dir", "b")
    assert_one_error(both, 2, "not both")


@pytest.mark.parametrize("how", [("--device-plugin-default-config", "x"),
                                 ("--device-plugin-fallback-strategies", "named")])  # fmt: skip
def test_a_device_plugin_config_that_is_a_loop_of_links_is_one_sentence(
    node: Callable[..., Result], tmp_path: Path, how: tuple[str, str]
) -> None:
    """The folder's chosen entry is a loop of links: it was "internal error: OSError" (exit 4)."""
    folder = tmp_path / "dp"
    folder.mkdir()
    (folder / "x").symlink_to(folder / "y")
    (folder / "y").symlink_to(folder / "x")
    (folder / "default").symlink_to(folder / "x")  # the `named` fallback's name
    res = node("--device-plugin-config-dir", str(folder), *how)
    assert_our_words(res, 2, "device plugin config", "loop of symbolic links")
