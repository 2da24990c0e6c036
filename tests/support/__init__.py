"""What the tests share: the agent factory and the emulated node (agent.py, mig.py, host.py),
the commands' runner (cli.py), the emulated API server (cluster.py, kmock), the real control
plane (k8s.py), the DRA node (dra.py), the metrics endpoint's helpers (metrics.py), the fake
kubelet (fake_kubelet/) and the fake MPS control daemon (fake_mps/), the leak checks."""
