"""Upstream MIG config files as test data (tests/fixtures/upstream/README.md names repository,
path and commit): the GPU operator's default ConfigMap and mig-parted's files. Every config is
planned on every emulated GPU model; on the models whose profiles it names it plans, applies
and verifies; on the others it fails naming the profile the model lacks, and only there."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from nodeagent.base.errors import ConfigError, NothingMatched
from nodeagent.mig.config import MigConfigFile, parse_config
from nodeagent.mig.plan import mismatches, plan
from nodeagent.mig.select import resolve
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.nvml.inventory import Inventory
from nodeagent.sim import SimulatedNvml
from nodeagent.sim.models import MODEL_NAMES
from tests.support.mig_apply import reconfigure

UPSTREAM = Path(__file__).resolve().parents[2] / "fixtures" / "upstream"
OPERATOR = UPSTREAM / "gpu-operator" / "assets" / "state-mig-manager" / "0400_configmap.yaml"
FILES = {
    "operator": OPERATOR,
    "mig-parted-default": UPSTREAM
    / "mig-parted"
    / "deployments"
    / "systemd"
    / "config-default.yaml",
    "mig-parted-example": UPSTREAM / "mig-parted" / "examples" / "config.yaml",
    "mig-parted-dgx-station": UPSTREAM / "mig-parted" / "examples" / "dgx-station-80gb-config.yaml",
}


@cache
def upstream(name: str) -> MigConfigFile:
    path = FILES[name]
    text = path.read_text()
    if name == "operator":  # a ConfigMap: the file is its data's config.yaml
        text = yaml.safe_load(text)["data"]["config.yaml"]
    return parse_config(text, path.name)


@cache
def node(model: str) -> Inventory:
    """A 2-GPU node of `model`, read once (the planning below never changes it)."""
    return read_inventory(NvmlSession(SimulatedNvml([model, model])))


@cache
def result(file: str, name: str, model: str) -> str:
    """outcome() for config `name` of the upstream `file`, worked out once."""
    return outcome(upstream(file), name, model)


def outcome(cfg: MigConfigFile, name: str, model: str) -> str:
    """'planned', 'lacks <profile>' or 'not selected' for config `name` on a 2-GPU node of
    `model`."""
    inventory = node(model)
    try:
        desired = resolve(cfg, name, inventory, [])
    except NothingMatched:
        return "not selected"
    except ConfigError as err:
        text = str(err)
        assert "no MIG profile" in text or "no compute-instance profile" in text, text
        assert inventory.gpus[0].name in text, text  # the model is named
        return "lacks " + text.split("no MIG profile ")[-1].split(";")[0]
    plan(inventory, desired)
    return "planned"


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_upstream_file_parses_whole(name: str) -> None:
    assert upstream(name).configs


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_operator_config_plans_or_names_the_missing_profile(model: str) -> None:
    cfg = upstream("operator")
    outcomes = {name: result("operator", name, model) for name in cfg.configs}
    planned = [n for n, o in outcomes.items() if o == "planned"]
    # all-disabled, all-enabled and all-balanced (one entry per model family) hold everywhere.
    assert {"all-disabled", "all-enabled", "all-balanced"} <= set(planned), outcomes
    # Every all-<profile> config whose profile this model has is planned.
    profiles = {p.name for p in node(model).gpus[0].profiles}
    for name, outcome in outcomes.items():
        wanted = name.removeprefix("all-")
        for p in profiles:
            if wanted in (p, p.replace("+", ".")):
                assert outcome == "planned", (name, outcome)


def test_every_operator_config_is_planned_on_some_emulated_model() -> None:
    cfg = upstream("operator")
    unplanned = [
        name
        for name in cfg.configs
        if not any(result("operator", name, model) == "planned" for model in MODEL_NAMES)
    ]
    # A pre-production GB200's profile names (mig-parted ebab1f77 renamed them for the
    # production board, which the gb200 model follows: 3g.93gb, 4g.93gb, 7g.186gb).
    assert unplanned == ["all-3g.95gb", "all-4g.95gb", "all-7g.189gb"], unplanned


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_planned_operator_configs_apply_verify_and_are_minimal(model: str) -> None:
    cfg = upstream("operator")
    lib = SimulatedNvml([model, model])
    session = NvmlSession(lib)
    for name in cfg.configs:
        if result("operator", name, model) != "planned":
            continue
        out = reconfigure(session, cfg, name, lib.reset)
        assert mismatches(out.inventory, out.desired) == [], name
        again = plan(read_inventory(session), resolve(cfg, name, read_inventory(session), []))
        assert again.operations == (), (name, again.to_dict())
