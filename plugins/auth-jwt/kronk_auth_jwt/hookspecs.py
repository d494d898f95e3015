"""Hooks the auth-jwt plugin defines and calls: the limit-store registry.

Added to the plugin manager by this plugin (`kronk_addhooks`). A plugin that
implements them should mark its hookimpl `optionalhook=True`, so it still
loads when auth-jwt is disabled.
"""

from __future__ import annotations

import pluggy

from kronk_auth_jwt.limits import LimitStoreFactory
from kronk_core.contract import KronkView, Register, RegistryKind

hookspec = pluggy.HookspecMarker("kronk")

LIMIT_STORES: RegistryKind[LimitStoreFactory] = RegistryKind("limit_stores")


@hookspec
def kronk_register_limit_stores(register: Register[LimitStoreFactory], kronk: KronkView) -> None:
    """Register rate-limit counter stores by URL scheme: `register("redis", factory)`.

    The server's `auth-jwt.limit_store` URL selects one by its scheme (`sqlite`
    for `sqlite` and `sqlite:///PATH`, `redis` for `redis://...`). When auth
    is on, the factory is called once at start as `factory(url, base_path)`;
    the store is closed at shutdown.
    """
