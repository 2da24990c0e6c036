"""The `nodeagent` command line: the composition root. Nothing imports this module."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import generate_latest

from nodeagent import __version__
from nodeagent.agent import SLICES_ANNOTATION, Agent, AgentConfig, KubeConfig
from nodeagent.errors import AgentError, ConfigError, NvmlError
from nodeagent.kube.api import KubeSettings
from nodeagent.kube.clients import ClientSettings, parse_selector
from nodeagent.kube.podresources import DEFAULT_SOCKET
from nodeagent.labels.nfd import DEFAULT_FEATURES_FILE
from nodeagent.labels.render import DEFAULT_PREFIX, render_labels, slice_usage
from nodeagent.logs import configure_logging
from nodeagent.metrics.server import DEFAULT_METRICS_ADDRESS
from nodeagent.mig.apply import (
    DEFAULT_RESET_COMMAND,
    Reset,
    assert_config,
    command_reset,
    reconfigure,
)
from nodeagent.mig.config import MigConfigFile, dump_config, parse_config
from nodeagent.mig.generate import export_current, generate_configs
from nodeagent.mps.daemon import MpsDaemon, MpsStatus
from nodeagent.mps.settings import (
    DEFAULT_ROOT,
    Limits,
    MpsSettings,
    parse_devices,
    parse_pinned,
    validate,
)
from nodeagent.nvml import NvmlSession, load_real_library, open_session, read_inventory
from nodeagent.nvml.write import ComputeModeWriter
from nodeagent.render import render_inventory
from nodeagent.sim import SimulatedNvml, open_emulator

MIB = 1024 * 1024
NVML_DRIVER_NOT_LOADED = 9
NVML_LIBRARY_NOT_FOUND = 12
log = structlog.get_logger("nodeagent")


@dataclass
class Context:
    """What every command gets: the parsed flags and a lazily opened NVML session."""

    args: argparse.Namespace
    _lib: Any = None
    _session: NvmlSession | None = None

    @property
    def simulate(self) -> str | None:
        spec: str | None = self.args.simulate
        return spec

    @property
    def lib(self) -> Any:
        if self._lib is None:
            if self.simulate:
                state = Path(self.args.sim_state) if self.args.sim_state else None
                self._lib = open_emulator(self.simulate, state)
            else:
                self._lib = load_real_library()
        return self._lib

    @property
    def session(self) -> NvmlSession:
        if self._session is None:
            try:
                self._session = open_session(self.lib)
            except NvmlError as err:
                if err.code in (NVML_DRIVER_NOT_LOADED, NVML_LIBRARY_NOT_FOUND):
                    raise NvmlError(
                        err.code,
                        err.function,
                        f"{err.nvml_message}; no NVIDIA driver on this machine"
                        " (use --simulate SPEC to run on the built-in emulator)",
                    ) from err
                raise
        return self._session

    def emulator(self, command: str) -> SimulatedNvml:
        if not self.simulate:
            raise ConfigError(f"'nodeagent sim {command}' needs --simulate SPEC (the emulator)")
        if not self.args.sim_state:
            raise ConfigError(
                f"'nodeagent sim {command}' needs --sim-state PATH, or the change is lost"
                " when the command exits"
            )
        lib = self.lib
        assert isinstance(lib, SimulatedNvml)
        return lib


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def cmd_status(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    if ctx.args.output == "json":
        _print_json(inventory.to_dict())
    else:
        sys.stdout.write(render_inventory(inventory))
    return 0


def cmd_sim_attach(ctx: Context) -> int:
    if ctx.args.pid <= 0:
        raise ConfigError(f"--pid must be a positive process id, not {ctx.args.pid}")
    if ctx.args.memory_mib < 0:
        raise ConfigError(f"--memory-mib must be 0 or more, not {ctx.args.memory_mib}")
    if not 0.0 <= ctx.args.load <= 1.0:
        raise ConfigError(f"--load must be between 0 and 1, not {ctx.args.load}")
    where = ctx.emulator("attach").attach(
        ctx.args.device, ctx.args.pid, ctx.args.memory_mib * MIB, ctx.args.load
    )
    print(f"pid {ctx.args.pid} attached to {where} with {ctx.args.memory_mib} MiB")
    return 0


def cmd_sim_detach(ctx: Context) -> int:
    ctx.emulator("detach").detach(ctx.args.pid)
    print(f"pid {ctx.args.pid} detached")
    return 0


def cmd_sim_reset(ctx: Context) -> int:
    ctx.emulator("reset").reset(ctx.args.gpu)
    print(f"GPU {ctx.args.gpu} reset")
    return 0


def _read_config(ctx: Context) -> MigConfigFile:
    path = ctx.args.file
    if not path:
        raise ConfigError("no MIG config file: pass -f FILE or set NODEAGENT_MIG_CONFIG_FILE")
    if path == "-":
        return parse_config(sys.stdin.read(), "<stdin>")
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read MIG config file {path}: {err.strerror}") from err
    return parse_config(text, path)


def _config_name(ctx: Context) -> str:
    name: str | None = ctx.args.config
    if not name:
        raise ConfigError("no config name: pass -c NAME or set NODEAGENT_MIG_CONFIG")
    return name


def _reset(ctx: Context) -> Reset:
    template: str | None = getattr(ctx.args, "reset_command", None)
    if template:
        try:
            return command_reset(template)
        except ValueError as err:
            raise ConfigError(f"--reset-command: {err}") from err
    if ctx.simulate:
        emulator = ctx.lib
        assert isinstance(emulator, SimulatedNvml)
        return emulator.reset
    return command_reset()


def _describe_op(op: dict[str, Any]) -> str:
    text = f"GPU {op['gpu']}: {op['op']}"
    if "enabled" in op:
        text += " enabled" if op["enabled"] else " disabled"
    if "profile" in op:
        text += f" {op['profile']}"
    if "placement" in op:
        text += f" at {op['placement']['start']}:{op['placement']['size']}"
    ids = [
        f"GI {op['gi_id']}" if "gi_id" in op else "",
        f"CI {op['ci_id']}" if "ci_id" in op else "",
    ]
    ids = [i for i in ids if i]
    return text + (f" ({', '.join(ids)})" if ids else "")


def cmd_mig_apply(ctx: Context) -> int:
    cfg = _read_config(ctx)
    name = _config_name(ctx)
    outcome = reconfigure(ctx.session, cfg, name, _reset(ctx), dry_run=ctx.args.dry_run)
    ops = (
        [op.to_dict() for op in outcome.plan.operations] if ctx.args.dry_run else list(outcome.done)
    )
    if ctx.args.output == "json":
        _print_json({"config": name, "dry_run": ctx.args.dry_run, "operations": ops})
        return 0
    verb = "would run" if ctx.args.dry_run else "ran"
    if not ops:
        print(f"config {name!r}: the GPUs already match; nothing to change")
        return 0
    for op in ops:
        print(_describe_op(op))
    print(f"config {name!r}: {verb} {len(ops)} NVML operation{'s' if len(ops) != 1 else ''}")
    return 0


def cmd_mig_assert(ctx: Context) -> int:
    cfg = _read_config(ctx)
    name = _config_name(ctx)
    problems, _ = assert_config(ctx.session, cfg, name)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"config {name!r}: the GPUs match")
    return 0


def cmd_mig_export(ctx: Context) -> int:
    sys.stdout.write(dump_config(export_current(read_inventory(ctx.session))))
    return 0


def cmd_mig_generate(ctx: Context) -> int:
    sys.stdout.write(dump_config(generate_configs(read_inventory(ctx.session))))
    return 0


def _mig_parser(sub: Any) -> None:
    mig = sub.add_parser("mig", help="MIG geometry: apply, assert, export, generate-config")
    migsub = mig.add_subparsers(dest="mig_command", metavar="MIGCOMMAND")
    migsub.required = True

    def config_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-f",
            "--file",
            default=os.environ.get("NODEAGENT_MIG_CONFIG_FILE") or None,
            help="mig-parted v1 config file, - for stdin (env NODEAGENT_MIG_CONFIG_FILE)",
        )
        p.add_argument(
            "-c",
            "--config",
            default=os.environ.get("NODEAGENT_MIG_CONFIG") or None,
            help="name of the config in the file (env NODEAGENT_MIG_CONFIG)",
        )

    p = migsub.add_parser("apply", help="bring the GPUs to a config, changing only what must")
    config_flags(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument(
        "--reset-command",
        default=os.environ.get("NODEAGENT_MIG_RESET_COMMAND") or None,
        help="run for a GPU whose MIG mode stays pending (Ampere); {index} is the GPU"
        f" (default '{DEFAULT_RESET_COMMAND}'; env NODEAGENT_MIG_RESET_COMMAND)",
    )
    _output_flag(p)
    p.set_defaults(func=cmd_mig_apply)
    p = migsub.add_parser("assert", help="exit 0 when the GPUs match a config, 1 when not")
    config_flags(p)
    p.set_defaults(func=cmd_mig_assert)
    p = migsub.add_parser("export", help="the current geometry as a v1 config named 'current'")
    p.set_defaults(func=cmd_mig_export)
    p = migsub.add_parser("generate-config", help="default configs for the GPUs present")
    p.set_defaults(func=cmd_mig_generate)


def _mps_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    g = p.add_argument_group(
        "MPS (the same settings for `nodeagent mps` and `nodeagent run --mps`)"
    )
    g.add_argument(
        "--mps-devices",
        default=env("NODEAGENT_MPS_DEVICES"),
        help="GPU indices, e.g. 0,1 (default: every GPU without MIG)",
    )
    g.add_argument(
        "--mps-replicas",
        type=int,
        default=int(env("NODEAGENT_MPS_REPLICAS", "2")),
        help="clients sharing each GPU (>= 2; env NODEAGENT_MPS_REPLICAS)",
    )
    g.add_argument(
        "--mps-thread-percentage",
        type=int,
        default=None,
        help="default active thread percentage, 1-100 (default 100 // replicas)",
    )
    g.add_argument(
        "--mps-pinned-memory",
        default=env("NODEAGENT_MPS_PINNED_MEMORY"),
        help="per-GPU pinned memory limit: SIZE or INDEX=SIZE,... (default memory / replicas)",
    )
    g.add_argument(
        "--mps-pipe-dir", default=env("CUDA_MPS_PIPE_DIRECTORY", str(DEFAULT_ROOT / "pipe"))
    )
    g.add_argument(
        "--mps-log-dir", default=env("CUDA_MPS_LOG_DIRECTORY", str(DEFAULT_ROOT / "log"))
    )
    g.add_argument("--mps-ready-file", default=str(DEFAULT_ROOT / "ready"))
    g.add_argument(
        "--mps-control",
        default=env("NODEAGENT_MPS_CONTROL", "nvidia-cuda-mps-control"),
        help="the control program (env NODEAGENT_MPS_CONTROL)",
    )
    g.add_argument(
        "--mps-exclusive-process",
        action="store_true",
        help="switch the GPUs to EXCLUSIVE_PROCESS while MPS runs",
    )
    g.add_argument(
        "--mps-probe-interval", type=float, default=5.0, help="seconds between health probes"
    )


def _mps_settings(ctx: Context) -> MpsSettings:
    a = ctx.args
    if a.mps_devices:
        devices = parse_devices(a.mps_devices)
    else:
        devices = tuple(g.index for g in read_inventory(ctx.session).gpus if not g.mig_current)
    return MpsSettings(
        devices=devices,
        replicas=a.mps_replicas,
        thread_percentage=a.mps_thread_percentage,
        pinned_memory=parse_pinned(a.mps_pinned_memory, devices),
        pipe_dir=Path(a.mps_pipe_dir),
        log_dir=Path(a.mps_log_dir),
        ready_file=Path(a.mps_ready_file),
        control_binary=a.mps_control,
        exclusive_process=a.mps_exclusive_process,
        probe_interval_seconds=a.mps_probe_interval,
    )


def _mps_daemon(ctx: Context, check: bool = True) -> MpsDaemon:
    settings = _mps_settings(ctx)
    limits = validate(settings, read_inventory(ctx.session)) if check else Limits(0, {}, "")
    return MpsDaemon(settings, limits, ComputeModeWriter(ctx.session))


def _print_mps(ctx: Context, status: MpsStatus) -> None:
    if ctx.args.output == "json":
        _print_json(status.to_dict())
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


def cmd_mps(ctx: Context) -> int:
    action = ctx.args.mps_command
    if action == "start":
        status = _mps_daemon(ctx).start()
        _print_mps(ctx, status)
        return 0
    daemon = _mps_daemon(ctx, check=False)
    if action == "stop":
        daemon.stop()
        print("MPS control daemon stopped")
        return 0
    status = daemon.status()
    _print_mps(ctx, status)
    return 0 if status.running else 1


def cmd_labels(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    labels = render_labels(inventory, prefix=ctx.args.label_prefix)
    if ctx.args.output == "json":
        _print_json({"labels": labels, "annotations": {SLICES_ANNOTATION: slice_usage(inventory)}})
    else:
        for key, value in labels.items():
            print(f"{key}={value}")
    return 0


def _kube_config(ctx: Context) -> KubeConfig | None:
    a = ctx.args
    if not getattr(a, "kube", False):
        return None
    if not a.node_name:
        raise ConfigError(
            "--kube needs the node's name: --node-name or NODE_NAME (the downward API)"
        )
    pause: dict[str, dict[str, str]] = {}
    try:
        for item in a.pause_component:
            name, sep, selector = item.partition("=")
            if not sep or not name:
                raise ValueError(f"--pause-component {item!r} must be NAME=KEY=VALUE[,KEY=VALUE]")
            pause[name] = parse_selector(selector)
        restart = tuple(parse_selector(item) for item in a.restart_pods)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    settings = KubeSettings(
        node_name=a.node_name,
        host=a.kube_host,
        kubeconfig=a.kubeconfig,
        watch_timeout_seconds=a.watch_timeout,
    )
    socket = Path(a.pod_resources_socket) if a.pod_resources_socket else None
    clients = ClientSettings(pause=pause, restart=restart, wait_seconds=a.clients_wait_seconds)
    return KubeConfig(settings, clients, socket)


def _agent(ctx: Context) -> Agent:
    a = ctx.args
    config = AgentConfig(
        metrics_address=getattr(a, "metrics_address", DEFAULT_METRICS_ADDRESS),
        refresh_interval_seconds=getattr(a, "refresh_interval", 5.0),
        gpm_interval_seconds=getattr(a, "gpm_interval", 1.0),
        reconcile_interval_seconds=getattr(a, "reconcile_interval", 30.0),
        mig_config_file=getattr(a, "file", None),
        mig_config=getattr(a, "config", None),
        mps=_mps_settings(ctx) if getattr(a, "mps", False) else None,
        label_prefix=getattr(a, "label_prefix", DEFAULT_PREFIX),
        nfd_features_file=Path(a.nfd_features_file)
        if getattr(a, "nfd_features_file", None)
        else None,
        kube=_kube_config(ctx),
    )
    return Agent(ctx.session, config, _reset(ctx))


def cmd_metrics(ctx: Context) -> int:
    """One exposition to stdout: the GPUs read, GPM sampled twice 100+ ms apart."""
    agent = _agent(ctx)
    agent.refresh()
    agent.gpm.tick()
    time.sleep(0.12)
    agent.gpm.tick()
    agent.gpm.close()
    sys.stdout.write(generate_latest(agent.registry).decode())
    return 0


def cmd_run(ctx: Context) -> int:
    """The daemon: metrics endpoint, samplers and (with -f/-c) the MIG reconcile loop."""
    agent = _agent(ctx)
    stop = threading.Event()
    # Samplers and renders are Python work on other threads; a short GIL switch interval
    # keeps a scrape from queueing behind them (5 ms by default).
    sys.setswitchinterval(0.0005)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("agent.stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.start()
    assert agent.server is not None
    print(
        f"nodeagent running: metrics on port {agent.server.port}"
        " (/metrics, /healthz, /readyz); Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    stop.wait()
    agent.stop()
    return 0


def _run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="the agent: metrics endpoint, samplers, MIG reconcile loop")
    p.add_argument(
        "--metrics-address",
        default=os.environ.get("NODEAGENT_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
        help=f"HOST:PORT to serve /metrics (default {DEFAULT_METRICS_ADDRESS};"
        " env NODEAGENT_METRICS_ADDRESS)",
    )
    p.add_argument("--refresh-interval", type=float, default=5.0, help="seconds between GPU reads")
    p.add_argument("--gpm-interval", type=float, default=1.0, help="seconds between GPM samples")
    p.add_argument(
        "--reconcile-interval", type=float, default=30.0, help="seconds between reconciles"
    )
    p.add_argument(
        "-f",
        "--file",
        default=os.environ.get("NODEAGENT_MIG_CONFIG_FILE") or None,
        help="MIG config file to keep applied (env NODEAGENT_MIG_CONFIG_FILE)",
    )
    p.add_argument(
        "-c",
        "--config",
        default=os.environ.get("NODEAGENT_MIG_CONFIG") or None,
        help="name of the MIG config to keep applied (env NODEAGENT_MIG_CONFIG)",
    )
    p.add_argument("--reset-command", default=os.environ.get("NODEAGENT_MIG_RESET_COMMAND") or None)
    p.add_argument("--mps", action="store_true", help="start, supervise and publish the MPS daemon")
    p.add_argument(
        "--nfd-features-file",
        default=os.environ.get("NODEAGENT_NFD_FEATURES_FILE") or None,
        help=f"write labels for NFD's local source here (e.g. {DEFAULT_FEATURES_FILE})",
    )
    _label_prefix_flag(p)
    _mps_flags(p)
    _kube_flags(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("metrics", help="print one Prometheus exposition to stdout")
    p.set_defaults(func=cmd_metrics)
    p = sub.add_parser("labels", help="the node labels nodeagent publishes (GFD names)")
    _output_flag(p)
    _label_prefix_flag(p)
    p.set_defaults(func=cmd_labels)
    mps = sub.add_parser("mps", help="the MPS control daemon: start, stop, status")
    mps.add_argument("mps_command", choices=("start", "stop", "status"))
    _output_flag(mps)
    _mps_flags(mps)
    mps.set_defaults(func=cmd_mps)


def _kube_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    g = p.add_argument_group("Kubernetes (the node label protocol, GPU clients, pod-resources)")
    g.add_argument(
        "--kube",
        action="store_true",
        default=env("NODEAGENT_KUBE") == "1",
        help="publish labels to this Node and follow nvidia.com/mig.config (env NODEAGENT_KUBE=1)",
    )
    g.add_argument("--node-name", default=env("NODE_NAME"), help="this node's name (env NODE_NAME)")
    g.add_argument(
        "--kubeconfig", default=env("KUBECONFIG"), help="outside a cluster: the kubeconfig file"
    )
    g.add_argument(
        "--kube-host",
        default=env("NODEAGENT_KUBE_HOST"),
        help="API server URL without credentials (tests)",
    )
    g.add_argument(
        "--pause-component",
        action="append",
        default=[],
        metavar="NAME=SELECTOR",
        help="pause this GPU client around a change: nvidia.com/gpu.deploy.NAME is set to"
        " paused-for-mig-change until the pods matching SELECTOR left the node (repeatable)",
    )
    g.add_argument(
        "--restart-pods",
        action="append",
        default=[],
        metavar="SELECTOR",
        help="delete pods on this node matching SELECTOR after a change, so they see the new"
        " slices (repeatable)",
    )
    g.add_argument(
        "--clients-wait-seconds",
        type=float,
        default=300.0,
        help="how long paused clients may take to leave",
    )
    g.add_argument(
        "--pod-resources-socket",
        default=env("NODEAGENT_POD_RESOURCES_SOCKET", str(DEFAULT_SOCKET)),
        help="kubelet pod-resources socket ('' to not ask)",
    )
    g.add_argument(
        "--watch-timeout", type=float, default=60.0, help="seconds before the node watch is renewed"
    )


def _label_prefix_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--label-prefix",
        default=os.environ.get("NODEAGENT_LABEL_PREFIX") or DEFAULT_PREFIX,
        help=f"label prefix (default {DEFAULT_PREFIX}; another one beside GFD)",
    )


def _output_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("text", "json"), default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodeagent",
        description="GPU node agent: MIG geometry, MPS, node labels, Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        default=os.environ.get("NODEAGENT_SIMULATE") or None,
        help="use the built-in GPU emulator, e.g. h200, h200x8, a100-40gbx2,h100-80gb "
        "(env NODEAGENT_SIMULATE)",
    )
    parser.add_argument(
        "--sim-state",
        metavar="PATH",
        default=os.environ.get("NODEAGENT_SIM_STATE") or None,
        help="keep the emulated GPUs' state in this JSON file (env NODEAGENT_SIM_STATE)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument("--log-format", default="auto", choices=("auto", "json", "console"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("status", help="GPUs, MIG mode, slices, memory and processes")
    _output_flag(p)
    p.set_defaults(func=cmd_status)

    _mig_parser(sub)
    _run_parser(sub)

    sim = sub.add_parser("sim", help="drive the emulator as a user would (needs --simulate)")
    simsub = sim.add_subparsers(dest="sim_command", metavar="SIMCOMMAND")
    simsub.required = True
    p = simsub.add_parser("attach", help="start an emulated process on a GPU or MIG device")
    p.add_argument("--device", required=True, help="GPU index, GPU UUID or MIG UUID")
    p.add_argument("--pid", required=True, type=int)
    p.add_argument("--memory-mib", type=int, default=1024)
    p.add_argument("--load", type=float, default=1.0, help="share of the SMs it keeps busy, 0-1")
    p.set_defaults(func=cmd_sim_attach)
    p = simsub.add_parser("detach", help="end an emulated process")
    p.add_argument("--pid", required=True, type=int)
    p.set_defaults(func=cmd_sim_detach)
    p = simsub.add_parser("reset", help="reset one emulated GPU (nvidia-smi -r -i N)")
    p.add_argument("--gpu", "-i", required=True, type=int)
    p.set_defaults(func=cmd_sim_reset)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (0 ok, 1 false/none, 2 bad input, 3 GPU refused)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its message (exit 2 on bad flags)
        return int(exc.code) if isinstance(exc.code, int) else 2
    configure_logging(args.log_level, args.log_format)
    func: Callable[[Context], int] = args.func
    try:
        return func(Context(args))
    except AgentError as err:
        print(f"nodeagent: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `nodeagent status | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
