"""The MPS control program's answers, and its daemon's log, read as what they are (issue 44
class 6): bytes, UTF-8 or not; numbers in ASCII digits of a bounded count. Anything else is one
sentence (MpsError), never Python's UnicodeDecodeError or ValueError, and never a wrong value:
float() reads Arabic-Indic digits, and int() read '٤٢' as pid 42."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.base.errors import MpsError
from nodeagent.base.units import decimal, is_digits, whole_number
from nodeagent.mps.control import MpsControl
from nodeagent.mps.servers import ShareKey, ShareServers, Stall

LONG = "1" * 5000  # int() of it fails: Python's limit on converting long digit strings


def answering(tmp_path: Path, data: bytes) -> MpsControl:
    """A control program that answers `data` to any command, exit code 0 (as the real one)."""
    answer = tmp_path / "answer"
    answer.write_bytes(data)
    program = tmp_path / "control"
    program.write_text(f"#!/bin/sh\ncat >/dev/null\nexec cat {answer}\n")
    program.chmod(0o755)
    return MpsControl(str(program), tmp_path / "pipe", tmp_path / "log")


@pytest.mark.parametrize(
    ("data", "pids"),
    [
        (b"\n", []),  # no server yet: an empty line
        (b"4242\n", [4242]),
        (b"4242\n4243\n", [4242, 4243]),
        (b"Server 4242 not found\n", []),  # get_client_list of a server that went
    ],
)
def test_pid_lists(tmp_path: Path, data: bytes, pids: list[int]) -> None:
    control = answering(tmp_path, data)
    assert control.server_pids() == pids
    assert control.client_pids(4242) == pids


NOT_A_PID = "not a process id (ASCII digits)"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\xff\xfe4242\n", "with bytes that are not UTF-8 text (b'\\xff\\xfe4242\\n' at byte 0)"),
        ("٤٢\n".encode(), f"with '٤٢', {NOT_A_PID}"),
        ("4²\n".encode(), f"with '4²', {NOT_A_PID}"),
        (f"{LONG}\n".encode(), f"with '{'1' * 63}…', {NOT_A_PID}"),
        (b"0\n", f"with '0', {NOT_A_PID}"),
        (b"-1\n", f"with '-1', {NOT_A_PID}"),
    ],
)  # fmt: skip
def test_a_pid_list_it_cannot_read_is_a_sentence(tmp_path: Path, data: bytes, words: str) -> None:
    control = answering(tmp_path, data)
    with pytest.raises(MpsError) as err:
        control.server_pids()
    assert str(err.value) == f"the MPS control program answered 'get_server_list' {words}"


@pytest.mark.parametrize(
    ("data", "value"),
    [(b"25.0\n", 25.0), (b"100\n", 100.0), ("٢٥.0\n".encode(), None), (b"nan\n", None),
     (b"1e400\n", None), (b"\xff25.0\n", None)],
)  # fmt: skip
def test_a_percentage(tmp_path: Path, data: bytes, value: float | None) -> None:
    control = answering(tmp_path, data)
    if value is not None:
        assert control.percentage("get_default_active_thread_percentage") == value
        return
    with pytest.raises(MpsError, match=r"^the MPS control program answered "):
        control.percentage("get_default_active_thread_percentage")


def test_the_control_log_is_read_in_ascii_digits_of_a_bounded_count(tmp_path: Path) -> None:
    """A share server's log names the clients of another user that wait behind it; a line of
    5,000 digits gave ValueError to the share watch every 2 s, Arabic-Indic ones a pid."""
    servers = ShareServers(tmp_path)
    key = ShareKey("gpu-0-mps", 0, "GPU-0", 1000)
    log = servers.where(key) / "log"
    log.mkdir(parents=True)
    me = os.getpid()
    (log / "control.log").write_text(
        f"[x] NEW CLIENT {LONG} from user 0: Server is not ready\n"
        f"[x] NEW CLIENT {me} from user {LONG}: Server is not ready\n"
        f"[x] NEW CLIENT ٤٢ from user 0: Server is not ready\n"
        f"[x] NEW CLIENT {me} from user 0: Server is not ready, push client to pending list\n"
    )
    assert servers.stalls(key) == [Stall(key, me, 0)]


@pytest.mark.parametrize(
    ("text", "number"),
    [("0", 0), ("20", 20), ("0100", 100), ("9" * 18, 10**18 - 1), ("9" * 19, None), (LONG, None),
     ("٢٠", None), ("²", None), ("20\n", None), (" 20", None), ("+20", None), ("-1", None),
     ("", None), (20, None)],
)  # fmt: skip
def test_whole_numbers_are_ascii_digits_of_a_bounded_count(
    text: object, number: int | None
) -> None:
    assert whole_number(text) == number
    assert is_digits(text) is (number is not None) if isinstance(text, str) else True
    assert whole_number("12345", 4) is None and whole_number("1234", 4) == 1234


@pytest.mark.parametrize(
    ("text", "number"),
    [("25.0", 25.0), ("25", 25.0), ("٢٥", None), ("nan", None), ("inf", None), ("1e3", None),
     (" 25", None), ("25.", None), (".5", None), ("-1", None)],
)  # fmt: skip
def test_decimals(text: str, number: float | None) -> None:
    assert decimal(text) == number
