"""Every setting of nodeagent, in one place: grouped frozen dataclasses and one loader.

Precedence, lowest first: the defaults (`groups`) -> the settings file (`--config FILE`,
`NODEAGENT_CONFIG`) -> the environment (`NODEAGENT_*`) -> command-line flags. Every setting has
exactly one row in `SPECS` (`specs`): its file key, its environment variable(s), its flag, its
parser (`parsers`) and whether a reload (SIGHUP) may change it while the agent runs ("hot") or
only a restart may.

Values are parsed and checked inside `load()` (`load`), never while the argument parser is
built, so a bad `NODEAGENT_MPS_REPLICAS` fails only the commands that use it, with one sentence
naming the variable. Every error of every source is collected and raised together as one
ConfigError.

    version: nodeagent/v1
    metrics: {address: "0.0.0.0:9401", refresh-interval: 5, gpm-interval: 5}
    reconcile: {interval: 30}
    mig: {config-file: /etc/nodeagent/mig.yaml, config: all-balanced}
    mps: {enabled: true, replicas: 4}

The ground floor of the house: it imports only errors, configfile and units, so every layer
may read its settings.
"""

from nodeagent.settings.groups import (
    DEFAULT_LABEL_PREFIX,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_MIG_CONFIG_LABEL,
    DEFAULT_MPS_ROOT,
    DEFAULT_PAUSE_COMPONENTS,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_RUN_DIR,
    GROUPS,
    MAX_ERRORS,
    VERSION,
    Dra,
    Kube,
    Labels,
    Metrics,
    Mig,
    Mps,
    Node,
    Reconcile,
    Settings,
    Sharing,
)
from nodeagent.settings.load import Source, as_document, load, merge_reload
from nodeagent.settings.parsers import Invalid, boolean, parse_address
from nodeagent.settings.specs import BY_KEY, SETTINGS_FILE_ENV, SPECS, Spec

__all__ = [
    "BY_KEY",
    "DEFAULT_LABEL_PREFIX",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_MIG_CONFIG_LABEL",
    "DEFAULT_MPS_ROOT",
    "DEFAULT_PAUSE_COMPONENTS",
    "DEFAULT_POD_RESOURCES_SOCKET",
    "DEFAULT_RUN_DIR",
    "GROUPS",
    "MAX_ERRORS",
    "SETTINGS_FILE_ENV",
    "SPECS",
    "VERSION",
    "Dra",
    "Invalid",
    "Kube",
    "Labels",
    "Metrics",
    "Mig",
    "Mps",
    "Node",
    "Reconcile",
    "Settings",
    "Sharing",
    "Source",
    "Spec",
    "as_document",
    "boolean",
    "load",
    "merge_reload",
    "parse_address",
]
