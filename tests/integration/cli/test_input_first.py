"""The whole input is checked before anything else (issue 39, class 5): what `run` would refuse,
`config check` refuses alike, and a setting that names a GPU is checked against the node's GPUs
before the first call to the Kubernetes API."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import Result, assert_one_error

RUN = ("--simulate", "h200x2", "run", "--metrics-address", "127.0.0.1:0")


def test_a_reset_command_that_cannot_be_split_fails_config_check_as_run(
    cli: Callable[..., Result],
) -> None:
    flags = ("--reset-command", "nvidia-smi -r -i '{index}")
    assert_one_error(cli("config", "check", *flags), 2, "reset-command", "No closing quotation")
    assert_one_error(cli(*RUN, *flags), 2, "reset-command", "No closing quotation")


def test_a_sharing_config_listing_a_gpu_twice_is_a_config_error(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / "s.yaml").write_text(
        "version: nodeagent/v1\nsharing-configs:\n  a:\n    - devices: [0, 0]\n      whole: {}\n"
    )
    res = cli("--simulate", "h200x2", "sharing", "apply", "-f", "s.yaml", "-c", "a")
    assert_one_error(res, 2, "s.yaml:4:20", "devices lists GPU 0 twice")


def _kubeconfig(tmp: Path) -> Path:
    """A kubeconfig whose API server does not answer (port 1: refused at once)."""
    path = tmp / "kc.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return path


def test_dra_devices_naming_a_missing_gpu_exits_2_before_the_api_is_asked(
    cli_process: Callable[..., Result], tmp_path: Path
) -> None:
    kube = ("--kube", "--node-name", "n1", "--kubeconfig", str(_kubeconfig(tmp_path)))
    began = time.monotonic()
    res = cli_process(
        "--run-dir", str(tmp_path / "run"), *RUN, *kube, "--dra", "--dra-devices", "1,99",
        "--dra-plugin-dir", str(tmp_path / "p"), "--dra-registry-dir", str(tmp_path / "r"),
        "--dra-cdi-dir", str(tmp_path / "cdi"),
    )  # fmt: skip
    assert time.monotonic() - began < 10  # it retried the API server 30 s first
    assert_one_error(res, 2, "dra.devices", "GPU 99", "this node has GPUs [0, 1]")
    assert "kube.retry" not in res.stderr


def test_mps_devices_naming_a_missing_gpu_exits_2_before_the_api_is_asked(
    cli_process: Callable[..., Result], tmp_path: Path
) -> None:
    kube = ("--kube", "--node-name", "n1", "--kubeconfig", str(_kubeconfig(tmp_path)))
    res = cli_process(
        "--run-dir", str(tmp_path / "run"), *RUN, *kube, "--mps", "--mps-devices", "5"
    )
    assert_one_error(res, 2, "mps.devices", "GPU 5", "this node has GPUs [0, 1]")
