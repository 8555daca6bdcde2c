"""``calls`` of ``scenarios.py`` after an edit: the second call now asks for a refund.

Deployed over a run that started on the original code, its replay must stop with a
non-determinism error naming step 1, instead of silently calling something else.
"""

from __future__ import annotations

from typing import Any

from cleat_workflow import CallFailed, Context, PermanentError, RetriesExhausted, workflow


@workflow
def calls(ctx: Context, input: Any) -> Any:
    seen: list[Any] = [ctx.call("shop", "price", {"sku": input["sku"]})]
    try:
        ctx.call("shop", "refund", {"sku": input["sku"]})  # was: "reject"
    except PermanentError as exc:
        seen.append(["permanent", exc.message])
    try:
        ctx.call("shop", "flaky", None)
    except CallFailed as exc:
        seen.append(["error", exc.message])
    try:
        ctx.call_with_retry("shop", "flaky", None, max_attempts=3, initial_interval=1)
    except RetriesExhausted as exc:
        seen.append(["exhausted", exc.message])
    return seen
