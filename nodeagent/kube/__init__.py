"""Kubernetes: the own Node (labels, mig.config protocol, events), GPU clients, pods."""
