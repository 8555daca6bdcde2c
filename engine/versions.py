"""Which deployed version of a workflow a new run takes: one rule, for every store.

The stores differ only in where the versions come from (a dict in memory, the definitions
table) and in how a refusal reaches the caller (a ``NOT_FOUND`` status to the guest, a
``NotFound`` naming the field to an API client), so the rule takes the deployed versions
and raises :class:`NoSuchVersion` for the caller to translate.
"""

from __future__ import annotations

from collections.abc import Mapping


class NoSuchVersion(Exception):
    """No deployed version fits. ``field`` names what was wrong: ``"definition"`` (nothing
    deployed under the name, or every version deprecated) or ``"version"`` (the explicit
    version is not deployed)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def choose_version(
    name: str,
    deployed: Mapping[int, bool],
    *,
    version: int | None = None,
    preferred: int = 0,
) -> int:
    """The version of ``name`` a new run takes. ``deployed`` maps each deployed version to
    whether it is deprecated.

    An explicit ``version`` must be deployed (deprecated or not: asking by number still
    works). Otherwise ``preferred`` when it is deployed, even deprecated (a child keeps its
    parent's version; a start keeps the version its routing rule picked). Otherwise the
    newest version that is not deprecated.
    """
    if not deployed:
        raise NoSuchVersion(f"no workflow definition named {name!r}", "definition")
    if version is not None:
        if version not in deployed:
            raise NoSuchVersion(f"{name} has no version {version}", "version")
        return version
    if preferred in deployed:
        return preferred
    live = [number for number, deprecated in deployed.items() if not deprecated]
    if not live:
        raise NoSuchVersion(f"every version of {name} is deprecated", "definition")
    return max(live)
