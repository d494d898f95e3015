"""The debug plugin: a separate HTTP server with Prometheus metrics and profiling endpoints."""
