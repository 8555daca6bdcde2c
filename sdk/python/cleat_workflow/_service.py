"""Typed services: a class whose methods declare durable calls with typed requests and
replies.

::

    @dataclass
    class Reserve:
        sku: str
        qty: int

    @dataclass
    class Reservation:
        id: str

    class Inventory(Service, name="inventory"):
        def reserve(self, request: Reserve) -> Reservation: ...
        def release(self, request: Release) -> None: ...

    @workflow
    def order(ctx: Context, input: dict) -> dict:
        inventory = Inventory(ctx)
        reservation = inventory.reserve(Reserve(sku="book", qty=1))   # a Reservation
        a, b = ctx.gather(inventory.reserve.call(Reserve("a", 1)), inventory.reserve.call(...))

Each method is a declaration (its body is never run): its one parameter's annotation is the
request type, its return annotation the reply type, each a dataclass, a TypedDict, a JSON
type (``str``, ``int``, ``float``, ``bool``, ``list[...]``, ``dict[str, ...]``), ``Any`` or
``None``, nested as deep as needed. The declarations are **checked when the class is
defined**, which is when ``build_workflow`` imports the module: a method without annotations,
with two parameters or with a type that is not JSON cannot be built, and the build error
names the file and line. At run time the request must be of the declared type (a
``TypeError`` in the workflow otherwise) and the reply is converted to the declared type (a
reply that does not fit fails the call with ``PermanentError`` naming the field).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Union, get_args, get_origin, get_type_hints

from cleat_workflow._calls import Call, Retry
from cleat_workflow._errors import PermanentError

if TYPE_CHECKING:
    from cleat_workflow._context import Context

_JSON_SCALARS = (str, int, float, bool)


class ServiceDefinitionError(TypeError):
    """A typed service declaration that cannot be called (raised when the class is defined)."""


def _where(fn: Callable[..., Any]) -> str:
    code = fn.__code__
    path = code.co_filename
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "" and parts[1].isdigit():  # inside a component build
        path = "/".join(parts[2:])
    return f"{path}:{code.co_firstlineno}"


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def _problem(tp: Any, seen: frozenset[Any] = frozenset()) -> str | None:
    """Why ``tp`` cannot carry a JSON request or reply, or None when it can."""
    if tp is Any or tp is None or tp is type(None) or tp in _JSON_SCALARS:
        return None
    if tp in seen:
        return None
    origin = get_origin(tp)
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        for arg in args:
            found = _problem(arg, seen)
            if found:
                return found
        return None
    if origin is dict:
        args = get_args(tp)
        if args and args[0] is not str:
            return f"{tp}: JSON object keys are strings"
        return _problem(args[1], seen) if len(args) == 2 else None
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            found = _problem(arg, seen)
            if found:
                return found
        return None
    if origin is typing.Literal:
        return None
    if tp in (list, dict):
        return None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = get_type_hints(tp)
        for f in dataclasses.fields(tp):
            found = _problem(hints.get(f.name, Any), seen | {tp})
            if found:
                return f"{tp.__name__}.{f.name}: {found}"
        return None
    if _is_typeddict(tp):
        for name, hint in get_type_hints(tp).items():
            found = _problem(hint, seen | {tp})
            if found:
                return f"{tp.__name__}.{name}: {found}"
        return None
    return f"{getattr(tp, '__name__', tp)!s} is not a dataclass, a TypedDict or a JSON type"


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_encode(v) for v in value]
    return value


def _decode(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as ``tp``; PermanentError naming ``where`` when it does not fit."""
    if tp is Any:
        return value
    if tp is None or tp is type(None):
        return None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _decode(arg, value, where)
            except PermanentError:
                continue
        raise PermanentError(f"{where}: {value!r:.80} is none of {tp}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            raise PermanentError(f"{where}: {value!r:.80} is not one of {get_args(tp)}")
        return value
    if origin in (list, tuple, set, frozenset) or tp in (list,):
        if not isinstance(value, list):
            raise PermanentError(f"{where}: expected a list, got {type(value).__name__}")
        args = [a for a in get_args(tp) if a is not Ellipsis]
        item = args[0] if args else Any
        items = [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return (origin or list)(items) if origin in (tuple, set, frozenset) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise PermanentError(f"{where}: expected an object, got {type(value).__name__}")
        args = get_args(tp)
        item = args[1] if len(args) == 2 else Any
        return {k: _decode(item, v, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise PermanentError(f"{where}: expected a {tp.__name__} object, got {value!r:.80}")
        hints = get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        known = {}
        for name, f in fields.items():
            if name in value:
                known[name] = _decode(hints.get(name, Any), value[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PermanentError(f"{where}: the {tp.__name__} lacks {name!r}")
        return tp(**known)
    if _is_typeddict(tp):
        if not isinstance(value, dict):
            raise PermanentError(f"{where}: expected a {tp.__name__} object, got {value!r:.80}")
        hints = get_type_hints(tp)
        for name in getattr(tp, "__required_keys__", ()):
            if name not in value:
                raise PermanentError(f"{where}: the {tp.__name__} lacks {name!r}")
        return {
            k: _decode(hints[k], v, f"{where}.{k}") if k in hints else v for k, v in value.items()
        }
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in _JSON_SCALARS:
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise PermanentError(f"{where}: expected {tp.__name__}, got {value!r:.80}")
        return value
    return value


def _accepts(tp: Any, value: Any) -> bool:
    """A shallow check of a request against its declared type."""
    if tp is Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_accepts(arg, value) for arg in get_args(tp))
    if origin is not None:
        base = {list: list, tuple: (list, tuple), dict: dict, set: (set, frozenset, list)}
        expected = base.get(origin)
        return expected is None or isinstance(value, expected)
    if _is_typeddict(tp):
        return isinstance(value, dict) and all(
            k in value for k in getattr(tp, "__required_keys__", ())
        )
    if isinstance(tp, type):
        if tp is float:
            return isinstance(value, int | float) and not isinstance(value, bool)
        return isinstance(value, tp)
    return True


@dataclasses.dataclass(frozen=True)
class Operation:
    """One declared method of a service: its name and its request and reply types."""

    service: str
    name: str
    request_type: Any
    reply_type: Any
    retry: Retry | None
    where: str

    def request_json(self, request: Any) -> Any:
        if not _accepts(self.request_type, request):
            expected = getattr(self.request_type, "__name__", str(self.request_type))
            raise TypeError(
                f"{self.service}.{self.name} takes a {expected}, not {type(request).__name__}"
            )
        return _encode(request)

    def reply(self, response: Any) -> Any:
        return _decode(self.reply_type, response, f"{self.service}.{self.name} reply")


class BoundOperation:
    """A service's operation in a workflow: call it, or make a :class:`Call` to gather."""

    def __init__(self, ctx: Context, operation: Operation) -> None:
        self._ctx = ctx
        self.operation = operation

    def call(self, request: Any = None, *, retry: Retry | None = None) -> Call:
        """The call, to pass to ``ctx.gather(...)``."""
        op = self.operation
        return Call(op.service, op.name, op.request_json(request), retry or op.retry, op.reply)

    def __call__(self, request: Any = None, *, retry: Retry | None = None) -> Any:
        """Make the call now and return the reply as the declared type."""
        op = self.operation
        body = op.request_json(request)
        policy = retry or op.retry
        if policy is None:
            return op.reply(self._ctx.call(op.service, op.name, body))
        return op.reply(
            self._ctx.call_with_retry(
                op.service,
                op.name,
                body,
                max_attempts=policy.max_attempts,
                initial_interval=policy.initial_interval,
                backoff=policy.backoff,
                max_interval=policy.max_interval,
                non_retryable=policy.non_retryable,
            )
        )


class Service:
    """Base class of typed services; see the module docstring. ``name`` is the service's name
    in ``CLEAT_SERVICES`` (default: the class name in lower case), ``retry`` (a
    :class:`Retry`) makes every call of it a retried one."""

    service_name: ClassVar[str] = ""
    operations: ClassVar[dict[str, Operation]] = {}

    def __init_subclass__(cls, *, name: str | None = None, retry: Retry | None = None) -> None:
        super().__init_subclass__()
        cls.service_name = name or cls.service_name or cls.__name__.lower()
        operations = dict(cls.operations)
        module = sys.modules.get(cls.__module__)
        namespace = vars(module) if module is not None else {}
        for attr, fn in vars(cls).items():
            if attr.startswith("_") or not inspect.isfunction(fn):
                continue
            operations[attr] = _operation(cls, attr, fn, namespace, retry)
        cls.operations = operations

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    def __getattribute__(self, attr: str) -> Any:
        operations = type(self).operations
        if not attr.startswith("_") and attr in operations:
            return BoundOperation(object.__getattribute__(self, "_ctx"), operations[attr])
        return object.__getattribute__(self, attr)


def _operation(
    cls: type, attr: str, fn: Callable[..., Any], namespace: dict[str, Any], retry: Retry | None
) -> Operation:
    where = _where(fn)
    label = f"{cls.__name__}.{attr} ({where})"
    params = list(inspect.signature(fn).parameters.values())[1:]  # after self
    if len(params) != 1:
        raise ServiceDefinitionError(
            f"{label}: an operation takes exactly one request parameter, not {len(params)}"
        )
    try:
        hints = get_type_hints(fn, globalns=namespace)
    except NameError as exc:
        raise ServiceDefinitionError(
            f"{label}: {exc} (define the request and reply types before the service)"
        ) from None
    request = params[0].name
    if request not in hints:
        raise ServiceDefinitionError(f"{label}: annotate the request parameter {request!r}")
    if "return" not in hints:
        raise ServiceDefinitionError(f"{label}: annotate the reply type (-> ...)")
    for role, tp in (("request", hints[request]), ("reply", hints["return"])):
        problem = _problem(tp)
        if problem:
            raise ServiceDefinitionError(f"{label}: the {role} type {problem}")
    return Operation(
        service=str(cls.service_name),
        name=attr,
        request_type=hints[request],
        reply_type=hints["return"],
        retry=retry,
        where=where,
    )
