"""A run's report: what changed, or the step that failed and why; logged once."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.base.errors import AgentError, RebootRequired
from nodeagent.base.logs import get_logger
from nodeagent.mig.apply import Done
from nodeagent.mig.plan import mismatches
from nodeagent.reconcile.ports import Report
from nodeagent.reconcile.run import Run

log = get_logger("nodeagent.reconcile")


def _shares(run: Run, published: Mapping[int, tuple[str, int]]) -> dict[int, tuple[str, int]]:
    """What each GPU offers after this run: the sharing config's intents when one was
    resolved (also on a dry run), else what was published."""
    if run.sharing is not None:
        return {i: (it.strategy, it.replicas) for i, it in sorted(run.sharing.intents.items())}
    return dict(published)


def report_of(
    run: Run,
    failure: tuple[str, BaseException] | None,
    published: Mapping[int, tuple[str, int]],
    log_failures: bool,
    dry_run: bool = False,
) -> Report:
    """The report of `run`. A dry run's `done` lists the planned operations, and its
    `differences` how the GPUs differ from a MIG config (mig-parted's assert)."""
    generation = run.snapshot.generation if run.snapshot else 0
    differences: tuple[str, ...] = ()
    if dry_run and failure is None:
        run.done = [Done.planned(op) for op in run.mig_plan.operations]
        if run.desired is not None and run.snapshot is not None and run.sharing is None:
            found = mismatches(run.snapshot.inventory, run.desired)
            differences = (*found, *run.uncovered)
    ops = len(run.done)
    if failure is None:
        if not dry_run and (ops or run.mps_change.action != "none"):
            log.info(
                "reconcile.changed",
                origin=run.wanted.origin,
                mig_config=run.wanted.mig_config,
                sharing_config=run.wanted.sharing_config,
                operations=ops,
                mps=run.mps_change.action,
                steps=run.took_ms,
            )
        return Report(
            "success", run.wanted, None, None, ops, run.mps_change.action, generation,
            tuple(run.done), _shares(run, published), differences=differences,
        )  # fmt: skip
    step, err = failure
    text = str(err) if isinstance(err, AgentError) else f"internal error: {err!r}"
    if isinstance(err, RebootRequired) and run.wanted.after_reboot:
        text += "; the node rebooted and it is still pending"
    (log.error if log_failures else log.debug)(
        "reconcile.failed",
        step=step,
        error=text,
        origin=run.wanted.origin,
        mig_config=run.wanted.mig_config,
        sharing_config=run.wanted.sharing_config,
        steps=run.took_ms,
        exc_info=not isinstance(err, AgentError),
    )
    return Report(
        "failure", run.wanted, step, f"{step}: {text}", ops, run.mps_change.action,
        generation, tuple(run.done), _shares(run, published), err,
    )  # fmt: skip
