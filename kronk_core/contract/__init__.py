"""The plugin contract: hook specs, the host, registries, the plugin manager
and the protocols plugins implement.
"""
