"""Middleware hooks called only on the middleware that define them.

Dramatiq's ``Broker.emit_before``/``emit_after`` call the hook of every middleware for every signal, and most
are :class:`dramatiq.Middleware`'s no-ops: a worker's eleven middleware define ``after_enqueue`` once and
``before_enqueue`` never, so a window refill of 64 messages made some 1,400 calls to do 64. Every broker
Tenure builds mixes this in before Dramatiq's class, so the calls, their order and their error handling stay
Dramatiq's, only the no-ops go.
"""

from __future__ import annotations

from typing import Any

from dramatiq.middleware import Middleware, MiddlewareError


def defines(middleware: Middleware, hook: str) -> bool:
    """Whether *middleware* has its own *hook* (its class's, or one set on the instance)."""
    own = getattr(middleware, "__dict__", None)
    return (own is not None and hook in own) or getattr(type(middleware), hook, None) is not getattr(Middleware, hook)


class HookDispatch:
    """``emit_before``/``emit_after`` over the middleware that define each hook.

    Which middleware define a hook is worked out once per hook and again whenever ``self.middleware`` is no
    longer the list it was worked out from (``add_middleware``, or a list changed in place).
    """

    middleware: list[Middleware]
    logger: Any

    def _defining(self, hook: str) -> list[Middleware]:
        cache: dict[str, tuple[list[Middleware], list[Middleware]]] = self.__dict__.setdefault("_hook_dispatch", {})
        entry = cache.get(hook)
        if entry is None or entry[0] != self.middleware:
            entry = cache[hook] = (list(self.middleware), [m for m in self.middleware if defines(m, hook)])
        return entry[1]

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        hook = "before_" + signal
        for middleware in self._defining(hook):
            try:
                getattr(middleware, hook)(self, *args, **kwargs)
            except MiddlewareError:
                raise
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", hook, middleware, exc_info=True)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        hook = "after_" + signal
        for middleware in reversed(self._defining(hook)):
            try:
                getattr(middleware, hook)(self, *args, **kwargs)
            except Exception:
                self.logger.critical("Unexpected failure in %s of %r.", hook, middleware, exc_info=True)
