"""`nodeagent plan -o dra`'s templates (nodeagent.dra.plans): valid resource.k8s.io/v1 objects
(kubernetes-validate, strict, 1.36), and claims the node's published devices hold where the
plan put the replicas: share requests in the share device's request policy (multiples of 5,
rounded up) summing to at most its capacity per GPU, MIG slices of a profile the GPU has."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.base.errors import ConfigError
from nodeagent.dra.capacity import SM_STEP_PERCENT
from nodeagent.dra.devices import resource_slices
from nodeagent.dra.plans import render_claims, share_percent, template_document, templates
from nodeagent.nvml import Inventory
from nodeagent.planner.planner import NodePlan, plan_node
from nodeagent.planner.workloads import Workload, parse_workloads
from tests.unit.dra.test_devices import DRIVER, inventory

SM, MEMORY = f"{DRIVER}/sm", f"{DRIVER}/memory"
GIB = 1 << 30


def W(name: str, gib: float, isolation: str, replicas: int = 1, **kw: Any) -> Workload:
    return Workload(name, replicas, int(gib * GIB), isolation, **kw)


def _quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def _docs(
    inv: Inventory, ws: list[Workload], step: int = SM_STEP_PERCENT
) -> tuple[NodePlan, dict[str, dict[str, Any]]]:
    plan = plan_node(inv, ws, step)
    return plan, {t.name: template_document(t, DRIVER) for t in templates(plan, ws, inv.gpus)}


def _published(inv: Inventory) -> dict[str, dict[str, Any]]:
    slices = resource_slices(inv, "n", DRIVER, shares="gpus")
    return {d["name"]: d for s in slices for d in s.spec.get("devices", [])}


def check_the_node_holds_the_claims(inv: Inventory, ws: list[Workload], plan: NodePlan) -> None:
    """Each placed replica's claim, given the device of the GPU the plan put it on, as the
    scheduler would: the share's requests in the device's policy and, summed per device, in
    its capacity; a slice of a profile the GPU publishes; a whole GPU that exists."""
    devices = _published(inv)
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in templates(plan, ws, inv.gpus):
        (request,) = template_document(t, DRIVER)["spec"]["spec"]["devices"]["requests"]
        requests[t.workload.name].append(request["exactly"])
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for p in plan.placed:
        mine = requests[p.workload]
        if p.mode == "mps":
            (request,) = [r for r in mine if r["deviceClassName"] == f"mps.{DRIVER}"]
            device = devices[f"gpu-{p.gpu}-mps"]
            assert device["attributes"]["shareOf"] == {"string": "gpu"}
            policy = device["capacity"][SM]["requestPolicy"]["validRange"]
            sm = int(request["capacity"]["requests"][SM])
            assert sm % int(policy["step"]) == 0 and int(policy["min"]) <= sm <= int(policy["max"])
            used[device["name"]][SM] += sm
            used[device["name"]][MEMORY] += _quantity(request["capacity"]["requests"][MEMORY])
            assert used[device["name"]][SM] <= int(device["capacity"][SM]["value"])
            assert used[device["name"]][MEMORY] <= _quantity(device["capacity"][MEMORY]["value"])
        elif p.mode == "mig":
            wanted = f'.profile == "{p.profile}"'
            (request,) = [r for r in mine if wanted in str(r.get("selectors"))]
            assert request["deviceClassName"] == f"mig.{DRIVER}"
            assert any(
                d["attributes"].get("profile") == {"string": p.profile}
                for name, d in devices.items()
                if name.startswith(f"gpu-{p.gpu}-mig-") and not name.endswith("-mps")
            )
        else:
            (request,) = [r for r in mine if r["deviceClassName"] == DRIVER]
            assert f"gpu-{p.gpu}" in devices


VOICE = [
    W("asr", 20, "shared", compute=0.22),
    W("tts", 9, "shared", compute=0.12),
    W("embed", 4, "shared", compute=0.6, compute_limit=0.7, compute_priority="low"),
]


def test_shares_are_sized_from_compute_and_memory_and_validate() -> None:
    inv = inventory("h200")
    plan, docs = _docs(inv, VOICE)
    assert len(plan.placed) == 3 and plan.gpus[0].strategy == "mps"
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.36.0", strict=True)
    asr = docs["asr"]["spec"]["spec"]["devices"]
    (request,) = asr["requests"]
    assert request["exactly"]["deviceClassName"] == f"mps.{DRIVER}"
    assert request["exactly"]["capacity"]["requests"] == {SM: "25", MEMORY: "20Gi"}  # 22 up
    assert "config" not in asr  # no limit, no priority: the driver's defaults
    assert docs["tts"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"][
        "requests"
    ] == {SM: "15", MEMORY: "9Gi"}
    embed = docs["embed"]["spec"]["spec"]["devices"]
    assert embed["requests"][0]["exactly"]["capacity"]["requests"] == {SM: "60", MEMORY: "4Gi"}
    (config,) = embed["config"]
    assert config == {
        "requests": ["share"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.nodeagent.io/v1",
                "kind": "MpsShare",
                "smLimit": 70,
                "priority": "low",
            },
        },
    }
    check_the_node_holds_the_claims(inv, VOICE, plan)


def test_rounded_requests_are_what_the_plan_counts() -> None:
    """0.22 + 0.12 + 0.61 fit one GPU as they are (95 %); as the scheduler counts them (25 +
    15 + 65 = 105 %) they do not, and the DRA plan leaves one out where the other fits all."""
    ws = [*VOICE[:2], W("embed", 4, "shared", compute=0.61)]
    inv = inventory("h200")
    assert len(plan_node(inv, ws).placed) == 3
    plan, _ = _docs(inv, ws)
    assert len(plan.placed) == 2
    check_the_node_holds_the_claims(inv, ws, plan)


@pytest.mark.parametrize(
    ("compute", "sms", "gpu_sms", "percent"),
    [
        (0.01, None, 132, 5),  # the least a share asks for
        (0.05, None, 132, 5),
        (0.051, None, 132, 10),  # rounded up, never down
        (1.0, None, 132, 100),
        (None, None, 132, 5),  # no need given: one step
        (None, 33, 132, 25),
        (None, 34, 132, 30),  # 25.8 % -> 30
    ],
)
def test_share_percent_rounds_up_to_the_step(
    compute: float | None, sms: int | None, gpu_sms: int, percent: int
) -> None:
    w = W("w", 1, "shared", compute=compute, sms=sms)
    assert share_percent(w, gpu_sms) == percent


def test_a_limit_is_at_least_the_request() -> None:
    """compute 0.31 asks 35 %; a compute-limit of 0.33 would be under it: the limit is 35."""
    inv = inventory("h200")
    ws = [W("a", 4, "shared", compute=0.31, compute_limit=0.33), W("b", 4, "shared", compute=0.6)]
    _, docs = _docs(inv, ws)
    (config,) = docs["a"]["spec"]["spec"]["devices"]["config"]
    assert config["opaque"]["parameters"]["smLimit"] == 35


def test_slices_and_whole_gpus() -> None:
    inv = inventory("h200x2")
    ws = [W("llm", 60, "mig"), W("small", 15, "mig", 3), W("train", 130, "exclusive")]
    plan, docs = _docs(inv, ws)
    assert len(plan.placed) == 5, plan
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.36.0", strict=True)
    (train,) = docs["train"]["spec"]["spec"]["devices"]["requests"]
    assert train == {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    (small,) = docs["small"]["spec"]["spec"]["devices"]["requests"]
    assert small["exactly"]["deviceClassName"] == f"mig.{DRIVER}"
    (selector,) = small["exactly"]["selectors"]
    assert selector["cel"]["expression"] == (
        'device.attributes["gpu.nodeagent.io"].profile == "1g.18gb"'
    )
    check_the_node_holds_the_claims(inv, ws, plan)


def test_a_workload_in_two_kinds_of_place_gets_a_template_per_kind() -> None:
    """Two 38 GiB replicas on an H200: a 3g.71gb and a 4g.71gb slice, a template for each."""
    inv = inventory("h200")
    ws = [W("llm", 38, "mig", 2)]
    plan, docs = _docs(inv, ws)
    assert sorted(p.profile or "" for p in plan.placed) == ["3g.71gb", "4g.71gb"]
    assert sorted(docs) == ["llm-3g-71gb", "llm-4g-71gb"]
    assert sum(t.replicas for t in templates(plan, ws, inv.gpus)) == 2
    check_the_node_holds_the_claims(inv, ws, plan)


@pytest.mark.parametrize(
    ("names", "words"),
    [
        (["ASR", "asr"], "workloads 'ASR' and 'asr' both make the claim template name 'asr'"),
        (["!!"], "workload '!!' makes no claim template name"),
        (["a" * 253, "b"], None),
    ],
)
def test_names_that_make_no_template_name_are_one_sentence(
    names: list[str], words: str | None
) -> None:
    inv = inventory("h200")
    ws = [W(n, 1, "shared", compute=0.1) for n in names]
    plan = plan_node(inv, ws, SM_STEP_PERCENT)
    if words is None:
        assert [t.name for t in templates(plan, ws, inv.gpus)] == ["a" * 253, "b"]
        return
    with pytest.raises(ConfigError) as info:
        render_claims(plan, ws, inv.gpus, DRIVER)
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_render_is_a_stream_kubectl_applies_with_the_plan_as_comments() -> None:
    import yaml

    inv = inventory("h200")
    text = render_claims(plan_node(inv, VOICE, SM_STEP_PERCENT), VOICE, inv.gpus, DRIVER)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["metadata"]["name"] for d in docs] == ["asr", "tts", "embed"]
    assert "# GPU 0: mps" in text and "# embed: 1 of 1 replicas, each an MPS share" in text


def test_workload_file_keys_reach_the_claim() -> None:
    wf = parse_workloads(
        "version: nodeagent/v1\nworkloads:\n"
        "  - {name: e, memory: 4G, isolation: shared, compute: 0.2, compute-limit: 0.5,"
        " compute-priority: low}\n",
        "w.yaml",
    )
    (w,) = wf.workloads
    assert (w.compute_limit, w.compute_priority) == (0.5, "low")


SHARED = st.lists(
    st.builds(
        lambda i, gib, compute, replicas: W(f"w{i}", gib, "shared", replicas, compute=compute),
        st.integers(0, 10**6),
        st.integers(1, 40),
        st.one_of(st.none(), st.integers(1, 100).map(lambda n: n / 100)),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda w: w.name,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SHARED)
def test_any_planned_shares_fit_the_devices_as_the_scheduler_counts(ws: list[Workload]) -> None:
    inv = INVENTORY
    plan, _ = _docs(inv, ws)
    assert sum(t.replicas for t in templates(plan, ws, inv.gpus)) == len(plan.placed)
    check_the_node_holds_the_claims(inv, ws, plan)


INVENTORY = inventory("h200x2")
