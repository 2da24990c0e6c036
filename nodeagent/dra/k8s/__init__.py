"""The DRA driver's Kubernetes edges: the resource.k8s.io objects it reads and writes
(`api.py`, `allocated.py`, `slices.py`, `reports.py`), the slices made before a pod binds
(`binding.py`), the kubelet plugin (`server.py`) and the driver as the agent runs it
(`driver.py`). The only modules of nodeagent.dra that talk to the API server, gRPC or
nodeagent.kube; the rest of the driver is node-local (pyproject.toml's import contracts)."""
