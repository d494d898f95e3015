"""Kronk's test harness: pytest fixtures (the `kronk` pytest11 plugin, kronk_testing.plugin),
a real server in a thread (kronk_testing.server), Redis (kronk_testing.redis_server), tiny
generated models (kronk_testing.models) and a scripted stand-in text model
(kronk_testing.scripted).

pytest loads the plugin in every run where kronk is installed, so this package imports
nothing at all: fixtures import what they need when a test asks for them.
docs/plugins.md ("Testing your plugin") lists the fixtures.
"""
