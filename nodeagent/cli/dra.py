"""`nodeagent dra deviceclasses`: the DeviceClasses for the DRA driver's devices on this node's
GPUs (or the emulator's, `--simulate h200,a100-80gb`), with the device plugin's extended
resource names (nodeagent.dra.classes), for `kubectl apply -f -`."""

from __future__ import annotations

import sys
from typing import Any

from nodeagent.cli.common import Context

HEADER = """\
# DeviceClasses of the DRA driver {driver} (`nodeagent dra deviceclasses`), for:
{models}
# A pod asks a claim for one of these classes, or, unchanged, for the device plugin's extended
# resource (extendedResourceName: nvidia.com/gpu, nvidia.com/mig-<profile>) on the nodes whose
# allocatable does not hold it (DRAExtendedResource: beta, on, from Kubernetes 1.36). docs/dra.md.
"""


def cmd_dra_deviceclasses(ctx: Context) -> int:
    from nodeagent.dra.classes import device_classes, dump_classes
    from nodeagent.nvml import read_inventory

    inventory = read_inventory(ctx.session)
    driver = ctx.settings.dra.driver
    products = sorted({g.name for g in inventory.gpus})
    models = "\n".join(f"#   {name}" for name in products) or "#   (no GPU)"
    header = HEADER.format(driver=driver, models=models)
    sys.stdout.write(dump_classes(device_classes([inventory], driver), header))
    return 0


def add_dra_parser(sub: Any) -> None:
    dra = sub.add_parser("dra", help="the DRA driver: its DeviceClasses")
    drasub = dra.add_subparsers(dest="dra_command", metavar="DRACOMMAND")
    drasub.required = True
    p = drasub.add_parser(
        "deviceclasses",
        help="the DeviceClasses for this node's GPUs (nvidia.com/gpu, nvidia.com/mig-<profile>)",
    )
    p.set_defaults(func=cmd_dra_deviceclasses, groups=("node", "dra"))
