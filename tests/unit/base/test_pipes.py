"""nodeagent.base.files.read_pipe: what `-f <(generate)` reads - all the writer gives until it
closes the pipe, bounded in size and in time; a FIFO nobody writes is empty at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import FileTooLarge, read_pipe


def _writer(write_end: int, chunks: list[bytes], pause_seconds: float) -> threading.Thread:
    def write() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as out:
            for chunk in chunks:
                time.sleep(pause_seconds)
                try:
                    out.write(chunk)
                except BrokenPipeError:  # the reader gave up
                    return

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_a_pipe_is_read_until_its_writer_closes_it() -> None:
    read_end, write_end = os.pipe()
    thread = _writer(write_end, [b"version: v1\n", b"mig-configs: {}\n"], 0.05)
    try:
        assert read_pipe(f"/dev/fd/{read_end}", "MIG config file", 1024, 10) == (
            b"version: v1\nmig-configs: {}\n"
        )
    finally:
        thread.join()
        os.close(read_end)


def test_a_fifo_nobody_writes_is_empty_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    began = time.monotonic()
    assert read_pipe(tmp_path / "fifo", "MIG config file", 1024, 10) == b""
    assert time.monotonic() - began < 1


def test_a_writer_that_does_not_finish_is_one_sentence() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"version: v1\n")
        with pytest.raises(ConfigError) as err:
            read_pipe(f"/dev/fd/{read_end}", "MIG config file", 1024, 0.2)
        assert str(err.value) == (
            f"cannot read MIG config file /dev/fd/{read_end}: its writer did not finish within"
            " 0.2 s"
        )
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_pipe_larger_than_the_bound_is_refused_without_reading_it_all() -> None:
    read_end, write_end = os.pipe()
    thread = _writer(write_end, [b"x" * 4096] * 4, 0)
    try:
        with pytest.raises(FileTooLarge, match="larger than 10000 bytes"):
            read_pipe(f"/dev/fd/{read_end}", "MIG config file", 10_000, 10)
    finally:
        os.close(read_end)  # the writer's next write fails: it ends
        thread.join()


def test_a_regular_file_is_not_read_as_a_pipe(tmp_path: Path) -> None:
    (tmp_path / "mig.yaml").write_text("version: v1\n")
    with pytest.raises(ConfigError, match="it is not a pipe"):
        read_pipe(tmp_path / "mig.yaml", "MIG config file", 1024, 10)
