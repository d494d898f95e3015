"""Kronk plugin: the MCP service and its web_search tool."""
