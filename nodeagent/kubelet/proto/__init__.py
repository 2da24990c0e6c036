"""Generated gRPC stubs for the kubelet pod-resources API (make proto regenerates them)."""
