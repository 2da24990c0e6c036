"""`nodeagent plan -o dra` on emulated nodes: the ResourceClaimTemplates of the plan, valid
resource.k8s.io/v1 (strict, 1.36) as `kubectl apply` takes them, shares sized from the
workloads' compute and memory in the driver's steps, a driver named by NODEAGENT_DRA_DRIVER;
exit 1 with the templates of what fits when some replicas do not; one sentence, exit 2, for a
name no template can carry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import yaml

from tests.support.cli import Result, assert_one_error

SHARES = """\
version: nodeagent/v1
workloads:
  - {name: asr, memory: 20G, isolation: shared, compute: 0.22}
  - {name: tts, memory: 9G, isolation: shared, compute: 0.12}
  - {name: embed, memory: 4G, isolation: shared, compute: 0.6, compute-limit: 0.8,
     compute-priority: low}
"""


def _plan(
    cli: Callable[..., Result], tmp_path: Path, text: str, *extra: str, **kw: object
) -> Result:
    (tmp_path / "w.yaml").write_text(text)
    return cli("--simulate", "h200", "plan", "-f", "w.yaml", "-o", "dra", *extra, **kw)


def test_the_templates_apply_as_they_are(cli: Callable[..., Result], tmp_path: Path) -> None:
    res = _plan(cli, tmp_path, SHARES)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.36.0", strict=True)
    asked = {
        d["metadata"]["name"]: d["spec"]["spec"]["devices"]["requests"][0]["exactly"] for d in docs
    }
    sm, memory = "gpu.nodeagent.io/sm", "gpu.nodeagent.io/memory"
    assert {n: a["capacity"]["requests"] for n, a in asked.items()} == {
        "asr": {sm: "25", memory: "20Gi"},
        "tts": {sm: "15", memory: "9Gi"},
        "embed": {sm: "60", memory: "4Gi"},
    }
    assert {a["deviceClassName"] for a in asked.values()} == {"mps.gpu.nodeagent.io"}
    (embed,) = [d for d in docs if d["metadata"]["name"] == "embed"]
    params = embed["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {
        "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare", "smLimit": 80, "priority": "low",
    }  # fmt: skip
    assert "# GPU 0: mps" in res.stdout  # the plan, as comments


def test_the_driver_name_is_the_settings(cli: Callable[..., Result], tmp_path: Path) -> None:
    res = _plan(cli, tmp_path, SHARES, env={"NODEAGENT_DRA_DRIVER": "gpu.example.com"})
    assert res.returncode == 0, res.stderr
    text = yaml.safe_dump_all(yaml.safe_load_all(res.stdout))
    assert "mps.gpu.example.com" in text and "gpu.example.com/sm" in text
    assert "nodeagent.io" not in text.replace("apiVersion: gpu.nodeagent.io/v1", "")  # fixed


def test_rounded_up_shares_that_do_not_fit_exit_1(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """0.22 + 0.12 + 0.61 is 95 % as given, 105 % as the scheduler counts the requests (25 +
    15 + 65): the plain plan places all three, the DRA plan two, and says compute ran out."""
    text = SHARES.replace(
        "compute: 0.6, compute-limit: 0.8,\n     compute-priority: low", "compute: 0.61"
    )
    (tmp_path / "w.yaml").write_text(text)
    assert cli("--simulate", "h200", "plan", "-f", "w.yaml").returncode == 0
    res = _plan(cli, tmp_path, text)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "nodeagent: 1 of 3 replicas do not fit this node; ran out of compute: the replicas need"
        " 1.05 GPUs of compute, the node has 1 (a shared replica's compute counted in 5 % steps,"
        " rounded up)"
    )
    assert len([d for d in yaml.safe_load_all(res.stdout) if d]) == 2


def test_a_shared_workload_on_a_mig_slice_says_its_limit_and_priority_do_not_apply(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """The slice's template carries no MpsShare: the comment said nothing of the dropped
    compute-limit and compute-priority."""
    text = (
        "version: nodeagent/v1\nworkloads:\n"
        "  - {name: llm, memory: 60G, isolation: mig}\n"
        "  - {name: embed, memory: 4G, isolation: shared, compute: 0.1, compute-limit: 0.5,\n"
        "     compute-priority: low}\n"
    )
    res = _plan(cli, tmp_path, text)
    assert res.returncode == 0, res.stderr
    assert (
        "# embed: 1 of 1 replicas, each a MIG slice 1g.18gb (its compute-limit and"
        " compute-priority do not apply: a slice is no MPS share)\n" in res.stdout
    )
    (embed,) = [d for d in yaml.safe_load_all(res.stdout) if d and d["metadata"]["name"] == "embed"]
    assert "config" not in embed["spec"]["spec"]["devices"]


def test_names_no_template_can_carry_are_one_sentence(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    text = (
        "version: nodeagent/v1\nworkloads:\n"
        "  - {name: ASR, memory: 4G, isolation: shared, compute: 0.1}\n"
        "  - {name: asr, memory: 4G, isolation: shared, compute: 0.1}\n"
    )
    res = _plan(cli, tmp_path, text)
    assert_one_error(res, 2, "workloads 'ASR' and 'asr' both make the claim template name 'asr'")
    assert res.stdout == ""  # nothing half-written


def test_names_with_line_separators_stay_in_their_comments(
    cli: Callable[..., Result], tmp_path: Path
) -> None:
    """YAML takes U+2028/2029 as line breaks: a name shown raw in a comment would end it and
    put the rest into the document. Shown escaped; the template name is made of its letters."""
    workloads = {
        "version": "nodeagent/v1",
        "workloads": [
            {"name": "a\u2028b: c", "memory": "10G", "isolation": "shared", "compute": 0.6},
            {"name": "x\u2029- y", "memory": "4G", "isolation": "shared", "compute": 0.3},
        ],
    }
    res = _plan(cli, tmp_path, json.dumps(workloads))
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert [d["metadata"]["name"] for d in docs] == ["a-b--c", "x---y"]
    assert "# a\\u2028b: c: 1 of 1 replicas, each an MPS share" in res.stdout
