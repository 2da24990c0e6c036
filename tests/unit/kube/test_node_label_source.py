"""The node-label desire source and the state reporter, with a fake Node API: a failed config
stays failed (also across a restart) until the label changes or the state label is removed,
/readyz says why, and a lost "failed" write is reported again by the next run."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.errors import KubeError
from nodeagent.kube.controller import (
    MIG_CONFIG,
    MIG_STATE,
    REASON,
    KubeReporter,
    NodeLabelDesire,
    NodeView,
)
from nodeagent.reconcile import Report, Wanted
from nodeagent.settings import Settings


class FakeApi:
    """Merge-patches a Node held in memory; can fail the next N patches."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.node: dict[str, Any] = {"metadata": {"labels": dict(labels), "annotations": {}}}
        self.fail_patches = 0
        self.events: list[tuple[str, str]] = []

    def patch_node(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail_patches:
            self.fail_patches -= 1
            raise KubeError("Kubernetes API: patch node n1 failed: HTTP 503")
        for key in ("labels", "annotations"):
            for k, v in body.get("metadata", {}).get(key, {}).items():
                if v is None:
                    self.node["metadata"][key].pop(k, None)
                else:
                    self.node["metadata"][key][k] = v
        return {"metadata": {k: dict(v) for k, v in self.node["metadata"].items()}}

    def event(self, reason: str, message: str, kind: str = "Normal") -> None:
        self.events.append((reason, kind))


def _parts(labels: dict[str, str]) -> tuple[FakeApi, NodeView, NodeLabelDesire, KubeReporter]:
    api = FakeApi(labels)
    view = NodeView()
    view.update(api.patch_node({}))
    desire = NodeLabelDesire(view)
    return api, view, desire, KubeReporter(api, view, desire)  # type: ignore[arg-type]


def _failure(wanted: Wanted) -> Report:
    return Report("failure", wanted, "resolve", "resolve: no config named 'x'")


def test_a_failed_config_is_held_until_the_label_changes() -> None:
    api, view, desire, reporter = _parts({MIG_CONFIG: "x"})
    wanted = desire.wanted(Settings())
    assert wanted == Wanted("node-label", "x", tracked=True)
    reporter.finished(_failure(wanted))
    view.update(api.node)
    assert api.node["metadata"]["labels"][MIG_STATE] == "failed"
    assert desire.wanted(Settings()).mig_config is None  # not retried
    assert desire.failure() == "MIG config 'x' failed: resolve: no config named 'x'"
    api.patch_node({"metadata": {"labels": {MIG_CONFIG: "all-balanced"}}})
    view.update(api.node)
    assert desire.wanted(Settings()).mig_config == "all-balanced"
    assert desire.failure() is None


def test_a_failed_config_stays_failed_across_a_restart() -> None:
    _, _, desire, _ = _parts({MIG_CONFIG: "x", MIG_STATE: "failed"})
    assert desire.wanted(Settings()).mig_config is None
    assert desire.failure() is not None and "'x' failed" in desire.failure()  # type: ignore[operator]


def test_removing_the_state_label_asks_again() -> None:
    api, view, desire, _ = _parts({MIG_CONFIG: "x", MIG_STATE: "failed"})
    api.patch_node({"metadata": {"labels": {MIG_STATE: None}}})
    view.update(api.node)
    assert desire.wanted(Settings()).mig_config == "x"


def test_a_lost_failed_write_is_reported_again() -> None:
    api, _view, desire, reporter = _parts({MIG_CONFIG: "x", MIG_STATE: "pending"})
    wanted = desire.wanted(Settings())
    api.fail_patches = 1
    with pytest.raises(KubeError):
        reporter.finished(_failure(wanted))
    assert desire.wanted(Settings()).mig_config == "x"  # not held: the state never said so
    reporter.finished(_failure(desire.wanted(Settings())))
    assert api.node["metadata"]["labels"][MIG_STATE] == "failed"
    assert api.node["metadata"]["annotations"][REASON].startswith("resolve: ")


def test_success_with_nothing_to_do_writes_nothing() -> None:
    api, _view, desire, reporter = _parts({MIG_CONFIG: "x", MIG_STATE: "success"})
    before = dict(api.node["metadata"]["labels"])
    api.fail_patches = 99  # any write would raise
    reporter.finished(Report("success", desire.wanted(Settings())))
    assert api.node["metadata"]["labels"] == before and not api.events


def test_a_failed_value_is_asked_again_when_the_label_goes_away_and_back() -> None:
    """Even when the reconcile never saw the value in between (both changes between two
    runs): the label changed, so the value is a new request."""
    api, view, desire, reporter = _parts({MIG_CONFIG: "x"})
    reporter.finished(_failure(desire.wanted(Settings())))
    assert desire.wanted(Settings()).mig_config is None
    for value in ("y", "x"):
        view.update(api.patch_node({"metadata": {"labels": {MIG_CONFIG: value}}}))
    assert desire.failure() is None
    assert desire.wanted(Settings()).mig_config == "x"


def test_a_change_while_the_failing_run_ran_is_not_held() -> None:
    """The label moved away and back while the run that failed was still going: the failure
    answers the older request, the newer one is tried."""
    api, view, desire, reporter = _parts({MIG_CONFIG: "x"})
    wanted = desire.wanted(Settings())
    for value in ("y", "x"):
        view.update(api.patch_node({"metadata": {"labels": {MIG_CONFIG: value}}}))
    reporter.finished(_failure(wanted))
    assert desire.failure() is None
    assert desire.wanted(Settings()).mig_config == "x"


@pytest.mark.parametrize("odd", ["\u00b2", "9" * 5000, "-1", "1\n"])
def test_an_unreadable_resource_version_is_not_compared_and_the_view_keeps_updating(
    odd: str,
) -> None:
    def node(version: str, value: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": version, "labels": {MIG_CONFIG: value}}}

    view = NodeView()
    view.update(node("7", "a"))
    assert view.update(node(odd, "b"))  # not comparable: taken as newer, no ValueError
    assert view.labels() == {MIG_CONFIG: "b"}
    view.update(node("8", "c"))
    assert view.labels() == {MIG_CONFIG: "c"}
    assert not view.update(node("8", "c"))  # the same version changes nothing
