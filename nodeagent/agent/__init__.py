"""The agent's wiring: the long-running service (service.py) and the pipelines and DRA driver
built from the settings for it and for the commands (factory.py)."""
