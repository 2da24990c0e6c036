"""`nodeagent mps start|stop|status`: the MPS control daemon by hand (the agent's `mps`
settings, without the agent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nodeagent.base.errors import ConfigError, NothingMatched
from nodeagent.cli.common import Context, print_json

if TYPE_CHECKING:
    from nodeagent.mps.daemon import MpsDaemon, MpsStatus
    from nodeagent.mps.settings import MpsSettings


def mps_settings(ctx: Context) -> MpsSettings:
    from nodeagent.mps.intent import mps_daemon_settings
    from nodeagent.nvml import read_inventory

    mps = ctx.settings.mps
    if mps.devices:
        devices = mps.devices
    else:
        devices = tuple(g.index for g in read_inventory(ctx.session).gpus if not g.mig_current)
    return mps_daemon_settings(mps, devices, _kube_enabled(ctx))


def _kube_enabled(ctx: Context) -> bool:
    """Whether the agent on this node runs with Kubernetes (its MPS layout then defaults to the
    device plugin's): the commands read NODEAGENT_KUBE as the agent does, nothing else of it."""
    from nodeagent.settings import Invalid, boolean

    try:
        return boolean(ctx.environ.get("NODEAGENT_KUBE", "false"))
    except Invalid:
        return False


def _mps_daemon(ctx: Context, check: bool = True) -> MpsDaemon:
    from nodeagent.mps.daemon import MpsDaemon
    from nodeagent.mps.settings import Limits, validate
    from nodeagent.nvml import read_inventory
    from nodeagent.nvml.write import ComputeModeWriter

    settings = mps_settings(ctx)
    limits = validate(settings, read_inventory(ctx.session)) if check else Limits(0, {}, "")
    return MpsDaemon(settings, limits, ComputeModeWriter(ctx.session))


def _print_mps(ctx: Context, status: MpsStatus) -> None:
    if ctx.args.output == "json":
        print_json(status.to_dict())
        return
    if not status.running:
        print("MPS control daemon: not running")
        return
    print(f"MPS control daemon: running, pid {status.pid}")
    print(f"  default active thread percentage: {status.thread_percentage}")
    for device, n in sorted(status.pinned_bytes.items()):
        print(
            f"  pinned memory limit, device {device}: {'none' if n is None else f'{n >> 20} MiB'}"
        )
    clients = sum(len(c) for c in status.clients.values())
    print(f"  servers: {status.servers or 'none'}; clients: {clients}")


def _check_plugin(ctx: Context, settings: MpsSettings) -> None:
    """In the device plugin's layout the daemon must serve what the plugin can: every full
    GPU, and no MIG GPU on the node (nodeagent.sharing.deviceplugin). Raises ConfigError."""
    from nodeagent.nvml import read_inventory
    from nodeagent.sharing.deviceplugin import advertised
    from nodeagent.sharing.offers import planned_offers

    inventory = read_inventory(ctx.session)
    offers = planned_offers(inventory, None, None, set(settings.devices), settings.replicas)
    problem = advertised(offers, ctx.settings.labels.mig_strategy).problem
    if problem is not None:
        raise ConfigError(problem)


def cmd_mount_shm(ctx: Context) -> int:
    """The device plugin's `<root>/shm` tmpfs, before the agent starts (an init container
    with a Bidirectional mount of the MPS root, as upstream's `mount-shm`)."""
    from nodeagent.mps.layout import mount_shm, paths, shm_size_kib

    mps = ctx.settings.mps
    where = paths("device-plugin", mps.root)
    assert where.shm_dir is not None
    print(mount_shm(where.shm_dir, shm_size_kib(mps.shm_size)))
    return 0


def cmd_mps(ctx: Context) -> int:
    action = ctx.args.mps_command
    if action == "mount-shm":
        return cmd_mount_shm(ctx)
    if action == "start":
        from nodeagent.mps.layout import DEVICE_PLUGIN
        from nodeagent.mps.manager import prepare_layout

        daemon = _mps_daemon(ctx)
        if daemon.settings.layout == DEVICE_PLUGIN:
            _check_plugin(ctx, daemon.settings)
            prepare_layout(daemon.settings)
        with ctx.changing():
            status = daemon.start()
        _print_mps(ctx, status)
        return 0
    daemon = _mps_daemon(ctx, check=False)
    if action == "stop":
        pid = daemon.control.daemon_pid()
        with ctx.changing():
            daemon.stop()  # also removes a stale ready file
        if pid is None:
            raise NothingMatched(
                f"no MPS control daemon runs with pipe directory {daemon.settings.pipe_dir};"
                " nothing to stop"
            )
        print(f"MPS control daemon stopped (pid {pid})")
        return 0
    status = daemon.status()
    _print_mps(ctx, status)
    return 0 if status.running else 1
