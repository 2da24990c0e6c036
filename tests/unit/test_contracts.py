"""The Kubernetes-edges import contract (pyproject.toml) covers every DRA module: the edges live
in nodeagent/dra/k8s/ (they may talk to Kubernetes or gRPC), and every other module of
nodeagent/dra/ is a source the contract forbids them, so a new module cannot slip past the rule
unlisted: the folder tree shows what the contract knows."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRA = REPO / "nodeagent" / "dra"
EDGES = {"api", "allocated", "slices", "reports", "binding", "server", "driver"}


def test_every_dra_module_is_an_edge_or_forbidden_kubernetes() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    (edges,) = [c for c in contracts if c["name"] == "Only the Kubernetes edges talk to Kubernetes"]
    listed = {m.removeprefix("nodeagent.dra.") for m in edges["source_modules"]}
    local = {p.stem for p in DRA.glob("*.py")} - {"__init__"}
    in_k8s = {p.stem for p in (DRA / "k8s").glob("*.py")} - {"__init__"}
    assert sorted(local - listed) == []  # every node-local module is held to the rule
    assert in_k8s == EDGES  # and the edges are the folder's, only
    assert sorted({m for m in listed if m.startswith("k8s")}) == []


def test_the_dra_api_version_is_named_in_one_place() -> None:
    """resource.k8s.io/v1 is spelled once, in nodeagent/dra/resource.py; every object and path
    of the DRA API takes it from there (docstrings may name it)."""
    import ast

    spelled = []
    for path in sorted((REPO / "nodeagent").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "resource.k8s.io" in node.value
                and id(node) not in docstrings
            ):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert spelled == ["nodeagent/dra/resource.py:6"]
