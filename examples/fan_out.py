"""Fan-out / fan-in: one child workflow per item, then gather every outcome.

``fan_out`` starts a ``process_item`` child for each item (they run in parallel, on any
worker), waits for all of them, and reports which succeeded and which failed. A failing
child does not fail the parent: its error is part of the report.

Deploy the module once per workflow, under the workflow's name (a run of the default entry
starts the workflow named like its definition):

    manage.py build_workflow examples/fan_out.py -o fan_out.wasm
    manage.py deploy_workflow fan_out fan_out.wasm
    manage.py deploy_workflow process_item fan_out.wasm
    manage.py start_workflow fan_out '{"batch": "b-7", "items": ["a", "b", "c"]}'

Service it calls: ``images.resize`` (one call per item).
"""

from __future__ import annotations

from typing import Any

from cleat_workflow import Context, PermanentError, workflow


@workflow
def process_item(ctx: Context, item: dict[str, Any]) -> dict[str, Any]:
    resized = ctx.call_with_retry(
        "images", "resize", {"item": item["item"], "batch": item["batch"]}, max_attempts=3
    )
    return {"item": item["item"], "size": resized["size"]}


@workflow
def fan_out(ctx: Context, job: dict[str, Any]) -> dict[str, Any]:
    items = job["items"]
    if not items:
        raise PermanentError("a batch needs at least one item")
    run_ids = [ctx.child("process_item", {"item": item, "batch": job["batch"]}) for item in items]
    ctx.set_query("children", len(run_ids))
    outcomes = ctx.gather_children(run_ids)
    done = [o.result for o in outcomes if o.ok]
    failed = [
        {"item": item, "error": o.error}
        for item, o in zip(items, outcomes, strict=True)
        if not o.ok
    ]
    return {
        "batch": job["batch"],
        "processed": len(done),
        "total_size": sum(r["size"] for r in done),
        "failed": failed,
    }
