"""nodeagent as a Kubernetes DRA driver, the pure and node-local parts: the node's GPUs as
ResourceSlice devices (KEP-4815 partitionable devices), a claim's allocation, the operations
that prepare it, the checkpoint and the CDI spec. The gRPC services and the API objects live in
nodeagent.kube.dra_*."""
