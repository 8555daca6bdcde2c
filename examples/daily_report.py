"""A daily report on a schedule.

``schedule_daily_report`` registers a cron schedule (every day at 07:00 in the given time
zone) that starts ``daily_report``; each run reports on the previous day. The day is taken
from the workflow's clock: ``datetime.now()`` inside a workflow is the run's virtual time,
the same on every replay, so a run replayed next week still reports on the right day.

    manage.py build_workflow examples/daily_report.py -o daily_report.wasm
    manage.py deploy_workflow schedule_daily_report daily_report.wasm
    manage.py deploy_workflow daily_report daily_report.wasm
    manage.py start_workflow schedule_daily_report '{"timezone": "Europe/Paris",
                                                     "recipients": ["ops@example.com"]}'

Services it calls: ``metrics.daily_totals`` and ``mail.send``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cleat_workflow import Context, workflow

CRON = "0 7 * * *"


@workflow
def schedule_daily_report(ctx: Context, config: dict[str, Any]) -> dict[str, Any]:
    schedule_id = ctx.schedule_cron(
        "daily_report",
        CRON,
        timezone=config.get("timezone", "UTC"),
        input={"recipients": config["recipients"]},
    )
    return {"schedule_id": schedule_id, "cron": CRON}


@workflow
def daily_report(ctx: Context, config: dict[str, Any]) -> dict[str, Any]:
    day = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    totals = ctx.call("metrics", "daily_totals", {"day": day})
    lines = [f"{name}: {value}" for name, value in sorted(totals.items())]
    ctx.call(
        "mail",
        "send",
        {
            "to": config["recipients"],
            "subject": f"Daily report for {day}",
            "body": "\n".join(lines),
        },
    )
    ctx.log.info("sent the report for %s to %d recipients", day, len(config["recipients"]))
    return {"day": day, "totals": totals}
