"""The node's ownership record (nodeagent.state.owners): a slice a prepared claim holds survives
every other path whatever the settings and files say, the record is rebuilt from the node's
traces when it is gone, and an unreadable trace refuses every destroy; a claim leaves nothing
behind, also when it is refused after a crash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nodeagent.dra.checkpoint import load
from nodeagent.state.owners import OWNERS_NAME
from tests.integration.dra.test_crash import driver, layout, run, setup_gpu
from tests.integration.dra.test_held_by_commands import _apply
from tests.support.cli import Result, assert_one_error
from tests.support.dra import DraNode, allocated_claim, mps_config

Cli = Callable[..., Result]


def _prepared(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"}))
    assert dra_node.kubelet.prepare([claim])["uid-1"].error == ""


def test_the_record_sits_beside_the_lock_and_names_the_claim(dra_node: DraNode) -> None:
    _prepared(dra_node)
    record = (dra_node.root / OWNERS_NAME).read_text()
    assert '"uid-1"' in record and '"asr"' in record and '"placement_start": 3' in record


def test_mig_apply_spares_the_claim_without_its_checkpoint(dra_node: DraNode, cli: Cli) -> None:
    _prepared(dra_node)
    dra_node.checkpoint.unlink()

    refused = _apply(cli, dra_node.root, dra_node.state)

    assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")
    assert dra_node.layout(0) == [("1g.18gb", 3)]


def test_mig_apply_with_another_plugin_dir_spares_the_claim(
    dra_node: DraNode, cli: Cli, tmp_path: Path
) -> None:
    _prepared(dra_node)
    elsewhere = tmp_path / "elsewhere"
    refused = cli(
        "--simulate", "h200x2", "--sim-state", str(dra_node.state),
        "mig", "apply", "-f", str(_configs(dra_node.root)), "-c", "all-disabled",
        env={"NODEAGENT_DRA_PLUGIN_DIR": str(elsewhere)},
    )  # fmt: skip
    assert_one_error(refused, 3, "is in use by claim speech/asr", "nothing was changed")
    assert dra_node.layout(0) == [("1g.18gb", 3)]


def _configs(root: Path) -> Path:
    _apply_file = root / "configs.yaml"
    _apply_file.write_text(
        "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
    )
    return _apply_file


def _apply_cdi(cli: Cli, dra_node: DraNode) -> Result:
    """mig apply with the node's CDI directory (/var/run/cdi on a node) in its settings."""
    return cli(
        "--simulate", "h200x2", "--sim-state", str(dra_node.state),
        "mig", "apply", "-f", str(_configs(dra_node.root)), "-c", "all-disabled",
        env={"NODEAGENT_DRA_CDI_DIR": str(dra_node.cdi_dir)},
    )  # fmt: skip


def test_record_and_checkpoint_gone_the_cdi_spec_still_names_the_claim(
    dra_node: DraNode, cli: Cli
) -> None:
    _prepared(dra_node)
    (dra_node.root / OWNERS_NAME).unlink()
    dra_node.checkpoint.unlink()

    refused = _apply_cdi(cli, dra_node)

    _last_line(refused, "in use by claim with UID uid-1", "nothing was changed")
    assert dra_node.layout(0) == [("1g.18gb", 3)]


def _last_line(res: Result, *words: str) -> None:
    """Refused (exit 3) with no traceback; the last stderr line (after the rebuild's warning
    log line) is the command's sentence, holding every word."""
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last


def test_an_unreadable_trace_refuses_every_destroy(dra_node: DraNode, cli: Cli) -> None:
    _prepared(dra_node)
    (dra_node.root / OWNERS_NAME).write_text("{not json")
    dra_node.checkpoint.unlink()
    spec = next(dra_node.cdi_dir.glob("*uid-1*"))
    spec.write_text("{half a spec")

    refused = _apply_cdi(cli, dra_node)

    _last_line(refused, "an unknown owner (CDI spec", "is unreadable", "nothing was changed")
    assert dra_node.layout(0) == [("1g.18gb", 3)]


def test_an_mps_claim_leaves_nothing_behind(dra_node: DraNode) -> None:
    claim = dra_node.add_claim(allocated_claim("tts", "uid-m", {"gpu": "gpu-1"}, mps_config(50)))
    assert dra_node.kubelet.prepare([claim])["uid-m"].error == ""
    root = dra_node.node.mps_root("uid-m", "gpu-1")
    assert (root / "pipe").is_dir()

    assert dra_node.kubelet.unprepare([claim]) == {"uid-m": ""}

    assert not (dra_node.root / "p" / "mps" / "uid-m").exists()
    assert not list(dra_node.cdi_dir.glob("*uid-m*"))
    assert load(dra_node.checkpoint).claims == {}
    assert '"uid-m"' not in (dra_node.root / OWNERS_NAME).read_text()


def test_a_claim_refused_after_a_crash_holds_nothing(short_root: Path) -> None:
    setup_gpu(short_root, True, [])
    claim = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-2g35gb-14-2"})
    # Killed after its slice was made: the checkpoint says 'preparing', the slice is there.
    assert run(short_root, "prepare", claim, {"mutation": 2, "exit": 137, "when": "after"}) == 137
    assert layout(short_root) == (True, [("2g.35gb", 2, True)])
    # The claim comes back with a config that is refused now (MPS on a MIG slice).
    bad = allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-2g35gb-14-2"}, mps_config(50))
    node = driver(short_root)
    try:
        from nodeagent.base.errors import ConfigError
        from nodeagent.dra.claims import ClaimRef

        try:
            node.prepare(ClaimRef("speech", "asr", "uid-1"), bad)
            raise AssertionError("the claim was prepared")
        except ConfigError as err:
            assert "an MPS share needs a whole GPU" in str(err)
    finally:
        node.session.close()
    # What the first try made is gone, and nothing holds it.
    assert layout(short_root) == (True, [])
    assert load(short_root / "p" / "checkpoint.json").claims == {}
    assert '"uid-1"' not in (short_root / OWNERS_NAME).read_text()


def test_a_claims_mig_change_runs_the_pipelines_named_steps(dra_node: DraNode) -> None:
    _prepared(dra_node)
    steps = dra_node.node.engine.stats.steps  # type: ignore[attr-defined]
    assert {"observe", "plan", "pause", "apply", "verify"} <= set(steps)
    assert steps["apply"][-1] >= 1


def test_unprepare_never_waits_behind_a_writer_and_prepare_keeps_its_deadline(
    dra_node: DraNode,
) -> None:
    import threading
    import time

    from nodeagent.base.errors import LockHeld
    from nodeagent.base.lock import mig_writer_lock
    from nodeagent.dra.claims import ClaimRef

    whole = dra_node.add_claim(allocated_claim("llm", "uid-w", {"gpu": "gpu-1"}))
    assert dra_node.kubelet.prepare([whole])["uid-w"].error == ""
    lock = dra_node.state.with_name(".sim.json.lock")
    with mig_writer_lock(lock, 5.0):  # another writer (a mig apply, a reconcile run) holds it
        done = threading.Event()
        threading.Thread(target=lambda: (dra_node.node.unprepare("uid-w"), done.set())).start()
        assert done.wait(5), "unprepare waited for the MIG writer lock"
        # A prepare that needs a MIG change gives up by its deadline, holding nothing.
        claim = allocated_claim("asr", "uid-s", {"gpu": "gpu-0-mig-1g18gb-19-0"})
        began = time.monotonic()
        try:
            dra_node.node.prepare(ClaimRef("speech", "asr", "uid-s"), claim, began + 0.5)
            raise AssertionError("prepared without the lock")
        except LockHeld as err:
            assert "another MIG writer holds" in str(err) and "gave up after" in str(err)
        assert time.monotonic() - began < 3
    assert load(dra_node.checkpoint).claims == {}
    assert dra_node.layout(0) == []


def test_a_checkpoint_that_cannot_be_written_never_fails_a_claim(dra_node: DraNode) -> None:
    # The checkpoint is the ownership record's view: the record decides, /readyz says why.
    dra_node.checkpoint.unlink(missing_ok=True)
    dra_node.checkpoint.mkdir()
    _prepared(dra_node)
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    problem = dra_node.node.problem()
    assert problem is not None and "is a directory" in problem, problem


def test_a_record_that_cannot_be_written_refuses_a_claim_before_any_nvml_call(
    dra_node: DraNode,
) -> None:
    record = dra_node.root / OWNERS_NAME
    record.unlink()
    record.mkdir()
    claim = dra_node.add_claim(allocated_claim("asr", "uid-1", {"gpu": "gpu-0-mig-1g18gb-19-3"}))

    error = dra_node.kubelet.prepare([claim])["uid-1"].error

    assert f"the ownership record {record} is a folder" in error, error
    assert dra_node.layout(0) == []  # nothing was made
    assert not list(dra_node.cdi_dir.glob("*uid-1*"))


def test_a_second_driver_on_the_node_never_takes_the_firsts_claims(dra_node: DraNode) -> None:
    import dataclasses

    from nodeagent.agent.factory import dra_driver
    from nodeagent.dra.node import NodeConfig
    from nodeagent.settings import Settings
    from tests.support.dra import no_reset

    _prepared(dra_node)
    other = "other.example.com"
    settings = Settings()
    settings = dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, driver=other))
    config = NodeConfig(other, "node-1", dra_node.root / "q", dra_node.root / "cdi-q")
    lock = dra_node.state.with_name(f".{dra_node.state.name}.lock")
    second = dra_driver(dra_node.session, settings, config, no_reset, lock)

    assert second.prepared_claims() == {} and second.waiting() == {}
    second.unprepare("uid-1")  # not its claim: nothing undone
    assert dra_node.layout(0) == [("1g.18gb", 3)]
    assert load(config.checkpoint).claims == {}
    assert set(load(dra_node.checkpoint).claims) == {"uid-1"}
    assert set(dra_node.node.prepared_claims()) == {"uid-1"}
