"""nodeagent: one agent per GPU node for MIG geometry, MPS, node labels and metrics."""

__version__ = "0.1.0"
