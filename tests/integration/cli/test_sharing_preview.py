"""`sharing_preview`: what `nodeagent labels -f F -c N` shows a sharing config would leave, checked
exactly as `sharing apply` checks it (the same pipeline, run dry). Every config apply refuses is
refused with apply's sentence; every one it takes gives the GPUs' offers apply reports."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.base.errors import AgentError
from nodeagent.cli.commands import build_parser
from nodeagent.cli.common import Context
from nodeagent.cli.pipelines import sharing_preview
from nodeagent.nvml.session import _sessions as session_registry
from tests.support.cli import Result

HEAD = "version: nodeagent/v1\nsharing-configs:\n  c:\n    - devices: all\n"
REFUSED = {
    "mps-pinned-999G": ("      mps: {replicas: 2, pinned-memory: 999G}\n", "999G is more than"),
    "time-slicing-huge": ("      time-slicing: {replicas: 99999999999999999999}\n", "2-1024"),
    "mps-101": ("      mps: {replicas: 101}\n", "2-100"),
    "mig-bad-profile": ("      mig: {mig-devices: {9g.99gb: 1}}\n", "9g.99gb"),
}
TAKEN = {
    "time-slicing-4": ("      time-slicing: {replicas: 4}\n", {0: ("time-slicing", 4)}),
    "mps-4": ("      mps: {replicas: 4}\n", {0: ("mps", 4)}),
    "whole": ("      whole: {}\n", {0: ("whole", 1)}),
}


@pytest.fixture
def preview(tmp_path: Path, fake_mps_control: str) -> Callable[[str], dict[int, tuple[str, int]]]:
    """sharing_preview for `nodeagent --simulate h200 labels -f FILE -c c`, FILE holding body."""

    def run(body: str) -> dict[int, tuple[str, int]]:
        (tmp_path / "s.yaml").write_text(HEAD + body)
        argv = [*NODE(tmp_path), "labels", "-f", str(tmp_path / "s.yaml"), "-c", "c"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        env["NODEAGENT_MPS_CONTROL"] = fake_mps_control  # an MPS preview checks it as apply does
        before = set(session_registry)
        try:
            return sharing_preview(Context(build_parser().parse_args(argv), env))
        finally:
            for key in set(session_registry) - before:
                session_registry.pop(key).close()

    return run


def NODE(tmp_path: Path) -> list[str]:
    return ["--simulate", "h200", "--sim-state", str(tmp_path / "node.json")]


def _apply(cli: Callable[..., Result], tmp_path: Path, control: str) -> Result:
    return cli(*NODE(tmp_path), "sharing", "apply", "--dry-run", "-o", "json",
               "-f", str(tmp_path / "s.yaml"), "-c", "c", "--mps-control", control)  # fmt: skip


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_as_apply_refuses_it(
    preview: Callable[[str], dict[int, tuple[str, int]]],
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
    name: str,
) -> None:
    body, words = REFUSED[name]
    with pytest.raises(AgentError) as err:
        preview(body)
    assert words in str(err.value)
    applied = _apply(cli, tmp_path, fake_mps_control)
    assert applied.returncode == err.value.exit_code == 2
    assert applied.stderr.strip() == f"nodeagent: {err.value}"


@pytest.mark.parametrize("name", sorted(TAKEN))
def test_taken_with_the_offers_apply_reports(
    preview: Callable[[str], dict[int, tuple[str, int]]],
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
    name: str,
) -> None:
    body, offers = TAKEN[name]
    assert preview(body) == offers
    applied = _apply(cli, tmp_path, fake_mps_control)
    assert applied.returncode == 0, applied.stderr
    assert '"sharing": "' + offers[0][0] + '"' in applied.stdout


def test_a_slice_in_use_is_refused_as_apply_refuses_it(
    preview: Callable[[str], dict[int, tuple[str, int]]],
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
) -> None:
    """MIG slices with a process on one: a config that makes the GPU whole would destroy it."""
    mig = tmp_path / "mig.yaml"
    mig.write_text(cli(*NODE(tmp_path), "mig", "generate-config").stdout)
    assert cli(*NODE(tmp_path), "mig", "apply", "-f", str(mig), "-c", "all-1g.18gb").returncode == 0
    status = json.loads(cli(*NODE(tmp_path), "status", "-o", "json").stdout)
    slice_uuid = status["gpus"][0]["slices"][0]["mig_uuid"]
    res = cli(*NODE(tmp_path), "sim", "attach", "--device", slice_uuid, "--pid", "4321")
    assert res.returncode == 0, res.stderr
    with pytest.raises(AgentError) as err:
        preview("      whole: {}\n")
    applied = _apply(cli, tmp_path, fake_mps_control)
    assert applied.returncode == err.value.exit_code == 3
    assert applied.stderr.strip() == f"nodeagent: {err.value}"
    assert "4321" in str(err.value)
