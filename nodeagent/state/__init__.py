"""The node's state as the agent holds it: the snapshot store and its samplers, the workers
that refresh it, the ownership record of every GPU and slice."""
