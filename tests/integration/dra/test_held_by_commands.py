"""`nodeagent mig apply` and `sharing apply` (the CLI, another process than the agent) count
the slices of DRA claims as held: the checkpoint in dra.plugin-dir names them, also while a
claim is half prepared (an agent killed after the slice's creation, before the checkpoint said
which slice it made)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from nodeagent.dra.checkpoint import PREPARING, load
from tests.integration.dra.test_crash import layout, run, setup_gpu
from tests.support.cli import Result, assert_one_error
from tests.support.dra import DraNode, allocated_claim

Cli = Callable[..., Result]
CONFIGS = {
    "version": "v1",
    "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]},
}


def _apply(cli: Cli, root: Path, state: Path) -> Result:
    configs = root / "configs.yaml"
    configs.write_text(yaml.safe_dump(CONFIGS))
    return cli(
        "--simulate", "h200x2", "--sim-state", str(state),
        "mig", "apply", "-f", str(configs), "-c", "all-disabled",
        # the DaemonSet's environment, as `kubectl exec` gives it to the command
        env={"NODEAGENT_DRA": "true", "NODEAGENT_KUBE": "true", "NODEAGENT_DRA_PLUGIN_DIR": str(root / "p")},
    )  # fmt: skip


def test_mig_apply_never_destroys_a_prepared_claims_slice(dra_node: DraNode, cli: Cli) -> None:
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"}))
    assert dra_node.kubelet.prepare([claim])["uid-1"].error == ""

    refused = _apply(cli, dra_node.root, dra_node.state)

    assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    # Unprepared, the slice is anyone's: the same apply goes through.
    assert dra_node.kubelet.unprepare([claim]) == {"uid-1": ""}
    done = _apply(cli, dra_node.root, dra_node.state)
    assert done.returncode == 0, done.stderr
    assert not dra_node.inventory().gpus[0].mig_current


def test_a_half_prepared_claims_slice_is_held_too(short_root: Path, cli: Cli) -> None:
    setup_gpu(short_root, True, [])
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-2g35gb-14-2"})
    # Killed after the last NVML mutation (GI, CI): the slice is there, the checkpoint still
    # says 'preparing' and knows no MIG UUID.
    assert run(short_root, "prepare", claim, {"mutation": 2, "exit": 137, "when": "after"}) == 137
    (device,) = load(short_root / "p" / "checkpoint.json").claims["uid-1"].devices
    assert load(short_root / "p" / "checkpoint.json").claims["uid-1"].state == PREPARING
    assert device.mig_uuid is None

    refused = _apply(cli, short_root, short_root / "sim.json")

    assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")
    assert layout(short_root) == (True, [("2g.35gb", 2, True)])


@pytest.mark.parametrize(
    "text", ['{"version": 1, "claims": {"u": [1]}}', "", '{"version": 1, "claims": {"u": {}}}']
)
def test_a_checkpoint_it_cannot_read_refuses_the_change(
    short_root: Path, cli: Cli, text: str
) -> None:
    setup_gpu(short_root, True, [(9, 0, 4)])
    (short_root / "p").mkdir()
    (short_root / "p" / "checkpoint.json").write_text(text)

    refused = _apply(cli, short_root, short_root / "sim.json")

    # The command's sentence (after the store's warning log line, event podresources.failed)
    assert refused.returncode == 3 and "Traceback" not in refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "in use by an unknown owner (DRA checkpoint" in last and "nothing was changed" in last
    assert last.endswith("nothing was changed")
    assert layout(short_root) == (True, [("3g.71gb", 0, True)])
