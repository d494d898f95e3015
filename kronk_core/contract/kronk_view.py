"""What hooks and model loading get from the Kronk instance they serve: a narrow view
of it (the network host, and the host memory a cache keeps KV in, are other things).

`Kronk` (the SDK facade) is one; a hook that needs more than this (a route that runs
chats) reaches the facade the server keeps on `app.state.kronk`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

import pluggy

from kronk_core.contract.registry import Registry, RegistryKind

if TYPE_CHECKING:
    from kronk_core.runtime.pool import PoolEntry
    from kronk_core.settings.config import KronkConfig
    from kronk_core.settings.sections import ModelSection

T = TypeVar("T")


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, plus what configuration left out (for `kronk plugins`)."""

    def __init__(self) -> None:
        super().__init__("kronk")
        self.disabled: list[str] = []
        # Plugin name → "distribution version", for plugins installed through entry points.
        self.distributions: dict[str, str] = {}


class Subscription:
    """An observer subscribed to the hook calls (`KronkView.subscribe`) until `cancel()`, or the
    end of its `with` block."""

    def __init__(self, plugins: PluginManager, observer: object) -> None:
        self._plugins = plugins
        self._name = plugins.register(observer)

    def cancel(self) -> None:
        """Unsubscribe the observer; once is enough, again does nothing."""
        if self._name is not None:
            self._plugins.unregister(name=self._name)
            self._name = None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: object) -> None:
        self.cancel()


class PoolView(Protocol):
    """The model pool, read-only: what is loaded now."""

    def entries(self) -> list[PoolEntry[Any]]: ...


class KronkView(Protocol):
    """The hook caller, observers' subscriptions, the plugins configuration disabled, typed
    registry lookup, the configuration (with the model sections the plugins declare) and a
    read-only view of the pool."""

    @property
    def config(self) -> KronkConfig: ...

    @property
    def hook(self) -> pluggy.HookRelay: ...

    @property
    def disabled_plugins(self) -> Sequence[str]: ...

    def subscribe(self, observer: object) -> Subscription:
        """Call `observer`'s hook implementations (`kronk_chat_finished`, ...) too, until
        the subscription is cancelled."""
        ...

    @property
    def model_sections(self) -> Sequence[ModelSection[Any]]: ...

    @property
    def pool(self) -> PoolView: ...

    @overload
    def registry(self, kind: RegistryKind[T]) -> Registry[T]: ...

    @overload
    def registry(self, kind: str) -> Registry[Any]: ...

    def registry(self, kind: RegistryKind[T] | str) -> Registry[Any]: ...
