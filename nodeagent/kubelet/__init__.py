"""The kubelet's gRPC APIs the agent asks: pod-resources (which devices pods hold), and the
generated stubs of those and of the DRA plugin API (proto/)."""
