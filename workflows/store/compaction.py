"""History compaction on the Django store: the fold, run inside the fenced finalize.

The rule (what to fold, the checkpoint's format, reading it back) is
:mod:`engine.compaction`; this module applies it to a run's rows. Why in the finalize and not
as a periodic duty: the finalize already holds the run's fenced row lock in its transaction,
so the fold (write the checkpoint, delete the folded rows) commits with the segment's events
or not at all, and no other writer can append meanwhile. A duty would need a fence of its own
against the worker that claims the run next. The cost stays off the hot path of most
segments: only the finalize that finds ``event_count - compacted_events`` at the threshold
reads the rows, once per threshold's worth of events.
"""

from __future__ import annotations

import uuid
from typing import Any

from engine import compaction
from engine.events import EncodedEvent
from workflows.conf import compact_after_events
from workflows.crypto import seal_json_column
from workflows.models import WorkflowEvent, WorkflowInstance, checkpoint_state


def fold_locked(instance: WorkflowInstance) -> int:
    """Fold ``instance``'s history prefix into its checkpoint when it is due; the caller
    holds the fenced lock on the row, in the transaction that saves it. ``instance`` may
    have ``compaction_state`` deferred: it is read and written here. Returns how many
    events were folded."""
    threshold = compact_after_events()
    if not compaction.due(instance.event_count - instance.compacted_events, threshold):
        return 0
    tenant = instance.tenant_id
    rows = WorkflowEvent.rows(tenant, instance.id)
    count = compaction.fold_count(rows, threshold)
    if count == 0:
        return 0
    state = checkpoint_state(WorkflowInstance.stored_checkpoint(tenant, instance.id))
    folded: list[EncodedEvent] = rows[:count]
    new_state = compaction.fold(state, folded)
    stored: Any = seal_json_column(
        WorkflowInstance, "compaction_state", tenant, (instance.id,), new_state.as_json()
    )
    WorkflowInstance.objects.filter(id=instance.id).update(
        compaction_state=stored, compacted_events=new_state.count
    )
    WorkflowEvent.objects.filter(instance_id=instance.id, step__lt=new_state.count).delete()
    instance.compacted_events = new_state.count
    return count


def history(tenant: uuid.UUID, instance_id: uuid.UUID | str) -> list[EncodedEvent]:
    """The run's whole history (checkpoint, then rows)."""
    return WorkflowEvent.history(tenant, instance_id)
