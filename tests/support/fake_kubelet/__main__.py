"""`python -m tests.support.fake_kubelet`: wait for a device plugin to register, drive it, print the result.

Exit codes: 0 done; 1 no plugin registered in time; 2 the plugin answered an error or broke the
protocol. The line `fake-kubelet: listening on <socket>` goes to stderr once the socket is up.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.support.fake_kubelet.kubelet import DEVICE_PLUGIN_DIR, FakeKubeletError, run
from tests.support.fake_kubelet.session import Session


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_kubelet", description=__doc__
    )
    parser.add_argument(
        "--dir", type=Path, default=DEVICE_PLUGIN_DIR,
        help=f"the device-plugins folder where plugin endpoints are (default: {DEVICE_PLUGIN_DIR})",
    )  # fmt: skip
    parser.add_argument(
        "--socket", type=Path, default=None,
        help="the kubelet socket to serve (default: DIR/kubelet.sock)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for it all")
    parser.add_argument("--allocate", type=int, default=1, help="devices for one container")
    parser.add_argument("--resource", default=None, help="wait for this resource name")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def _text(session: Session) -> str:
    r = session.registration
    lines = [f"registered {r.resource_name} at {r.endpoint} (API {r.version})"]
    lines += [f"device {d.id} {d.health}" for d in session.devices]
    if session.preferred_device_ids is not None:
        lines.append(f"preferred {','.join(session.preferred_device_ids)}")
    if session.allocation is not None:
        a = session.allocation
        lines.append(f"allocated {','.join(a.device_ids)}")
        lines += [f"env {k}={v}" for k, v in a.envs.items()]
        lines += [
            f"mount {m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}"
            for m in a.mounts
        ]
        lines += [
            f"device-node {d.host_path} -> {d.container_path} {d.permissions}" for d in a.devices
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    socket = args.socket or args.dir / "kubelet.sock"

    def listening() -> None:
        print(f"fake-kubelet: listening on {socket}", file=sys.stderr, flush=True)

    try:
        session = run(
            args.dir,
            args.timeout,
            args.allocate,
            args.socket,
            args.resource,
            on_listening=listening,
        )
    except TimeoutError as err:
        print(f"fake-kubelet: {err}", file=sys.stderr)
        return 1
    except FakeKubeletError as err:
        print(f"fake-kubelet: {err}", file=sys.stderr)
        return 2
    print(json.dumps(session.to_dict(), indent=2) if args.json else _text(session))
    return 0


if __name__ == "__main__":
    sys.exit(main())
