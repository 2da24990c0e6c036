"""The Kubernetes-edges import contract (pyproject.toml) covers every DRA module: each one is
either a named edge (it may talk to Kubernetes or gRPC) or a source the contract forbids them,
so a new module in nodeagent/dra/ cannot slip past the rule unlisted."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EDGES = {"api", "allocated", "slices", "reports", "binding", "server", "driver"}


def test_every_dra_module_is_an_edge_or_forbidden_kubernetes() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    (edges,) = [c for c in contracts if c["name"] == "Only the Kubernetes edges talk to Kubernetes"]
    listed = {m.removeprefix("nodeagent.dra.") for m in edges["source_modules"]}
    modules = {p.stem for p in (REPO / "nodeagent" / "dra").glob("*.py")} - {"__init__"}
    assert sorted(modules - listed - EDGES) == []
    assert sorted(EDGES & listed) == []
    assert sorted(EDGES - modules) == []
