"""What plugins use of the server, in one place: dialect bases, the routes' prologue and
server-sent events, route access levels, body parsing, auth's token checker, the CLI's server
options and settings. Plugins import from here (or `kronk_api`, the app); the modules behind
it may move between releases. The server's own modules never import it (tests/test_layers.py).
"""

from kronk_api.app import SERVER_DIALECT
from kronk_api.auth import TOKEN_CHECKER, Checked, TokenChecker, expect_token_checker, token_checker
from kronk_api.bool_flags import BoolValueGroup
from kronk_api.cli import main
from kronk_api.client import call_server
from kronk_api.client_extras import (
    FieldRules,
    client_extras,
    omitted_tools,
    served_tools,
    server_tools,
    unknown_fields,
)
from kronk_api.dialect import SSE_HEADERS, Dialect, KronkDialect, Received, receive, sse_frame
from kronk_api.endpoints import (
    ADMIN,
    AUTHENTICATED,
    ENDPOINT_OPT,
    PUBLIC,
    SUBJECT_STATE,
    endpoint_name,
    route_path,
    subject_of,
)
from kronk_api.http import invalid_body, kronk_of, media_sources, parse_body
from kronk_api.listen import ListenError, listen
from kronk_api.listening import announce, api_url
from kronk_api.logs import configure_logging, request_id
from kronk_api.model_removal import delete_model_files_of
from kronk_api.options import (
    ServerStartCommand,
    add_server_start_option,
    cli_plugins,
    config_file_option,
    setting_option,
)
from kronk_api.response_watch import ResponseWatch
from kronk_api.settings import (
    ServerSettings,
    Setting,
    all_settings,
    bind_sections,
    check_host_port,
    env_name,
    load_settings,
    other_spellings,
    server_sections,
)
from kronk_api.timeouts import HttpTimeouts

__all__ = [
    "ADMIN",
    "AUTHENTICATED",
    "ENDPOINT_OPT",
    "PUBLIC",
    "SERVER_DIALECT",
    "SSE_HEADERS",
    "SUBJECT_STATE",
    "TOKEN_CHECKER",
    "BoolValueGroup",
    "Checked",
    "Dialect",
    "FieldRules",
    "HttpTimeouts",
    "KronkDialect",
    "ListenError",
    "Received",
    "ResponseWatch",
    "ServerSettings",
    "ServerStartCommand",
    "Setting",
    "TokenChecker",
    "add_server_start_option",
    "all_settings",
    "announce",
    "api_url",
    "bind_sections",
    "call_server",
    "check_host_port",
    "cli_plugins",
    "client_extras",
    "config_file_option",
    "configure_logging",
    "delete_model_files_of",
    "endpoint_name",
    "env_name",
    "expect_token_checker",
    "invalid_body",
    "kronk_of",
    "listen",
    "load_settings",
    "main",
    "media_sources",
    "omitted_tools",
    "other_spellings",
    "parse_body",
    "receive",
    "request_id",
    "route_path",
    "served_tools",
    "server_sections",
    "server_tools",
    "setting_option",
    "sse_frame",
    "subject_of",
    "token_checker",
    "unknown_fields",
]
