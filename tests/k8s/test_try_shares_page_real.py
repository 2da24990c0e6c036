"""docs/try-shares.md does what it says, on the suite's control plane (its blocks marked
`<!-- runnable-k8s: SPEC -->`, in order, as one bash script; the page's up.sh is the suite's
fixture): `nodeagent plan -o dra` sizes three shares from a workload file, the real scheduler
puts their claims on one share device with the planned requests as consumedCapacity and keeps a
fourth that does not fit Pending, the driver prepares the three as clients of one (fake) MPS
server whose answers are each client's limits, the last unprepare stops the server, and the
agent stops with exit 0."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.k8s import ControlPlane
from tests.support.pages import REPO, run_page

PAGE = REPO / "docs" / "try-shares.md"
PODS = ["asr-0", "tts-0", "embed-0", "asr-1"]
CLIENT = re.compile(
    r"^(\S+): gpu-0-mps, request (\d+) %, client limit (\d+) %, server (\d+) gave ([\d.]+) %"
    r" and memory \{'0': '(\d+G)'\}, priority ([01])$",
    re.M,
)


def test_the_try_shares_page_runs(control_plane: ControlPlane, short_tmp: Path) -> None:
    cleanup = [
        ["pod", *PODS, "--force", "--grace-period=0"],
        ["resourceclaimtemplate", "asr", "tts", "embed"],
    ]
    proc = run_page(PAGE, control_plane, short_tmp, "shares", cleanup)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    out = proc.stdout
    assert "gpu-0-mps: sm 100 %, memory 143771Mi" in out, out
    counted = re.findall(r"^(\w+)-0-gpu-\w+: gpu-0-mps sm (\d+) memory (\w+)$", out, re.M)
    assert counted == [("asr", "25", "20Gi"), ("tts", "15", "9Gi"), ("embed", "60", "4Gi")], out
    assert "pod/asr-1 condition met" in out  # Unschedulable: 25 more would make 125 %
    clients = CLIENT.findall(out)
    assert [(c[0], c[1], c[5]) for c in clients] == [
        ("asr-0", "25", "20G"), ("tts-0", "15", "9G"), ("embed-0", "60", "4G"),
    ], out  # fmt: skip
    assert len({c[3] for c in clients}) == 1, out  # one server for the three
    # each its own limit (the default 100, TTS's smLimit 30), as its server gives it; the
    # embedder at low priority
    assert [(c[2], c[6]) for c in clients] == [("100", "0"), ("30", "0"), ("100", "1")], out
    assert all(float(c[4]) == float(c[2]) for c in clients), out
    assert "share servers: ['gpu-0-mps-u0']" in out
    assert re.search(r"embed-0 unprepared\n0\n", out), out  # the last one gone: the server too
    assert "Traceback" not in (short_tmp / "shares" / "agent.log").read_text()
