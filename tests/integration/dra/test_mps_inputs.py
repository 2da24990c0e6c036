"""Shares the scheduler could not have made, and an MPS control program whose answers cannot
be read (issue 44, classes 5 and 6): each refused at prepare in one sentence, and the prepare's
undo leaves nothing behind: no record entry (`preparing`, holding the GPU), no CDI spec, no
daemon, no server folder. A share server's `pipe` and `log` folders (and the server's own
folder) are never followed through a link."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.dra.test_share_servers import servers, share
from tests.integration.dra.test_share_users import add_pod, container, nothing_of, prepare
from tests.support.dra import DraNode, allocated_claim, mps_config
from tests.support.fake_kubelet.dra import Claim

kmock = pytest.importorskip("kmock")

H200_MIB = 143771  # an H200's memory, in MiB, as the emulator's recorded table has it
SLICE_MIB = 16384  # a 1g.18gb slice's


def left_nothing(node: DraNode, uid: str) -> None:
    """The refused claim holds nothing: no entry in the record (not even `preparing`), no CDI
    spec, no share server folder, no MPS daemon of its own."""
    assert nothing_of(node, uid)
    assert node.node.owners.read().claims == {}
    assert servers(node) == []
    assert list((node.root / "p" / "mps").glob("*")) == []


@pytest.mark.parametrize(
    ("device", "memory", "words"),
    [
        ("gpu-0-mps", "1Ti", f"its share's memory (1048576 MiB) is more than GPU 0 has ({H200_MIB} MiB)"),
        ("gpu-0-mps", str((H200_MIB + 1) << 20),
         f"its share's memory ({H200_MIB + 1} MiB) is more than GPU 0 has ({H200_MIB} MiB)"),
        ("gpu-0-mig-1g18gb-19-2-mps", "1Ti",
         f"its share's memory (1048576 MiB) is more than a 1g.18gb slice has ({SLICE_MIB} MiB)"),
    ],
)  # fmt: skip
def test_a_share_above_its_devices_memory_is_refused(
    dra_node: DraNode, device: str, memory: str, words: str
) -> None:
    assert dra_node.inventory().gpus[0].memory_total_bytes == H200_MIB << 20
    error = prepare(dra_node, share("asr", "uid-asr", device, 30, memory))["uid-asr"]
    assert error == f"claim speech/asr: device {device}: {words}; the scheduler hands out no more than the device's memory capacity"  # fmt: skip
    left_nothing(dra_node, "uid-asr")
    assert dra_node.layout(0) == []  # no slice made for it


def answers(folder: Path, monkeypatch: pytest.MonkeyPatch, **by_command: bytes) -> None:
    """The fake control daemons started from now on answer these bytes to these commands."""
    folder.mkdir()
    for command, data in by_command.items():
        (folder / command).write_bytes(data)
    monkeypatch.setenv("FAKE_MPS_ANSWERS", str(folder))


SHARE = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
OWN = allocated_claim("asr", "uid-asr", {"gpu": "gpu-1"}, mps_config(25))  # a daemon of its own


NOT_UTF8 = (
    "get_default_active_thread_percentage",
    b"\xff\xfe25.0\n",
    "the MPS control program answered 'get_default_active_thread_percentage' with bytes that are"
    " not UTF-8 text (b'\\xff\\xfe25.0\\n' at byte 0)",
)
NOT_ASCII = (
    "get_default_active_thread_percentage",
    "٢٥.0\n".encode(),
    "MPS limits did not hold: default active thread percentage is None, wanted",
)


@pytest.mark.parametrize(
    ("claim", "command", "data", "words"),
    [
        (SHARE, *NOT_UTF8),
        (OWN, *NOT_UTF8),
        (SHARE, *NOT_ASCII),
        (OWN, *NOT_ASCII),
        (SHARE, "get_server_list", b"\x80\n",
         "answered 'get_server_list' with bytes that are not UTF-8"),
        (SHARE, "get_server_list", "٤٢\n".encode(),
         "the MPS control program answered 'get_server_list' with '٤٢', not a process id (ASCII"
         " digits)"),
        (SHARE, "get_default_device_pinned_mem_limit", ("1" * 5000 + "G\n").encode(),
         "MPS limits did not hold: pinned memory limit of MPS device 0 is unset, wanted 8192M"),
    ],
    ids=["share-not-utf8", "own-not-utf8", "share-not-ascii", "own-not-ascii",
         "servers-not-utf8", "servers-not-ascii", "limit-of-5000-digits"],
)  # fmt: skip
def test_answers_it_cannot_read_refuse_the_claim_and_the_undo_leaves_nothing(
    dra_node: DraNode,
    monkeypatch: pytest.MonkeyPatch,
    claim: dict[str, Any],
    command: str,
    data: bytes,
    words: str,
) -> None:
    """The undo meets the same answers (the daemon it stops answers them too) and still
    releases the claim: today its UnicodeDecodeError left it `preparing`, holding the GPU."""
    answers(dra_node.root / "answers", monkeypatch, **{command: data})
    error = prepare(dra_node, claim)["uid-asr"]
    assert words in error
    assert "Traceback" not in error and "Error" not in error.split(":")[0]
    left_nothing(dra_node, "uid-asr")
    monkeypatch.delenv("FAKE_MPS_ANSWERS")
    assert prepare(dra_node, claim) == {"uid-asr": ""}  # the GPU was free again


@pytest.mark.parametrize(
    ("link", "words"),
    [
        ("gpu-0-mps-u0/pipe", "the MPS pipe folder {where}/gpu-0-mps-u0/pipe is a symbolic link"),
        ("gpu-0-mps-u0/log", "the MPS log folder {where}/gpu-0-mps-u0/log is a symbolic link"),
        ("gpu-0-mps-u0", "the MPS share server folder {where}/gpu-0-mps-u0 is a symbolic link"),
    ],
)
def test_a_share_servers_folders_are_never_followed_through_a_link(
    dra_node: DraNode, link: str, words: str
) -> None:
    where = dra_node.root / "p" / "mps-shared"
    outside = dra_node.root / "outside"
    outside.mkdir()
    (where / link).parent.mkdir(parents=True, exist_ok=True)
    (where / link).symlink_to(outside, target_is_directory=True)
    error = prepare(dra_node, SHARE)["uid-asr"]
    assert error.startswith("claim speech/asr: " + words.format(where=where))
    assert error.endswith("nodeagent does not follow it (the daemon's files would be written"
                          " where it points): remove it")  # fmt: skip
    assert list(outside.iterdir()) == []  # nothing of the daemon's was written there
    assert nothing_of(dra_node, "uid-asr") and dra_node.node.owners.read().claims == {}


@pytest.mark.parametrize("name", ["gpu-\u0660-mps", "gpu-0-mps\n", "gpu-00-mps", "gpu-²-mps"])
def test_another_name_for_gpu_0s_share_device_starts_no_second_daemon(
    dra_node: DraNode, name: str
) -> None:
    """Read with \\d and $, 'gpu-\u0660-mps' and 'gpu-0-mps\\n' were GPU 0's share device under
    another name: a second MPS daemon on GPU 0 beside the first."""
    assert prepare(dra_node, SHARE) == {"uid-asr": ""}
    other = share("tts", "uid-tts", name, 30, "8Gi")
    error = prepare(dra_node, other)["uid-tts"]
    assert error == f"claim speech/tts: device {name!r} is not one gpu.nodeagent.io publishes"
    assert [p.name for p in servers(dra_node)] == ["gpu-0-mps-u0"]
    assert nothing_of(dra_node, "uid-tts")


@pytest.mark.parametrize("user", [-1, 2**31, 2**63, 10**30])
def test_a_run_as_user_that_is_no_uid_is_refused(dra_node: DraNode, user: int) -> None:
    """Each got an MPS daemon of its own (gpu-0-mps-u-1, -u2147483648, ...)."""
    claim = share("asr", "uid-asr", "gpu-0-mps", 30, "8Gi")
    add_pod(dra_node, claim, "asr-0", [container("asr", user)])
    error = prepare(dra_node, claim)["uid-asr"]
    assert error == (
        f"claim speech/asr: pod speech/asr-0: container asr runs as user {user}, not a uid (a"
        " whole number 0-2147483647); the kubelet could not run it, and its MPS server could"
        " not run as it"
    )
    left_nothing(dra_node, "uid-asr")


def test_a_link_above_a_share_servers_folder_is_never_followed(dra_node: DraNode) -> None:
    """`<plugin>/mps-shared` a link: the prepare wrote the daemon's pipe/ and log/ where it
    points; planted after a prepare, the unprepare removed that folder with what was put in
    it. Both are refused now, nothing written or removed there."""
    plugin = dra_node.root / "p"
    outside = dra_node.root / "outside"
    outside.mkdir()
    (plugin / "mps-shared").symlink_to(outside, target_is_directory=True)
    error = prepare(dra_node, SHARE)["uid-asr"]
    assert error == (
        f"claim speech/asr: {plugin}/mps-shared is a symbolic link or no folder; nodeagent does"
        f" not follow it to the MPS share server folder {plugin}/mps-shared/gpu-0-mps-u0 (the"
        " daemon's files would be written, and removed, where it points): remove it"
    )
    assert list(outside.iterdir()) == []
    assert nothing_of(dra_node, "uid-asr") and dra_node.node.owners.read().claims == {}

    (plugin / "mps-shared").unlink()
    assert prepare(dra_node, SHARE) == {"uid-asr": ""}
    (plugin / "mps-shared").rename(outside / "real")  # the server's folder moves behind a link
    (plugin / "mps-shared").symlink_to(outside / "real", target_is_directory=True)
    planted = outside / "real" / "gpu-0-mps-u0" / "planted"
    planted.write_text("kept")
    error = dra_node.kubelet.unprepare([Claim("speech", "asr", "uid-asr")])["uid-asr"]
    assert "is a symbolic link or no folder; nodeagent does not follow it" in error
    assert planted.read_text() == "kept"


def test_a_link_for_the_claims_mps_folder_is_never_followed_by_an_unprepare(
    dra_node: DraNode,
) -> None:
    """`<plugin>/mps` a link: the unprepare of any claim removed <where it points>/<uid>."""
    plugin = dra_node.root / "p"
    victim = dra_node.root / "victim"
    (victim / "uid-good").mkdir(parents=True)
    (victim / "uid-good" / "data").write_text("kept")
    good = allocated_claim("asr", "uid-good", {"g": "gpu-0-mig-1g18gb-19-0"})
    assert prepare(dra_node, good) == {"uid-good": ""}
    if (plugin / "mps").exists():
        (plugin / "mps").rmdir()
    (plugin / "mps").symlink_to(victim, target_is_directory=True)
    error = dra_node.kubelet.unprepare([Claim("speech", "asr", "uid-good")])["uid-good"]
    assert error == (
        f"claim speech/asr: {plugin}/mps is a symbolic link or no folder; nodeagent does not"
        f" follow it to the claim's MPS folder {plugin}/mps/uid-good (the daemon's files would"
        " be written, and removed, where it points): remove it"
    )
    assert (victim / "uid-good" / "data").read_text() == "kept"
    assert "uid-good" in dra_node.node.prepared_claims()  # nothing was let go
    (plugin / "mps").unlink()
    assert dra_node.kubelet.unprepare([Claim("speech", "asr", "uid-good")]) == {"uid-good": ""}
