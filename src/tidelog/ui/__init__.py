"""Prometheus metrics and the web cluster view."""
