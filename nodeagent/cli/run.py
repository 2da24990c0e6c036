"""`nodeagent run` (the agent), `nodeagent metrics`, `nodeagent labels`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from nodeagent.agent import SLICES_ANNOTATION, Agent, AgentConfig, KubeConfig
from nodeagent.cli.common import (
    Context,
    add_mig_config_flags,
    add_reset_flag,
    log,
    output_flag,
    print_json,
    reset_for,
)
from nodeagent.cli.mps import add_mps_flags, cmd_mps, mps_settings
from nodeagent.errors import ConfigError
from nodeagent.kube.api import KubeSettings
from nodeagent.kube.clients import ClientSettings, parse_selector
from nodeagent.kube.podresources import DEFAULT_SOCKET
from nodeagent.labels.nfd import DEFAULT_FEATURES_FILE
from nodeagent.labels.render import DEFAULT_PREFIX, render_labels, slice_usage
from nodeagent.metrics.server import DEFAULT_METRICS_ADDRESS
from nodeagent.nvml import read_inventory


def cmd_labels(ctx: Context) -> int:
    inventory = read_inventory(ctx.session)
    labels = render_labels(inventory, prefix=ctx.args.label_prefix)
    if ctx.args.output == "json":
        print_json({"labels": labels, "annotations": {SLICES_ANNOTATION: slice_usage(inventory)}})
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
        mps=mps_settings(ctx) if getattr(a, "mps", False) else None,
        label_prefix=getattr(a, "label_prefix", DEFAULT_PREFIX),
        nfd_features_file=Path(a.nfd_features_file)
        if getattr(a, "nfd_features_file", None)
        else None,
        kube=_kube_config(ctx),
    )
    return Agent(ctx.session, config, reset_for(ctx))


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


def add_run_parsers(sub: Any) -> None:
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
    add_mig_config_flags(p, "to keep applied")
    add_reset_flag(p)
    p.add_argument("--mps", action="store_true", help="start, supervise and publish the MPS daemon")
    p.add_argument(
        "--nfd-features-file",
        default=os.environ.get("NODEAGENT_NFD_FEATURES_FILE") or None,
        help=f"write labels for NFD's local source here (e.g. {DEFAULT_FEATURES_FILE})",
    )
    _label_prefix_flag(p)
    add_mps_flags(p)
    _kube_flags(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("metrics", help="print one Prometheus exposition to stdout")
    p.set_defaults(func=cmd_metrics)
    p = sub.add_parser("labels", help="the node labels nodeagent publishes (GFD names)")
    output_flag(p)
    _label_prefix_flag(p)
    p.set_defaults(func=cmd_labels)
    mps = sub.add_parser("mps", help="the MPS control daemon: start, stop, status")
    mps.add_argument("mps_command", choices=("start", "stop", "status"))
    output_flag(mps)
    add_mps_flags(mps)
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
