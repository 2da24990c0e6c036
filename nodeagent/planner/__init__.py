"""The planner: from workload demand to the per-GPU sharing config that serves it. Pure."""
