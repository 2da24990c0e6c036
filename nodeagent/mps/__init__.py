"""The MPS control daemon: settings, control commands, lifecycle, limits, health."""
