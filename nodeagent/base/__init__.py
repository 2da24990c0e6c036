"""The ground floor: errors and exit codes, units, input and output files, logs, the MIG writer
lock."""
