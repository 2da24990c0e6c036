"""`nodeagent run` (the agent), `nodeagent config check`, `nodeagent metrics`, `nodeagent labels`,
`nodeagent mps`."""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nodeagent.base.errors import AgentError, NvmlError
from nodeagent.cli.common import (
    Context,
    add_setting_flags,
    log,
    output_flag,
    print_json,
    reset_for,
)
from nodeagent.cli.mps import cmd_mps
from nodeagent.cli.sharing import SHARING_FLAG_NAMES
from nodeagent.settings import GROUPS, SETTINGS_FILE_ENV, SPECS, as_document

SLICES_ANNOTATION = "nodeagent.io/mig.slices"
RUN_FLAG_NAMES = {
    "mig.config-file": ("-f", "--mig-config-file"),
    "mig.config": ("-c", "--mig-config"),
}

if TYPE_CHECKING:
    from nodeagent.cli.signals import Signals
    from nodeagent.host.sdnotify import Notifier


def cmd_labels(ctx: Context) -> int:
    """The labels nodeagent publishes for the node as it is, or (-f/-c) as a sharing config
    would leave it. The device plugin config is the file set, or the folder's default or
    fallback (no node label is read here)."""
    from nodeagent.cli.pipelines import sharing_preview
    from nodeagent.labels.devicepluginconfig import DevicePluginConfigReader
    from nodeagent.labels.machine import gfd_options
    from nodeagent.labels.render import SharingState, render_labels, slice_usage
    from nodeagent.nvml import read_inventory

    inventory = read_inventory(ctx.session)
    s = ctx.settings
    offers = {g.index: ("mig" if g.mig_current else "whole", 1) for g in inventory.gpus}
    sharing = SharingState()
    if s.sharing.config:  # checked exactly as `sharing apply` checks it, nothing changed
        preview = sharing_preview(ctx)
        offers.update(preview)
        mps = [n for strategy, n in preview.values() if strategy == "mps"]
        if mps:
            sharing = SharingState("mps", mps[0])
    plugin = DevicePluginConfigReader().read(s.labels, None)
    labels = render_labels(
        inventory, sharing, s.labels.prefix, offers, gfd_options(s.labels), plugin
    )
    if ctx.args.output == "json":
        print_json({"labels": labels, "annotations": {SLICES_ANNOTATION: slice_usage(inventory)}})
    else:
        for key, value in labels.items():
            print(f"{key}={value}")
    return 0


def _agent(ctx: Context) -> Any:
    from nodeagent.agent.factory import build_agent
    from nodeagent.base.lock import lock_path

    node = ctx.settings.node
    return build_agent(
        ctx.session,
        ctx.settings,
        lambda s: reset_for(s, ctx.lib),
        lock_path=lock_path(node.run_dir, node.sim_state, bool(node.simulate)),
    )


def cmd_metrics(ctx: Context) -> int:
    """One exposition to stdout: the GPUs read, GPM sampled twice 100+ ms apart."""
    agent = _agent(ctx)
    agent.refresh()
    agent.gpm.tick()
    time.sleep(0.12)
    agent.gpm.tick()
    agent.gpm.close()
    agent.health.close()
    sys.stdout.write(agent.exposition.latest().decode())
    return 0


def cmd_config_check(ctx: Context) -> int:
    """Validate the settings (file, environment, flags) and the files `run` reads before it
    starts (nodeagent.agent.service.check_inputs, as `run` does), and print the effective ones."""
    import yaml

    from nodeagent.agent.service import check_inputs

    check_inputs(ctx.settings)
    doc = as_document(ctx.settings)
    if ctx.args.output == "json":
        sources = {k: f"{s.kind} {s.where}" for k, s in sorted(ctx.sources.items())}
        print_json({"settings": doc, "sources": sources})
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        for key, source in sorted(ctx.sources.items()):
            print(f"# {key}: from {source.kind} {source.where}")
    return 0


SIGNAL_POLL_SECONDS = 0.5


NVML_RETRY_SECONDS = 5.0


def wait_for_nvml(
    open_session: Callable[[], Any],
    wait_seconds: float,
    sleep: Callable[[float], object],
    stopped: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    status: Callable[[str], object] = lambda _: None,
) -> Any:
    """Open the NVML session; while NVML refuses (a driver still loading, the GPU operator's
    driver container not done), retry every NVML_RETRY_SECONDS for up to `wait_seconds`, one
    log line per attempt, instead of exiting into a crash loop. Returns the session, or None
    when `stopped()` (SIGTERM) during the wait. Raises the last NvmlError once the time is up."""
    began = clock()
    while True:
        try:
            return open_session()
        except NvmlError as err:
            waited = clock() - began
            if waited >= wait_seconds:
                if not wait_seconds:
                    raise
                context = f"still refused after the {wait_seconds:g} s node.nvml-wait"
                raise NvmlError(err.code, err.function, err.nvml_message, context) from err
            log.warning(
                "nvml.waiting",
                error=str(err),
                waited_seconds=round(waited),
                wait_seconds=wait_seconds,
                retry_seconds=NVML_RETRY_SECONDS,
            )
            status(f"waiting for NVML ({waited:.0f} s of {wait_seconds:g} s): {err}")
            sleep(min(NVML_RETRY_SECONDS, wait_seconds - waited))
            if stopped():
                return None


def check_gpu_settings(settings: Any, session: Any) -> None:
    """The settings that name GPUs (dra.devices, mps.devices), checked against the node's GPUs
    before the first call to the Kubernetes API: a GPU the node lacks is a mistake to say at
    once, not after the API server's retries. Raises ConfigError naming every one."""
    from nodeagent.base.errors import ConfigError
    from nodeagent.nvml import read_inventory

    named = {
        "dra.devices (--dra-devices, NODEAGENT_DRA_DEVICES)": (
            settings.dra.devices if settings.kube.enabled and settings.dra.enabled else None
        ),
        "mps.devices (--mps-devices, NODEAGENT_MPS_DEVICES)": (
            settings.mps.devices if settings.mps.enabled else None
        ),
    }
    if not any(named.values()):
        return
    with session.lock:
        have = sorted(g.index for g in read_inventory(session).gpus)
    problems = [
        f"{what} names GPU {', '.join(map(str, missing))}; this node has GPUs {have}"
        for what, devices in named.items()
        if devices and (missing := sorted(set(devices) - set(have)))
    ]
    if problems:
        raise ConfigError("\n".join(problems))


def status_line(agent: Any) -> str:
    """systemd's STATUS= (one line, `systemctl status`): GPUs, the last reconcile, health."""
    snap = agent.store.snapshot
    count = len(snap.inventory.gpus) if snap is not None else 0
    gpus = f"{count} GPU{'' if count == 1 else 's'}" if snap is not None else "no GPU read yet"
    report = agent.pipeline.last_report
    if report is None:
        reconcile = "first reconcile running"
    elif report.result == "success":
        reconcile = f"reconcile ok (config {report.wanted.mig_config or 'none'})"
    else:
        reconcile = f"reconcile failed: {report.reason}"
    healthy, why = agent.healthy()
    text = f"{gpus}; {reconcile}; {'healthy' if healthy else 'unhealthy: ' + why}"
    return " ".join(text.split())[:300]


def cmd_run(ctx: Context) -> int:
    """The daemon: metrics endpoint, samplers, the reconcile pipeline; SIGHUP reloads."""
    from nodeagent.cli.signals import Signals
    from nodeagent.host.sdnotify import Notifier

    notify = Notifier(ctx.environ)
    signals = Signals()  # on_stop: the agent's stop event once it exists
    try:
        return _serve(ctx, notify, signals)
    finally:
        signals.close()


def _serve(ctx: Context, notify: Notifier, signals: Signals) -> int:

    from nodeagent.cli.signals import Reloader

    def pause(seconds: float) -> None:  # in short slices: see the main loop below
        deadline = time.monotonic() + seconds
        while not signals.stop and (left := deadline - time.monotonic()) > 0:
            signals.wake.wait(min(left, SIGNAL_POLL_SECONDS))
            signals.wake.clear()

    session = wait_for_nvml(
        lambda: ctx.session,
        ctx.settings.node.nvml_wait_seconds,
        pause,
        lambda: signals.stop,
        status=lambda text: notify.send(f"STATUS={text}"),
    )
    if session is None:
        notify.send("STOPPING=1")
        return 0
    check_gpu_settings(ctx.settings, session)  # before the agent asks the API anything
    agent = _agent(ctx)
    signals.on_stop = agent.stop_event.set
    if signals.stop:  # asked to stop while NVML was answering: no reconcile, nothing changed
        notify.send("STOPPING=1")
        return 0
    # Samplers and renders are Python work on other threads; a short GIL switch interval
    # keeps a scrape from queueing behind them (5 ms by default).
    sys.setswitchinterval(0.0005)
    notify.send("STATUS=first reconcile")
    try:
        agent.start()
    except AgentError as err:
        if not signals.stop:
            raise
        # Asked to stop while starting: the call it cut short (an API server that does not
        # answer, an exec plugin, GPU clients) is the stop's doing, not a failure.
        notify.send("STOPPING=1")
        log.warning("agent.stopped_while_starting", interrupted=str(err))
        return 0
    # Everything loaded so far (modules, the Kubernetes client's models: 1.1e5 objects)
    # lives as long as the process: out of the collector's sight, a full collection no longer
    # walks them holding the GIL (with --kube: 85 ms, a scrape stalled as long).
    gc.collect()  # startup garbage first (once, ~0.1 s)
    gc.freeze()
    assert agent.server is not None
    if signals.stop:  # asked to stop while starting
        notify.send("STOPPING=1")
        agent.stop()
        return 0
    print(
        f"nodeagent running: metrics on port {agent.server.port}"
        " (/metrics, /healthz, /readyz); Ctrl-C stops, SIGHUP reloads the settings",
        file=sys.stderr,
        flush=True,
    )
    beat = notify.watchdog_seconds / 2 if notify.watchdog_seconds else None
    reloader = Reloader(ctx, agent, notify)
    announced, shown, pinged = False, "", -math.inf
    while True:
        # READY=1 once a reconcile succeeded (the first one, or a later retry of it);
        # WATCHDOG=1 only while /healthz would answer 200: a dead or wedged worker stops the
        # pings and systemd restarts the agent.
        if not announced and agent.ready()[0]:
            notify.send("READY=1", f"MAINPID={os.getpid()}")
            announced = True
        line = status_line(agent)
        if line != shown:
            notify.send(f"STATUS={line}")
            shown = line
        if beat is not None and time.monotonic() - pinged >= beat and agent.healthy()[0]:
            notify.send("WATCHDOG=1")
            pinged = time.monotonic()
        if signals.stop:
            break
        # The signals thread sets `wake`; the timeout keeps READY=1, STATUS= and the
        # watchdog pings current.
        signals.wake.wait(min(beat, SIGNAL_POLL_SECONDS) if beat else SIGNAL_POLL_SECONDS)
        signals.wake.clear()
        if signals.reload and not signals.stop and reloader.due(time.monotonic()):
            # Cleared before the reload: a SIGHUP that lands while it runs (the file may have
            # changed after it was read) is another reload, not lost.
            signals.reload = False
            if reloader.run(announced):
                signals.reload = True
    notify.send("STOPPING=1", "STATUS=stopping")
    log.info("agent.stopping")
    agent.stop()
    if not agent.stopped_cleanly():
        # A worker still blocked in a socket read would abort the interpreter's finalisation
        # (SIGABRT): everything of ours is done, so end here with the documented status.
        sys.stdout.flush()
        sys.stderr.flush()
        ctx.session.close()
        os._exit(0)
    return 0


def add_run_parsers(sub: Any) -> None:
    p = sub.add_parser("run", help="the agent: metrics endpoint, samplers, reconcile pipeline")
    _settings_file_flag(p)
    add_setting_flags(p, [g for g in GROUPS if g != "node"], RUN_FLAG_NAMES)
    p.set_defaults(func=cmd_run, groups=tuple(GROUPS))

    config = sub.add_parser("config", help="the agent's settings")
    csub = config.add_subparsers(dest="config_command", metavar="CONFIGCOMMAND")
    csub.required = True
    p = csub.add_parser("check", help="validate the settings and print the effective ones")
    _settings_file_flag(p)
    output_flag(p, "yaml", "json")
    add_setting_flags(p, [g for g in GROUPS if g != "node"], RUN_FLAG_NAMES)
    p.set_defaults(func=cmd_config_check, groups=tuple(GROUPS))

    p = sub.add_parser("metrics", help="print one Prometheus exposition to stdout")
    only_dcgm = [s.dotted for s in SPECS if s.group == "metrics" and s.key != "dcgm-compat"]
    add_setting_flags(p, ["metrics"], skip=only_dcgm)
    # kube: the node's name (NODE_NAME), the dcgm-compat hostname label as `run` has it
    p.set_defaults(func=cmd_metrics, groups=("node", "metrics", "kube"))
    p = sub.add_parser("labels", help="the node labels nodeagent publishes (GFD names)")
    output_flag(p)
    add_setting_flags(p, ["labels"], skip=["labels.nfd-features-file"])
    add_setting_flags(
        p, ["sharing", "mig"], SHARING_FLAG_NAMES,
        skip=["sharing.plugin-config-out", "sharing.workload-file", "mig.config",
              "mig.reset-command", "mig.lock-timeout"],
    )  # fmt: skip
    p.set_defaults(func=cmd_labels, groups=("node", "labels", "sharing", "mig", "mps"))
    mps = sub.add_parser("mps", help="the MPS control daemon: start, stop, status")
    mps.add_argument("mps_command", choices=("start", "stop", "status", "mount-shm"))
    output_flag(mps)
    add_setting_flags(mps, ["mps"], skip=["mps.enabled", "mps.stop-on-exit"])
    mps.set_defaults(func=cmd_mps, groups=("node", "mps"))


def _settings_file_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        dest="settings_file",
        metavar="FILE",
        help=f"settings file (version: nodeagent/v1; env {SETTINGS_FILE_ENV})",
    )
