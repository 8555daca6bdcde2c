from __future__ import annotations

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    verbose_name = "Schedules"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Schedules build on workflows, which offers these hooks and knows nothing of them.
        from schedules.rls import SCHEDULE_TABLES
        from schedules.scheduler import worker_duty
        from schedules.workflow_crons import WorkflowCrons
        from workflows import duties, rls
        from workflows.store import crons

        duties.register("schedules", worker_duty)
        crons.register(WorkflowCrons())
        rls.register_tables(self.label, SCHEDULE_TABLES)
