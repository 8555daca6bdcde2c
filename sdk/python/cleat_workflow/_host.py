"""The binding to the cleat host.

Inside a component built by ``manage.py build_workflow`` these are the WIT imports that
componentize-py generates from the ``workflow-batch`` world of ``sdk/wit`` (``wit_world``):
ABI v1's ``host`` and ``updates``, and the optional extension ``batch``. Imported anywhere
else (documentation tools, type checkers, host-side tests of the pure parts), the SDK still
imports, and any host operation raises :class:`OutsideWorkflow`.
"""

from __future__ import annotations

from typing import Any


class OutsideWorkflow(RuntimeError):
    """A host operation was called outside a workflow component."""


class _Unbound:
    def __init__(self, interface: str) -> None:
        self._interface = interface

    def __getattr__(self, name: str) -> Any:
        raise OutsideWorkflow(
            f"{self._interface}.{name} is a cleat host operation: it only works inside a "
            "workflow built with `manage.py build_workflow` and run by cleat"
        )


try:  # pragma: no cover - inside a component
    from componentize_py_types import Err  # type: ignore[import-not-found]
    from wit_world.imports import batch, host, types, updates  # type: ignore[import-not-found]

    IN_COMPONENT = True
except ImportError:
    IN_COMPONENT = False
    host = _Unbound("host")
    batch = _Unbound("batch")
    updates = _Unbound("updates")
    types = _Unbound("types")

    class Err(Exception):  # type: ignore[no-redef]
        """Stand-in for componentize-py's ``Err`` outside a component."""

        def __init__(self, value: Any) -> None:
            super().__init__(value)
            self.value = value


__all__ = ["IN_COMPONENT", "Err", "OutsideWorkflow", "batch", "host", "types", "updates"]
