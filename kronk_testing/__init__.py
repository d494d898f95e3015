"""Kronk's test harness: pytest fixtures (the `kronk` pytest11 plugin, kronk_testing.plugin),
a real server in a thread (kronk_testing.server), Redis (kronk_testing.redis_server), tiny
generated models (kronk_testing.models), a scripted stand-in text model
(kronk_testing.scripted), and what tests share: waiting on conditions (waiting), serving with
auth on (auth), local file and Hugging Face servers (file_server, hub_server), catalog pulls
(pulls), media (media_samples), exactness replays (replay), tool results (tool_results), chat
templates (templates), the caching tests' conversations (conversations), fuzzing's settings
(fuzzing), coding agents' requests (agent_requests) and real clients (agents), answers'
checks (answers), the CLI in a child process (cli), the shared `kronk libs` build
(libs_build), streamed tool calls (streamed_calls), a Brave Search double (brave_search)
and raw MCP sessions (mcp_session).
Tests import what they share from here, never from one another.

pytest loads the plugin in every run where kronk is installed, so this package imports
nothing at all: fixtures import what they need when a test asks for them.
docs/plugins.md ("Testing your plugin") lists the fixtures.
"""
