"""What the agent does on its host beside NVML: the hooks file, host duties (CDI refresh,
reboot), systemd notifications."""
