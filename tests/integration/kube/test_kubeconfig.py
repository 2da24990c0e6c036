"""The kubeconfig is read with a cap and only as a regular file: anything else is one sentence,
exit 2, before any Kubernetes call (the client's own reader took /dev/zero until memory ran
out, and waited for ever on a FIFO)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import Result, assert_one_error


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "kc")
    return str(tmp / "kc")


def _large(tmp: Path) -> str:
    (tmp / "kc").write_bytes(b"# " + b"x" * (4 * 1024 * 1024) + b"\napiVersion: v1\n")
    return str(tmp / "kc")


@pytest.mark.parametrize(
    ("where", "words"),
    [
        (lambda _tmp: "/dev/zero", ("kubeconfig /dev/zero", "a character device, not a file")),
        (_fifo, ("kubeconfig", "a FIFO, not a file")),
        (lambda tmp: str(tmp), ("kubeconfig", "not a file")),
        (_large, ("kubeconfig", "larger than 4 MiB")),
    ],
    ids=["dev-zero", "fifo", "directory", "over-4-MiB"],
)
def test_a_kubeconfig_that_is_no_small_regular_file_is_refused(
    tmp_path: Path, cli: Callable[..., Result], where: Callable[[Path], str], words: tuple[str, ...]
) -> None:
    res = cli("--simulate", "h200", "run", "--kube", "--node-name", "n", "--metrics-address",
              "127.0.0.1:0", "--kubeconfig", where(tmp_path))  # fmt: skip
    assert_one_error(res, 2, *words)
