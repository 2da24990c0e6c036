"""MIG geometry: profiles, layouts, the v1 config format, validation, the plan; apply.py."""
