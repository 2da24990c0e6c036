"""The per-GPU sharing config (nodeagent/v1) and its pure resolution to one intent per GPU."""
