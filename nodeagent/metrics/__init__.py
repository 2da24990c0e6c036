"""Prometheus metrics: collectors over the latest snapshot, samplers off the scrape path."""
