"""Which deployed version of a workflow a run takes, and whether a run may move to another
one: the rules, written once, for every store.

The stores differ only in where the versions come from (a dict in memory, the definitions
table) and in how a refusal reaches the caller (a ``NOT_FOUND`` status to the guest, a
``NotFound`` naming the field to an API client), so each rule takes the deployed versions
as plain values and raises :class:`NoSuchVersion` (or returns the first incompatibility)
for the caller to translate.

- :func:`choose_version`: a new run started from outside (API, CLI, schedule, detached run).
- :func:`resolve_child_version`: a child's version, as the reference's
  ``ResolveChildVersion`` with the parent definition's binding policy
  (``WithChildBindingPolicy``).
- :func:`incompatibility` and :func:`move_refusal`: whether a run on one version may
  continue on another (continue-as-new with a version, an operator's "move to version
  N"), as the reference's ``ValidateVersionCompatibility``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from engine.errors import ErrorCode

STABLE_TAG = "stable"


class NoSuchVersion(Exception):
    """No deployed version fits. ``field`` names what was wrong: ``"definition"`` (nothing
    deployed under the name, or every version deprecated, or none the rule accepts) or
    ``"version"`` (the explicit version is not deployed)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ChildBinding(enum.StrEnum):
    """How a definition's children get their versions (set at deploy).

    ``DEFAULT`` (empty) is the reference's rule: the parent's own version when the child has
    it, else the newest non-deprecated child version whose ``min_version`` is at most the
    parent's version. ``FROZEN``: the versions pinned at deploy (``child_versions``); a
    child with no pin falls back to the default rule. ``STABLE``: the child version tagged
    ``stable`` when the child starts. ``LATEST``: the child's newest non-deprecated version.
    A version the guest asks for (``child_workflow_with_options`` with a version > 0)
    always wins over the policy."""

    DEFAULT = ""
    FROZEN = "frozen"
    STABLE = "stable"
    LATEST = "latest"


def binding_problem(policy: object, child_versions: object) -> tuple[str, str] | None:
    """Why a deploy's binding policy or pins are invalid, as (field, message); None when
    they are valid."""
    if policy not in {b.value for b in ChildBinding}:
        choices = ", ".join(repr(b.value) for b in ChildBinding)
        return "child_binding", f"child_binding must be one of {choices}, not {policy!r}"
    if not isinstance(child_versions, Mapping):
        return "child_versions", "child_versions must map child workflow names to versions"
    for name, version in child_versions.items():
        if not isinstance(name, str) or not name:
            return "child_versions", "child_versions keys must be workflow names"
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            return "child_versions", f"child_versions[{name!r}] must be a positive integer"
    if child_versions and policy != ChildBinding.FROZEN:
        return "child_versions", "child_versions are only used with child_binding 'frozen'"
    return None


@dataclass(frozen=True)
class DeployedVersion:
    """What the rules need to know about one deployed version."""

    version: int
    deprecated: bool = False
    min_version: int = 0
    # Exports with the entry signature: entry points and update handlers alike.
    entry_points: tuple[str, ...] = ()
    child_binding: str = ""
    child_versions: Mapping[str, int] = field(default_factory=dict)
    # Who may signal this version's runs under signal authorization (engine/policies.py).
    allowed_signal_callers: tuple[str, ...] = ()


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
    works). Otherwise ``preferred`` when it is deployed, even deprecated (a start keeps the
    version its routing rule picked). Otherwise the newest version that is not deprecated.
    """
    if not deployed:
        raise NoSuchVersion(f"no workflow definition named {name!r}", "definition")
    if version is not None:
        if version not in deployed:
            raise NoSuchVersion(f"{name} has no version {version}", "version")
        return version
    if preferred in deployed:
        return preferred
    return _newest_live(name, deployed)


def _newest_live(name: str, deployed: Mapping[int, bool]) -> int:
    live = [number for number, deprecated in deployed.items() if not deprecated]
    if not live:
        raise NoSuchVersion(f"every version of {name} is deprecated", "definition")
    return max(live)


def resolve_child_version(
    name: str,
    deployed: Collection[DeployedVersion],
    *,
    version: int,
    parent_version: int,
    binding: str = "",
    pins: Mapping[str, int] | None = None,
    stable: int | None = None,
) -> int:
    """The version a child of ``name`` starts on (the reference's ``ResolveChildVersion``).

    In order: a ``version`` > 0 the guest asked for (deprecated or not: a pin is an explicit
    request); then the parent definition's ``binding`` (:class:`ChildBinding`: the deploy's
    pin for ``name`` under ``frozen``; the version tagged ``stable`` -- ``stable``, as the
    caller read it when the child starts -- under ``stable``; the newest non-deprecated
    version under ``latest``); else the parent's own version when the child has it; else
    the newest non-deprecated version whose ``min_version`` is at most ``parent_version``.
    Raises :class:`NoSuchVersion` whose message starts ``unknown_definition:`` when none
    qualifies."""
    by_number = {d.version: d for d in deployed}
    if not by_number:
        raise NoSuchVersion(
            f"unknown_definition: no workflow definition named {name!r}", "definition"
        )

    def pinned(number: int, why: str) -> int:
        if number not in by_number:
            raise NoSuchVersion(
                f"unknown_definition: {name} has no version {number} ({why})", "version"
            )
        return number

    if version > 0:
        return pinned(version, "asked for by the parent")
    if binding == ChildBinding.FROZEN and pins and name in pins:
        return pinned(pins[name], "pinned at the parent's deploy, child_binding frozen")
    if binding == ChildBinding.STABLE:
        if stable is None:
            raise NoSuchVersion(
                f"unknown_definition: no version of {name} is tagged {STABLE_TAG!r} "
                "(the parent's child_binding is stable)",
                "definition",
            )
        return pinned(stable, f"tagged {STABLE_TAG!r}")
    if binding == ChildBinding.LATEST:
        try:
            return _newest_live(name, {d.version: d.deprecated for d in by_number.values()})
        except NoSuchVersion as exc:
            raise NoSuchVersion(f"unknown_definition: {exc.message}", exc.field) from None
    if parent_version in by_number:
        return parent_version
    compatible = [
        d.version
        for d in by_number.values()
        if not d.deprecated and d.min_version <= parent_version
    ]
    if not compatible:
        raise NoSuchVersion(
            f"unknown_definition: {name} has no version {parent_version} (the parent's) and "
            f"no non-deprecated version whose min_version is at most {parent_version}",
            "definition",
        )
    return max(compatible)


def incompatibility(
    current: DeployedVersion,
    target: DeployedVersion,
    *,
    entry_point: str = "run",
) -> str | None:
    """The first reason a run on ``current`` may not continue on ``target`` (None: it may),
    as the reference's ``ValidateVersionCompatibility``.

    Checked in order: the target exports the run's ``entry_point``; it exports every other
    entry-signature export of ``current`` (update handlers are such exports: one the run
    registered, or a later update request names, must still be there); its ``min_version``
    -- the oldest version whose histories its code replays -- is at most the current
    version."""
    if current.version == target.version:
        return None
    have = set(target.entry_points)
    label = f"version {target.version}"
    if entry_point not in have:
        return f"{label} has no entry point {entry_point!r}, which this run executes"
    for export in current.entry_points:
        if export not in have:
            return (
                f"{label} does not export {export!r}, which version {current.version} "
                "exports (an entry point or update handler)"
            )
    if target.min_version > current.version:
        return (
            f"{label} has min_version {target.min_version}: it does not replay histories "
            f"of version {current.version}"
        )
    return None


def move_refusal(
    name: str,
    current: DeployedVersion,
    target: DeployedVersion | None,
    target_version: int,
    *,
    entry_point: str = "run",
) -> tuple[ErrorCode, str] | None:
    """Why a run of ``name`` on ``current`` may not go on as ``target_version``
    (``target``: that version as deployed, None when it is not), as an error code and a
    message; None when it may. One rule for continue-as-new with a version (the run then
    fails with it) and an operator's move (refused with it)."""
    if target is None:
        return ErrorCode.NOT_FOUND, f"{name} has no version {target_version} to move to"
    problem = incompatibility(current, target, entry_point=entry_point)
    if problem is not None:
        return (
            ErrorCode.PERMANENT,
            f"{name} version {current.version} cannot move to version {target_version}: {problem}",
        )
    return None


# --- plugin versions (the reference's ResolvePlugins) --------------------------------------------

# Plugins are libraries used within compatibility ranges, so their versions are semver
# strings, unlike workflow versions (monotonic integers for discrete business processes).


def parse_semver(text: str) -> tuple[int, int, int] | None:
    """``"1.2.3"`` (``"1.2"`` and ``"1"`` padded with zeros) as a tuple; None if it is not."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2]


def _clause_allows(clause: str, version: tuple[int, int, int]) -> bool | None:
    """Whether ``version`` satisfies one clause (``>=1.2.0``, ``~1.2``, ``^1.0``, ``=1.2.3``,
    ``1.2.3``, ``*``); None when the clause is not understood."""
    clause = clause.strip()
    if clause in ("*", ""):
        return True
    for op in (">=", "<=", ">", "<", "=", "~", "^"):
        if clause.startswith(op):
            base = parse_semver(clause[len(op) :])
            break
    else:
        op, base = "=", parse_semver(clause)
    if base is None:
        return None
    if op == ">=":
        return version >= base
    if op == "<=":
        return version <= base
    if op == ">":
        return version > base
    if op == "<":
        return version < base
    if op == "~":  # same major.minor, at least base
        return version >= base and version[:2] == base[:2]
    if op == "^":  # same major (or same minor under 0.x), at least base
        same = version[:2] == base[:2] if base[0] == 0 else version[0] == base[0]
        return version >= base and same
    return version == base


def constraint_problem(constraint: object) -> str | None:
    """Why ``constraint`` is not a semver constraint this host reads (None when it is):
    clauses such as ``>=1.2.0``, ``<2``, ``~1.2``, ``^1.0.0``, ``=1.2.3``, joined by commas
    or spaces (all must hold)."""
    if not isinstance(constraint, str):
        return "a constraint must be a string such as '>=1.2.0'"
    for clause in constraint.replace(",", " ").split():
        if _clause_allows(clause, (0, 0, 0)) is None:
            return f"{clause!r} is not a semver constraint (e.g. >=1.2.0, ~1.2, ^1.0.0)"
    return None


def satisfies(version: str, constraint: str) -> bool:
    parsed = parse_semver(version)
    if parsed is None:
        return False
    return all(
        _clause_allows(clause, parsed) is True for clause in constraint.replace(",", " ").split()
    )


def resolve_plugins(
    dependencies: Mapping[str, str], available: Mapping[str, Collection[str]]
) -> dict[str, str]:
    """Each dependency (``{"llm": ">=1.2.0"}``) pinned to the newest available version that
    satisfies its constraint, as the reference's ``ResolvePlugins``. Raises
    :class:`NoSuchVersion` (field ``plugin_dependencies``) naming the first that cannot be."""
    pinned: dict[str, str] = {}
    for name, constraint in sorted(dependencies.items()):
        problem = constraint_problem(constraint)
        if problem is not None:
            raise NoSuchVersion(f"plugin {name!r}: {problem}", "plugin_dependencies")
        versions = [v for v in available.get(name, ()) if parse_semver(v) is not None]
        if not versions:
            raise NoSuchVersion(f"no plugin named {name!r} is configured", "plugin_dependencies")
        fitting = [v for v in versions if satisfies(v, constraint)]
        if not fitting:
            have = ", ".join(sorted(versions, key=lambda v: parse_semver(v) or (0, 0, 0)))
            raise NoSuchVersion(
                f"no version of plugin {name!r} satisfies {constraint!r} (configured: {have})",
                "plugin_dependencies",
            )
        pinned[name] = max(fitting, key=lambda v: parse_semver(v) or (0, 0, 0))
    return pinned
