"""Kronk's test harness: pytest fixtures (the `kronk` pytest11 plugin, kronk_testing.plugin),
a real server in a thread (kronk_testing.server), Redis (kronk_testing.redis_server), tiny
generated models (kronk_testing.models), a scripted stand-in text model
(kronk_testing.scripted), and what tests share: waiting on conditions (waiting), serving with
auth on (auth), local file and Hugging Face servers (file_server, hub_server), catalog pulls
(pulls), media (media_samples), exactness replays (replay), tool results (tool_results) and
chat templates (templates).

pytest loads the plugin in every run where kronk is installed, so this package imports
nothing at all: fixtures import what they need when a test asks for them.
docs/plugins.md ("Testing your plugin") lists the fixtures.
"""
