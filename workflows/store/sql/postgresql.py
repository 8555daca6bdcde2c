"""PostgreSQL: every hand-written statement of the workflows store (``QUERIES``, fetched by
name through ``workflows.store.sql.queries``), and the live definitions of what the
migrations install -- the tenant function, row-level security, the roles and the
``SECURITY DEFINER`` functions (``workflows/rls.py`` says why each exists). The migrations
carry frozen copies of those; ``tests/integration/test_migrations_sql.py`` checks that a
fresh migrate installs functions whose bodies match the ones here, so a change here is a new
migration.

Table names are formatted in once, at import.
"""

from __future__ import annotations

from workflows.models import (
    TERMINAL_STATUSES,
    ConcurrencyKey,
    Promise,
    RoutingRule,
    RunStatus,
    Signal,
    TaskCall,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.rls import DISPATCHER_ROLE
from workflows.store.columns import LOCKED_COLUMNS
from workflows.store.wake import NOTIFY_CHANNEL
from workflows.tenancy import TENANT_SETTING

# --- the tenant ------------------------------------------------------------------------------

# tenant_context(): the setting's name and the tenant ('' for none), local to the transaction.
SET_TENANT = "SELECT set_config(%s, %s, true)"

# PostgreSQL: the fenced append of one or more runs' events, the per-step write (a run's
# own, or the group commit's for several: store.group_commit), through the function below:
# its statements are planned once per connection instead of at every step.
APPEND_EVENTS = "SELECT id FROM cleat.append_events(%s, %s)"
APPEND_EVENTS_SIGNATURE = "cleat.append_events(json, json)"
# The functions that run as their caller and set the run's tenant for RLS (the append, the
# finalize, the load) keep the caller's setting in ``v_caller`` and put it back before they
# return: a transaction-local setting would otherwise outlive the call in the caller's
# transaction.
_KEEP_CALLER_TENANT = f"v_caller text := current_setting('{TENANT_SETTING}', true);"
_RESTORE_CALLER_TENANT = f"PERFORM set_config('{TENANT_SETTING}', COALESCE(v_caller, ''), true);"
# The body of an invoker function that reads as the run's tenant ``p_tenant`` (the load,
# the blocking call's read): it opens with the tenant set and closes with the caller's back.
_AS_RUNS_TENANT_BEGIN = f"""#variable_conflict use_column
DECLARE
    {_KEEP_CALLER_TENANT}
BEGIN
    PERFORM set_config('{TENANT_SETTING}', p_tenant::text, true);"""
_AS_RUNS_TENANT_END = f"""    {_RESTORE_CALLER_TENANT}
END
$$;"""


# The terminal statuses as a SQL list (``status IN (...)``).
_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))


def _held_by(run: str, worker: str) -> str:
    """The fence's test that the run ``run`` (a table alias) is ``worker``'s and running --
    the append's, the finalize's and the loads' -- each comparison wrapped in ``IS TRUE``
    (the same result: NULL is not true), which no index serves, so the planner finds the run
    by its primary key. With bare ``=`` it could read the runs through ``instance_due`` (every
    running run) or ``instance_owner`` (every run of the worker) instead, once per run of the
    statement: the statistics make running runs look rare (most runs have ended, and a table
    analyzed while its runs waited has none), so that plan looked as cheap as the key's. A
    drained batch of 57 runs read 1,596 rows it did not want that way (bench/README.md,
    twenty-second pass), and the waste grows with every worker's running runs."""
    running = RunStatus.RUNNING.value
    return f"({run}.assigned_to = {worker}) IS TRUE AND ({run}.status = '{running}') IS TRUE"


def _invoker_grants(role: str, *signatures: str) -> str:
    """Functions that run as their caller: callable by ``role``, not by PUBLIC."""
    return "".join(
        f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC;\n"
        f"GRANT EXECUTE ON FUNCTION {signature} TO {role};\n"
        for signature in signatures
    )


# The events of the runs a fence matched (the CTE ``fence``: id, tenant_id), from the JSON
# rows ``p_events`` (store.group_commit.event_rows) -- the append's and the finalize's.
_INSERT_FENCED_EVENTS = f"""            INSERT INTO {WorkflowEvent._meta.db_table}
                   (tenant_id, instance_id, step, type_code, payload, timestamp_ms, checksum,
                    intent_at, created_at)
            SELECT fence.tenant_id, fence.id, e.step, e.type_code, e.payload, e.ts,
                   e.checksum, e.intent_at, e.created_at
              FROM fence
              JOIN json_to_recordset(p_events)
                   AS e(run uuid, step integer, type_code smallint, payload text, ts bigint,
                        checksum varchar, intent_at timestamptz, created_at timestamptz)
                ON e.run = fence.id
            RETURNING 1
"""


# The first argument lists each run (JSON: id, tenant, the first new step, the count after
# it, owner, generation, heartbeat), the second every event (``run`` naming its run): two
# text parameters, because quoting arrays of parameters in Python cost the worker more than
# the statement. For each tenant in turn (RLS: the function runs as its caller, and sets the
# tenant as tenant_context() does, restoring the caller's at the end), the UPDATE matches
# only the rows whose fence holds -- claimed by that owner at that generation, running, the
# history ending right before the first new step -- and locks them, and the INSERT writes
# the events of the matched runs only. A run whose fence does not match is left out of both;
# the function returns the ids of the runs it wrote.
APPEND_EVENTS_FUNCTION = f"""
CREATE OR REPLACE FUNCTION {APPEND_EVENTS_SIGNATURE.replace("(json, json)", "")}(
    p_runs json, p_events json)
RETURNS TABLE(id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    {_KEEP_CALLER_TENANT}
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT r.tenant FROM json_to_recordset(p_runs) AS r(tenant uuid)
    LOOP
        PERFORM set_config('{TENANT_SETTING}', v_tenant::text, true);
        RETURN QUERY
        WITH fence AS (
            UPDATE {WorkflowInstance._meta.db_table} AS i
               SET event_count = c.next, heartbeat_at = c.now
              FROM json_to_recordset(p_runs)
                   AS c(id uuid, tenant uuid, first integer, next integer, worker varchar,
                        generation integer, now timestamptz)
             WHERE c.tenant = v_tenant AND i.id = c.id AND i.tenant_id = v_tenant
               AND i.generation = c.generation AND i.event_count = c.first
               AND {_held_by("i", "c.worker")}
            RETURNING i.id, i.tenant_id
        ), appended AS (
{_INSERT_FENCED_EVENTS}        )
        SELECT fence.id FROM fence;
    END LOOP;
    {_RESTORE_CALLER_TENANT}
END
$$;
"""


def append_events_function_sql(role: str) -> str:
    """The per-step append's function (it runs as its caller, under RLS), callable by
    ``role``."""
    return APPEND_EVENTS_FUNCTION + _invoker_grants(role, APPEND_EVENTS_SIGNATURE)


# PostgreSQL: the load in one message of two calls (one round trip instead of five: BEGIN,
# the tenant, the instance, the history, COMMIT), through the functions below: their
# statements are planned once per connection. Each runs as its caller, under RLS, with the
# run's tenant set as tenant_context() sets it (the caller's restored at the end), and reads
# only the claimed row (owner, generation, running). The instance comes as the table's own
# row type, so the function follows the model's columns; the first statement picks them in
# the model's order. Each statement takes its own snapshot, as the ORM's statements do inside
# a READ COMMITTED transaction.
LOAD_SIGNATURES = (
    "cleat.load_instance(uuid, uuid, bigint, text)",
    "cleat.load_history(uuid, uuid, bigint, text)",
)


# What a load's first statement selects from its function's row ``l`` (the one-run load and
# the claim's loads alike): the instance's row whole, then the definition's columns.
# ``(l.i).*`` comes in the table's column order, which store.lifecycle puts in the model's
# (INSTANCE_COLUMNS) by the result's column names (``_in_model_order``): naming each of the
# forty-odd columns, ``(l.i)."id", ...``, made the server resolve the row's type for each one
# at every parse, about 0.1 ms of each claim's message (bench/README.md, twenty-eighth pass).
_LOADED_COLUMNS = "(l.i).*, l.sha256, l.max_history_length, l.min_version"


def _load_sql() -> str:
    args = "p_tenant => %s, p_id => %s, p_generation => %s, p_worker => %s"
    return (
        f"SELECT {_LOADED_COLUMNS} FROM cleat.load_instance({args}) AS l;\n"
        "SELECT step, type_code, timestamp_ms, payload, checksum "
        f"FROM cleat.load_history({args});\n"
        # The run's interrupts as they stand at the load: its first blocking call reads them
        # from here instead of asking again (DjangoStorage's interrupts).
        f"{RUN_INTERRUPTS}"
    )


def _load_functions() -> str:
    instance = WorkflowInstance._meta.db_table
    definition = WorkflowDefinition._meta.db_table
    event = WorkflowEvent._meta.db_table
    fence = (
        "r.id = p_id AND r.tenant_id = p_tenant AND r.generation = p_generation\n"
        f"           AND {_held_by('r', 'p_worker')}"
    )
    begin, end = _AS_RUNS_TENANT_BEGIN, _AS_RUNS_TENANT_END
    return f"""
CREATE OR REPLACE FUNCTION cleat.load_instance(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(i {instance}, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
{begin}
    RETURN QUERY
    SELECT r, d.sha256, d.max_history_length, d.min_version
      FROM {instance} AS r JOIN {definition} AS d ON d.id = r.definition_id
     WHERE {fence};
{end}
CREATE OR REPLACE FUNCTION cleat.load_history(
    p_tenant uuid, p_id uuid, p_generation bigint, p_worker text)
RETURNS TABLE(step integer, type_code smallint, timestamp_ms bigint, payload text,
              checksum varchar)
LANGUAGE plpgsql AS $$
{begin}
    RETURN QUERY
    SELECT e.step, e.type_code, e.timestamp_ms, e.payload, e.checksum
      FROM {event} AS e
     WHERE e.instance_id = p_id
       AND EXISTS (SELECT 1 FROM {instance} AS r
                    WHERE {fence})
     ORDER BY e.step;
{end}
"""


LOAD_FUNCTIONS = _load_functions()


def load_functions_sql(role: str) -> str:
    """The load's functions (they run as their caller, under RLS), callable by ``role``."""
    return LOAD_FUNCTIONS + _invoker_grants(role, *LOAD_SIGNATURES)


# PostgreSQL: the worker's claim and the loads of the runs it claimed, in one message (one
# round trip for the whole batch instead of one claim and then a load per run). The first
# statement is the claim (the definer function below, unchanged); it also puts the claimed
# runs (id, tenant, generation, as JSON) in the transaction-local setting CLAIMED_SETTING,
# from which the next three read: the message is one implicit transaction, so the setting
# lives exactly as long as it. Each of the three runs as its caller, under RLS: for each
# tenant of the batch in turn it sets the tenant as tenant_context() does (the caller's
# restored at the end) and reads that tenant's claimed runs only, fenced as the single load
# is (owner, generation, running). Their rows come as load_run's, with the run's id in front
# of the history's and the interrupts' rows. Nothing claimed: the setting stays unset, and
# the three return nothing.
CLAIMED_SETTING = "cleat.claimed"
LOAD_CLAIMED_SIGNATURES = (
    "cleat.load_claimed_instances(text)",
    "cleat.load_claimed_histories(text)",
    "cleat.load_claimed_interrupts()",
)


def _claim_and_load_sql() -> str:
    return (
        f"WITH c AS ({CLAIM_READY}) "
        "SELECT c.id, c.tenant_id, c.generation, "
        f"set_config('{CLAIMED_SETTING}', (SELECT json_agg(json_build_object("
        "'id', k.id, 'tenant', k.tenant_id, 'generation', k.generation)) FROM c AS k)::text, "
        "true), "
        # The claim's commit does not wait for its WAL to reach the disk: the run's first
        # durable write (synchronous, later in the same WAL) makes it durable too, and a
        # claim lost with a crashed server only makes the run claimable again
        # (docs/persistence.md, "Load").
        "set_config('synchronous_commit', 'off', true) FROM c;\n"
        f"SELECT {_LOADED_COLUMNS} FROM cleat.load_claimed_instances(%s) AS l;\n"
        "SELECT instance_id, step, type_code, timestamp_ms, payload, checksum "
        "FROM cleat.load_claimed_histories(%s);\n"
        "SELECT instance_id, cancel_requested, cancel_reason, update_id, update_name, "
        "update_payload FROM cleat.load_claimed_interrupts();\n"
        # When the next run the claim left falls due (next_due_at), for the loop's sleep:
        # asked only when the claim took fewer runs than it could (a full one claims again).
        f"SELECT {NEXT_DUE_AT.removeprefix('SELECT ')} WHERE COALESCE(json_array_length("
        f"NULLIF(current_setting('{CLAIMED_SETTING}', true), '')::json), 0) < %s"
    )


def _load_claimed_functions() -> str:
    instance = WorkflowInstance._meta.db_table
    definition = WorkflowDefinition._meta.db_table
    event = WorkflowEvent._meta.db_table
    updates = UpdateRequest._meta.db_table
    pending = f"'{UpdateRequest.State.PENDING.value}'"
    claimed = "json_to_recordset(v_claimed) AS c(id uuid, tenant uuid, generation bigint)"
    fence = (
        "c.tenant = v_tenant AND r.tenant_id = v_tenant AND r.generation = c.generation\n"
        f"           AND {_held_by('r', 'p_worker')}"
    )

    def body(query: str) -> str:
        return f"""#variable_conflict use_column
DECLARE
    {_KEEP_CALLER_TENANT}
    v_claimed json := NULLIF(current_setting('{CLAIMED_SETTING}', true), '')::json;
    v_tenant uuid;
BEGIN
    FOR v_tenant IN SELECT DISTINCT t.tenant FROM json_to_recordset(v_claimed) AS t(tenant uuid)
    LOOP
        PERFORM set_config('{TENANT_SETTING}', v_tenant::text, true);
        RETURN QUERY
{query}
    END LOOP;
    {_RESTORE_CALLER_TENANT}
END
$$;"""

    instances = f"""        SELECT r, d.sha256, d.max_history_length, d.min_version
          FROM {claimed}
          JOIN {instance} AS r ON r.id = c.id
          JOIN {definition} AS d ON d.id = r.definition_id
         WHERE {fence};"""
    histories = f"""        SELECT e.instance_id, e.step, e.type_code, e.timestamp_ms, e.payload,
               e.checksum
          FROM {claimed}
          JOIN {instance} AS r ON r.id = c.id
          JOIN {event} AS e ON e.instance_id = r.id
         WHERE {fence}
         ORDER BY e.instance_id, e.step;"""
    interrupts = f"""        SELECT r.id, r.cancel_requested, r.cancel_reason, u.id, u.name,
               u.payload
          FROM {claimed}
          JOIN {instance} AS r ON r.id = c.id
          LEFT JOIN {updates} AS u
            ON u.instance_id = r.id AND u.tenant_id = v_tenant AND u.status = {pending}
         WHERE c.tenant = v_tenant AND r.tenant_id = v_tenant
         ORDER BY r.id, u.created_at, u.id;"""
    return f"""
CREATE OR REPLACE FUNCTION cleat.load_claimed_instances(p_worker text)
RETURNS TABLE(i {instance}, sha256 varchar, max_history_length integer, min_version integer)
LANGUAGE plpgsql AS $$
{body(instances)}
CREATE OR REPLACE FUNCTION cleat.load_claimed_histories(p_worker text)
RETURNS TABLE(instance_id uuid, step integer, type_code smallint, timestamp_ms bigint,
              payload text, checksum varchar)
LANGUAGE plpgsql AS $$
{body(histories)}
CREATE OR REPLACE FUNCTION cleat.load_claimed_interrupts()
RETURNS TABLE(instance_id uuid, cancel_requested boolean, cancel_reason text,
              update_id uuid, update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
{body(interrupts)}
"""


LOAD_CLAIMED_FUNCTIONS = _load_claimed_functions()


def load_claimed_functions_sql(role: str) -> str:
    """The claimed runs' load functions (they run as their caller, under RLS), callable by
    ``role``."""
    return LOAD_CLAIMED_FUNCTIONS + _invoker_grants(role, *LOAD_CLAIMED_SIGNATURES)


# PostgreSQL: what a fresh blocking call (a sleep, a wait) reads first -- the run's
# cancellation request and its pending updates -- in one call of the function below: one
# round trip, its statement planned once per connection, instead of two transactions (BEGIN,
# the tenant, the read, COMMIT). It runs as its caller, under RLS, with the run's tenant set
# as tenant_context() sets it (the caller's restored at the end): a row per pending update,
# oldest first, each with the run's cancellation columns; one row with no update when none
# waits; no row when the run is gone.
RUN_INTERRUPTS = (
    "SELECT cancel_requested, cancel_reason, update_id, update_name, update_payload "
    "FROM cleat.run_interrupts(%s, %s)"
)
RUN_INTERRUPTS_SIGNATURE = "cleat.run_interrupts(uuid, uuid)"
_LOAD_SQL = _load_sql()


def _run_interrupts_function() -> str:
    instance = WorkflowInstance._meta.db_table
    updates = UpdateRequest._meta.db_table
    pending = f"'{UpdateRequest.State.PENDING.value}'"
    return f"""
CREATE OR REPLACE FUNCTION cleat.run_interrupts(p_tenant uuid, p_id uuid)
RETURNS TABLE(cancel_requested boolean, cancel_reason text, update_id uuid,
              update_name varchar, update_payload text)
LANGUAGE plpgsql AS $$
{_AS_RUNS_TENANT_BEGIN}
    RETURN QUERY
    SELECT r.cancel_requested, r.cancel_reason, u.id, u.name, u.payload
      FROM {instance} AS r
      LEFT JOIN {updates} AS u
        ON u.instance_id = r.id AND u.tenant_id = p_tenant AND u.status = {pending}
     WHERE r.id = p_id AND r.tenant_id = p_tenant
     ORDER BY u.created_at, u.id;
{_AS_RUNS_TENANT_END}
"""


RUN_INTERRUPTS_FUNCTION = _run_interrupts_function()


def run_interrupts_function_sql(role: str) -> str:
    """The blocking call's read (it runs as its caller, under RLS), callable by ``role``."""
    return RUN_INTERRUPTS_FUNCTION + _invoker_grants(role, RUN_INTERRUPTS_SIGNATURE)


# A blocking wait's look for a signal (store.storage.DjangoStorage.next_signal): the oldest
# unconsumed signal of the run with one of the names, not one of those the segment consumed
# already, read as the run's tenant in one call (one round trip instead of a transaction of
# four: its begin, the tenant, the read, its commit). It runs as its caller, under RLS.
NEXT_SIGNAL = "SELECT id, name, payload, correlation_id FROM cleat.next_signal(%s, %s, %s, %s)"
NEXT_SIGNAL_SIGNATURE = "cleat.next_signal(uuid, uuid, text[], bigint[])"


def _next_signal_function() -> str:
    signals = Signal._meta.db_table
    return f"""
CREATE OR REPLACE FUNCTION cleat.next_signal(
    p_tenant uuid, p_id uuid, p_names text[], p_exclude bigint[])
RETURNS TABLE(id bigint, name varchar, payload text, correlation_id varchar)
LANGUAGE plpgsql AS $$
{_AS_RUNS_TENANT_BEGIN}
    RETURN QUERY
    SELECT s.id, s.name, s.payload, s.correlation_id
      FROM {signals} AS s
     WHERE s.tenant_id = p_tenant AND s.instance_id = p_id AND s.consumed_at IS NULL
       AND s.name = ANY(p_names) AND NOT (s.id = ANY(p_exclude))
     ORDER BY s.id
     LIMIT 1;
{_AS_RUNS_TENANT_END}
"""


NEXT_SIGNAL_FUNCTION = _next_signal_function()


def next_signal_function_sql(role: str) -> str:
    """A blocking wait's look for a signal (it runs as its caller, under RLS), callable by
    ``role``."""
    return NEXT_SIGNAL_FUNCTION + _invoker_grants(role, NEXT_SIGNAL_SIGNATURE)


# PostgreSQL: the finalize of runs that completed, in one call of the function below (one
# round trip and one commit instead of seven round trips a run, its statements planned once
# per connection), in the common case only -- no consumed signal, no answered update, no open
# child. One run's finalize (a run's own) or several (the group commit's, store.group_commit)
# alike: the first argument lists each run (JSON: its fence as the append's -- owner,
# generation, the first new step and the count after it -- and what its completion
# writes), the second every remaining event (``run`` naming its run), two text parameters
# as the append's (quoting eighteen parameters a run in Python cost the worker more than
# the statement). It runs as its caller, under RLS, and
# for each tenant in turn sets it as tenant_context() does (the caller's is restored at the
# end). The first statement is the fence and the new rows: it matches only the claimed rows
# (owner, generation, running) whose history ends where the remaining events begin and that
# have no open child, takes their row locks, inserts the remaining events of the matched runs
# only, and releases the locks each workflow holds (the locks were taken in the run's earlier,
# committed transactions, so the statement's snapshot sees them). Only for the matched runs,
# the second fails their pending updates (as _fail_pending_updates), in a statement of its
# own so that its snapshot is taken after the row locks: an update queued by send_update
# (which locks the row) either committed before and is seen, or waits for this commit and
# then finds the run done. The function returns each matched run with the run its end wakes
# (its parent, or the run that started it detached -- migration 0039; NULL for none); a run
# not returned was not written, and the general path in store.lifecycle tells
# the cases apart. What it writes is the transition engine.lifecycle.completion() returns,
# which the arguments come from (store.lifecycle.completion_entry).
FINALIZE_DONE = "SELECT id, parent_id FROM cleat.finalize_done(%s, %s)"
FINALIZE_DONE_SIGNATURE = "cleat.finalize_done(json, json)"
# A finalized run's fields in the first argument, each as json_to_recordset reads it.
_FINALIZE_RUN_COLUMNS = (
    "id uuid, tenant uuid, worker text, generation bigint, first integer, next integer, "
    "status text, now timestamptz, updated_at timestamptz, result text, query_state text, "
    "lock_holder text, updates_result text"
)


def _finalize_done_function() -> str:
    instance = WorkflowInstance._meta.db_table
    updates = UpdateRequest._meta.db_table
    locks = ConcurrencyKey._meta.db_table
    failed, pending = (
        f"'{s.value}'" for s in (UpdateRequest.State.FAILED, UpdateRequest.State.PENDING)
    )
    return f"""
CREATE OR REPLACE FUNCTION cleat.finalize_done(p_runs json, p_events json)
RETURNS TABLE(id uuid, parent_id uuid)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    {_KEEP_CALLER_TENANT}
    v_tenant uuid;
    v_ids uuid[];
    v_parents uuid[];
BEGIN
    FOR v_tenant IN SELECT DISTINCT r.tenant FROM json_to_recordset(p_runs) AS r(tenant uuid)
    LOOP
        PERFORM set_config('{TENANT_SETTING}', v_tenant::text, true);
        WITH fence AS (
            UPDATE {instance} AS i
               SET status = c.status, completed_at = c.now, result = c.result, error = NULL,
                   error_code = NULL, waiting_on = NULL, next_wake_at = NULL,
                   query_state = c.query_state::jsonb, assigned_to = NULL,
                   heartbeat_at = c.now, updated_at = c.updated_at,
                   event_count = COALESCE(c.next, i.event_count)
              FROM json_to_recordset(p_runs) AS c({_FINALIZE_RUN_COLUMNS})
             WHERE c.tenant = v_tenant AND i.id = c.id AND i.tenant_id = v_tenant
               AND i.generation = c.generation
               AND i.event_count = COALESCE(c.first, i.event_count)
               AND {_held_by("i", "c.worker")}
               AND NOT EXISTS (SELECT 1 FROM {instance} AS k
                                WHERE k.parent_id = i.id AND k.status NOT IN ({_TERMINAL}))
            RETURNING i.id, i.tenant_id, COALESCE(i.parent_id, i.detached_from) AS waker,
                      c.lock_holder
        ), appended AS (
{_INSERT_FENCED_EVENTS}        ), released AS (
            DELETE FROM {locks} AS k USING fence
             WHERE k.tenant_id = fence.tenant_id AND k.holder = fence.lock_holder
            RETURNING 1
        )
        SELECT array_agg(fence.id), array_agg(fence.waker) INTO v_ids, v_parents
          FROM fence;
        IF v_ids IS NOT NULL THEN
            UPDATE {updates} AS u SET status = {failed}, result = c.updates_result,
                   completed_at = c.now
              FROM json_to_recordset(p_runs) AS c({_FINALIZE_RUN_COLUMNS})
             WHERE c.tenant = v_tenant AND c.id = ANY(v_ids) AND u.instance_id = c.id
               AND u.status = {pending};
            RETURN QUERY SELECT * FROM unnest(v_ids, v_parents);
        END IF;
    END LOOP;
    {_RESTORE_CALLER_TENANT}
END
$$;
"""


FINALIZE_DONE_FUNCTION = _finalize_done_function()


def finalize_done_function_sql(role: str) -> str:
    """The one-call finalize's function (it runs as its caller, under RLS), callable by
    ``role``."""
    return FINALIZE_DONE_FUNCTION + _invoker_grants(role, FINALIZE_DONE_SIGNATURE)


# --- the dispatch loop (through the definer functions below) ---------------------------------

CLAIM_READY = (
    "SELECT id, tenant_id, generation FROM cleat.claim_instances(%s, %s, %s, %s, %s, %s, %s)"
)
NEXT_DUE_AT = "SELECT cleat.next_due_at(%s, %s)"
# The claim and the loads of what it claimed, in one message (see CLAIMED_SETTING).
CLAIM_AND_LOAD = _claim_and_load_sql()
HEARTBEAT_WORKER = "SELECT cleat.heartbeat_worker(%s, %s)"
REAP_EXPIRED_LEASES = "SELECT cleat.reap_expired_leases(%s, %s)"
CLAIM_INVOCATIONS = "SELECT id, tenant_id FROM cleat.claim_invocations(%s, %s, %s)"
READY_BACKLOG = "SELECT task_queue, definition_name, depth, oldest FROM cleat.ready_backlog(%s)"
MISSED_WAKES = "SELECT id, tenant_id FROM cleat.missed_wakes(%s, %s)"

# --- wake-ups ----------------------------------------------------------------------------------

NOTIFY_WAKE = "SELECT pg_notify(%s, '')"
# A run inserted ready wakes the idle workers from its insert: the trigger's NOTIFY is
# delivered by the insert's commit, as wake.notify_after_commit's is, without a statement of
# its own (a start was its insert, the NOTIFY and the commit). PostgreSQL folds the same
# notification sent twice in a transaction into one. Its presence here tells
# wake.ready_after_commit not to send one of its own after an insert.
READY_INSERT_WAKES = f"""
CREATE OR REPLACE FUNCTION cleat.wake_on_ready_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{NOTIFY_CHANNEL}', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS instance_ready_insert_wakes ON {WorkflowInstance._meta.db_table};
CREATE TRIGGER instance_ready_insert_wakes AFTER INSERT ON {WorkflowInstance._meta.db_table}
    FOR EACH ROW WHEN (NEW.status = '{RunStatus.READY.value}')
    EXECUTE FUNCTION cleat.wake_on_ready_insert();
"""
# The server's clock (not the transaction's start): the fleet's common time (worker.py).
DATABASE_NOW = "SELECT clock_timestamp()"

# A start's definition (definitions.resolve_definition): the versions deployed under a name
# and, in the same statement, the routing rules that weigh more than nothing -- a version's
# row has no weight, a rule's row no deprecation. Written out, not through the ORM: the two
# ORM statements it replaces cost about 0.76 ms of a start's CPU, this one 0.1 ms.
DEFINITION_VERSIONS = (
    f"SELECT version, deprecated, NULL::float8 FROM {WorkflowDefinition._meta.db_table} "
    "WHERE tenant_id = %s AND name = %s "
    f"UNION ALL SELECT version, NULL, weight FROM {RoutingRule._meta.db_table} "
    "WHERE tenant_id = %s AND name = %s AND weight > 0"
)
LISTEN_WAKE = f"LISTEN {NOTIFY_CHANNEL}"

# --- the RLS check (rls.bypass_reasons) --------------------------------------------------------

CONNECTION_ROLE = (
    "SELECT current_user, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
)
TABLE_SECURITY = """
            SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
                   pg_get_userbyid(c.relowner),
                   (SELECT count(*) FROM pg_policies p
                     WHERE p.tablename = c.relname AND p.schemaname = n.nspname)
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = current_schema() AND c.relname = ANY(%s)
            """

# The fenced lock of a run's row for the general finalize (store.storage.lock_fenced_instance):
# its columns but the checkpoint (store.columns.LOCKED_COLUMNS), while the run is still the
# worker's: the run, its tenant, its generation, its owner.
LOCK_FENCED_INSTANCE = (
    "SELECT "
    + ", ".join(f'i."{f.column}"' for f in LOCKED_COLUMNS.fields)
    + f" FROM {WorkflowInstance._meta.db_table} AS i"
    " WHERE i.id = %s AND i.tenant_id = %s AND i.generation = %s AND "
    + _held_by("i", "%s")
    + " FOR NO KEY UPDATE"
)

# What can wake a waiting run (store.wake.wakeup_arrived, the one readiness rule, whose ORM
# form the other databases take): a cancellation request (``p_cancel``, the run's own column,
# which the caller has read), a pending update (every wait), and, each only when the wait
# names it (NULL otherwise, and its read is skipped), an unconsumed signal of its names, an
# ended child of those it waits for (the run that ends the child's continue-as-new chain has
# ended: a child that continued as new has not -- migration 0038), its task call's reported
# outcome, its settled promise.
# A function, so its statement is planned once per connection; each source is read by the
# run or by its key, under the caller's tenant (it runs as its caller). The general
# finalize asks it after the fenced lock, and so does ``cleat.finalize_wait`` below.
WAKEUP_ARRIVED_SIGNATURE = "cleat.wakeup_arrived(boolean, uuid, text[], uuid[], uuid, text)"
WAKEUP_ARRIVED = (
    "SELECT cleat.wakeup_arrived(%s::boolean, %s::uuid, %s::text[], %s::uuid[], %s::uuid, %s::text)"
)


def _wakeup_arrived_function() -> str:
    instance = WorkflowInstance._meta.db_table
    return f"""
CREATE OR REPLACE FUNCTION cleat.wakeup_arrived(
    p_cancel boolean, p_run uuid, p_signals text[], p_children uuid[], p_task uuid,
    p_promise text)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN p_cancel IS TRUE
        OR EXISTS (SELECT 1 FROM {UpdateRequest._meta.db_table} AS u
                    WHERE u.instance_id = p_run
                      AND u.status = '{UpdateRequest.State.PENDING.value}')
        OR (p_signals IS NOT NULL
            AND EXISTS (SELECT 1 FROM {Signal._meta.db_table} AS s
                         WHERE s.instance_id = p_run AND s.consumed_at IS NULL
                           AND s.name = ANY(p_signals)))
        OR (p_children IS NOT NULL
            AND EXISTS (WITH RECURSIVE chain(id, status) AS (
                            SELECT c.id, c.status FROM {instance} AS c
                             WHERE c.id = ANY(p_children)
                            UNION ALL
                            SELECT n.id, n.status FROM {instance} AS n
                              JOIN chain ON n.continued_from_id = chain.id)
                        SELECT 1 FROM chain
                         WHERE chain.status IN ({_TERMINAL})
                           AND NOT EXISTS (SELECT 1 FROM {instance} AS n
                                            WHERE n.continued_from_id = chain.id)))
        OR (p_task IS NOT NULL
            AND EXISTS (SELECT 1 FROM {TaskCall._meta.db_table} AS k
                         WHERE k.id = p_task AND k.state = '{TaskCall.State.REPORTED.value}'))
        OR (p_promise IS NOT NULL
            AND EXISTS (SELECT 1 FROM {Promise._meta.db_table} AS p
                         WHERE p.id = p_promise
                           AND p.status <> '{Promise.State.PENDING.value}'));
END
$$;
"""


WAKEUP_ARRIVED_FUNCTION = _wakeup_arrived_function()


def wakeup_arrived_function_sql(role: str) -> str:
    """The readiness rule's function (it runs as its caller, under RLS), callable by
    ``role``."""
    return WAKEUP_ARRIVED_FUNCTION + _invoker_grants(role, WAKEUP_ARRIVED_SIGNATURE)


# PostgreSQL: the finalize of a segment that suspended (a wait: a timer, a signal, a child,
# a task call, a promise), in one call instead of a transaction of seven statements (its
# begin, the tenant, the fenced lock, the events' insert, the arrival check, the row's save,
# its commit). The store applies the transition engine.lifecycle.suspension() returns both
# ways -- with and without an arrival, which differ only in when the run is due -- and this
# chooses. For each run of the first argument (JSON: its fence as the append's, the
# transition's columns, the two due times, what its wait names) it sets the run's tenant
# (the caller's is restored at the end) and takes the fenced lock of the row: owner,
# generation, running, the history ending right before the first new event. A run whose
# fence does not hold is skipped, nothing of it written; so is one whose history is due for
# a fold (engine.compaction.due(): at least ``fold_at`` events not yet folded, when it is
# above 0), which the general path's fenced lock folds. Then it reads cleat.wakeup_arrived
# in a statement of its own, whose snapshot is taken after the lock -- the order
# store.wake's argument needs: a wake that committed before is seen here, one that commits
# after finds the run waiting -- and writes the row and the run's remaining events (the
# second argument). It returns each written run with when it is due. Only in the common case
# (store.lifecycle._wait_in_one_message): no consumed signal, no answered update.
FINALIZE_WAIT_SIGNATURE = "cleat.finalize_wait(json, json)"
FINALIZE_WAIT = "SELECT id, next_wake_at FROM cleat.finalize_wait(%s, %s)"
_FINALIZE_WAIT_COLUMNS = (
    "id uuid, tenant uuid, worker text, generation bigint, first integer, next integer, "
    "now timestamptz, updated_at timestamptz, status text, attempt integer, "
    "waiting_on text, result text, error text, error_code text, query_state text, "
    "wake_at timestamptz, wake_at_arrived timestamptz, fold_at integer, signals text[], "
    "children uuid[], task uuid, promise text"
)


def _finalize_wait_function() -> str:
    instance = WorkflowInstance._meta.db_table
    return f"""
CREATE OR REPLACE FUNCTION cleat.finalize_wait(p_runs json, p_events json)
RETURNS TABLE(id uuid, next_wake_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    {_KEEP_CALLER_TENANT}
    c record;
    v_cancel boolean;
    v_wake timestamptz;
    v_written integer;
BEGIN
    FOR c IN SELECT * FROM json_to_recordset(p_runs) AS r({_FINALIZE_WAIT_COLUMNS})
    LOOP
        PERFORM set_config('{TENANT_SETTING}', c.tenant::text, true);
        SELECT i.cancel_requested INTO v_cancel FROM {instance} AS i
         WHERE i.id = c.id AND i.tenant_id = c.tenant AND i.generation = c.generation
           AND i.event_count = COALESCE(c.first, i.event_count)
           AND {_held_by("i", "c.worker")}
           AND (c.fold_at <= 0
                OR COALESCE(c.next, i.event_count) - i.compacted_events < c.fold_at)
           FOR NO KEY UPDATE;
        CONTINUE WHEN NOT FOUND;
        v_wake := CASE WHEN cleat.wakeup_arrived(v_cancel, c.id, c.signals, c.children,
                                                 c.task, c.promise)
                       THEN c.wake_at_arrived ELSE c.wake_at END;
        WITH fence AS (
            UPDATE {instance} AS i
               SET status = c.status, attempt = COALESCE(c.attempt, i.attempt),
                   waiting_on = c.waiting_on::jsonb, next_wake_at = v_wake,
                   result = c.result, error = c.error, error_code = c.error_code,
                   query_state = c.query_state::jsonb, assigned_to = NULL,
                   heartbeat_at = c.now, updated_at = c.updated_at,
                   event_count = COALESCE(c.next, i.event_count)
             WHERE i.id = c.id AND i.tenant_id = c.tenant
            RETURNING i.id, i.tenant_id
        ), appended AS (
{_INSERT_FENCED_EVENTS}        )
        SELECT count(*) INTO v_written FROM fence;
        id := c.id;
        next_wake_at := v_wake;
        RETURN NEXT;
    END LOOP;
    {_RESTORE_CALLER_TENANT}
END
$$;
"""


FINALIZE_WAIT_FUNCTION = _finalize_wait_function()


def finalize_wait_function_sql(role: str) -> str:
    """The one-call finalize of a suspended segment (it runs as its caller, under RLS),
    callable by ``role``."""
    return FINALIZE_WAIT_FUNCTION + _invoker_grants(role, FINALIZE_WAIT_SIGNATURE)


QUERIES = {
    "set_tenant": SET_TENANT,
    "append_events": APPEND_EVENTS,
    "load_run": _LOAD_SQL,
    "lock_fenced_instance": LOCK_FENCED_INSTANCE,
    "run_interrupts": RUN_INTERRUPTS,
    "next_signal": NEXT_SIGNAL,
    "finalize_done": FINALIZE_DONE,
    "claim_ready": CLAIM_READY,
    "claim_and_load": CLAIM_AND_LOAD,
    "heartbeat_worker": HEARTBEAT_WORKER,
    "reap_expired_leases": REAP_EXPIRED_LEASES,
    "next_due_at": NEXT_DUE_AT,
    "claim_invocations": CLAIM_INVOCATIONS,
    "ready_backlog": READY_BACKLOG,
    "missed_wakes": MISSED_WAKES,
    "wakeup_arrived": WAKEUP_ARRIVED,
    "finalize_wait": FINALIZE_WAIT,
    "notify_wake": NOTIFY_WAKE,
    "ready_insert_wakes": READY_INSERT_WAKES,
    "database_now": DATABASE_NOW,
    "definition_versions": DEFINITION_VERSIONS,
    "listen_wake": LISTEN_WAKE,
    "connection_role": CONNECTION_ROLE,
    "table_security": TABLE_SECURITY,
}


# --- what the migrations install (live definitions; frozen copies in the migrations) ----------

CURRENT_TENANT_FUNCTION = """
CREATE SCHEMA IF NOT EXISTS cleat;
CREATE OR REPLACE FUNCTION cleat.current_tenant() RETURNS uuid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := current_setting('cleat.tenant_id', true);
BEGIN
    IF v IS NULL OR v = '' THEN
        RAISE EXCEPTION 'cleat.tenant_id is not set -- tenant context required for RLS-scoped query'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'wrap the query in workflows.tenancy.tenant_context()';
    END IF;
    RETURN v::uuid;
END $$;
"""


def enable_rls_sql(table: str) -> str:
    # (SELECT ...) makes the planner evaluate the function once per statement, not per row.
    return f"""
ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {table} FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON {table};
CREATE POLICY tenant_isolation ON {table}
    USING (tenant_id = (SELECT cleat.current_tenant()))
    WITH CHECK (tenant_id = (SELECT cleat.current_tenant()));
"""


def disable_rls_sql(table: str) -> str:
    return f"""
DROP POLICY IF EXISTS tenant_isolation ON {table};
ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY;
ALTER TABLE {table} DISABLE ROW LEVEL SECURITY;
"""


def roles_sql(role: str, password: str | None) -> str:
    password_sql = f"ALTER ROLE {role} PASSWORD %(password)s;" if password else ""
    return f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{DISPATCHER_ROLE}') THEN
        CREATE ROLE {DISPATCHER_ROLE} NOLOGIN BYPASSRLS;
    END IF;
END $$;
{password_sql}
GRANT USAGE ON SCHEMA public TO {role}, {DISPATCHER_ROLE};
GRANT USAGE ON SCHEMA cleat TO {role}, {DISPATCHER_ROLE};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {role};
GRANT SELECT, UPDATE ON workflows_workflowinstance TO {DISPATCHER_ROLE};
GRANT SELECT, UPDATE ON workflows_tenant TO {DISPATCHER_ROLE};
"""


# The claim's statement, for ``cleat.claim_instances``: the worker's (all tenants, any run)
# and the general one (``p_tenant``, ``p_run``), the same statement but for their filters.
_CLAIM_STATEMENT = """    WITH room AS (
        SELECT t.id AS tenant_id, t.last_claimed_at,
               CASE WHEN COALESCE(t.max_running, p_default_cap) > 0
                    THEN LEAST(p_limit, COALESCE(t.max_running, p_default_cap) - (
                         SELECT count(*) FROM (
                                SELECT 1 FROM workflows_workflowinstance AS r
                                 WHERE r.tenant_id = t.id AND r.status = 'running'
                                 LIMIT COALESCE(t.max_running, p_default_cap)) AS n))
                    ELSE p_limit END AS room
          FROM workflows_tenant AS t
         WHERE t.is_active{tenant}
           -- only tenants with something due pay for counting their running runs
           AND EXISTS (SELECT 1 FROM workflows_workflowinstance AS w
                        WHERE w.tenant_id = t.id AND w.status = 'ready'
                          AND w.next_wake_at <= p_now AND w.task_queue = ANY(p_queues){run_w})
    ),
    -- Each (tenant, queue) reads its most urgent runs off instance_tenant_due_order in its
    -- order, stopping at the room: an equality on the queue (not = ANY) keeps that order,
    -- so a claim among many due runs reads a few index entries instead of sorting them all.
    -- A worker of K queues locks up to K x room rows for the statement and takes room of
    -- them: another claim skips the rest until this one commits.
    candidates AS (
        SELECT c.id, c.tenant_id, r.last_claimed_at, c.priority, c.next_wake_at, c.created_at
          FROM room AS r
          CROSS JOIN LATERAL (
                SELECT q.id, q.tenant_id, q.priority, q.next_wake_at, q.created_at
                  FROM (SELECT DISTINCT unnest(p_queues) AS name) AS queue
                  CROSS JOIN LATERAL (
                        SELECT d.id, d.tenant_id, d.priority, d.next_wake_at, d.created_at
                          FROM workflows_workflowinstance AS d
                         WHERE d.tenant_id = r.tenant_id AND d.status = 'ready'
                           AND d.task_queue = queue.name AND d.next_wake_at <= p_now{run_d}
                         ORDER BY d.priority DESC, d.next_wake_at, d.created_at
                         LIMIT GREATEST(r.room, 0)
                           FOR UPDATE SKIP LOCKED) AS q
                 ORDER BY q.priority DESC, q.next_wake_at, q.created_at
                 LIMIT GREATEST(r.room, 0)) AS c
         WHERE r.room > 0
    ),
    chosen AS (
        SELECT k.id FROM (
               SELECT candidates.*, row_number() OVER (
                      PARTITION BY candidates.tenant_id
                      ORDER BY candidates.priority DESC, candidates.next_wake_at,
                               candidates.created_at) AS turn
                 FROM candidates) AS k
         ORDER BY k.turn, k.last_claimed_at NULLS FIRST, k.priority DESC, k.next_wake_at
         LIMIT p_limit
    ),
    claimed AS (
        UPDATE workflows_workflowinstance AS i
           SET status = 'running', assigned_to = p_worker, heartbeat_at = p_now,
               generation = i.generation + 1, started_at = COALESCE(i.started_at, p_now),
               updated_at = p_now
         WHERE i.id IN (SELECT chosen.id FROM chosen)
        RETURNING i.id, i.tenant_id, i.generation
    ),
    served AS (
        -- SKIP LOCKED: a claim never waits for (nor deadlocks with) another claim's turn
        -- record; a tenant whose row is busy keeps its older turn this once. Turns are
        -- recorded only when tenants competed: a tenant alone with due runs took no turn.
        UPDATE workflows_tenant AS t SET last_claimed_at = p_now
         WHERE t.id IN (SELECT s.id FROM workflows_tenant AS s
                         WHERE s.id IN (SELECT claimed.tenant_id FROM claimed)
                           AND (SELECT count(*) FROM room) > 1
                           FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT claimed.id, claimed.tenant_id, claimed.generation FROM claimed;
"""


def _claim_statement(general: bool) -> str:
    if not general:
        return _CLAIM_STATEMENT.format(tenant="", run_w="", run_d="")
    return _CLAIM_STATEMENT.format(
        tenant=" AND (p_tenant IS NULL OR t.id = p_tenant)",
        run_w="\n                          AND (p_run IS NULL OR w.id = p_run)",
        run_d="\n                           AND (p_run IS NULL OR d.id = p_run)",
    )


_CLAIM_COMMON = _claim_statement(general=False)
_CLAIM_GENERAL = _claim_statement(general=True)


# When the next ready run of the queues (of one tenant, or of all) falls due: the worker's
# sleep, and the claim's message when it took fewer runs than it could. PL/pgSQL, not SQL: a
# SQL function with a SET clause is never inlined, and PostgreSQL 15 plans its query again at
# every call (about 0.2 ms, more than the query); PL/pgSQL keeps each branch's plan for the
# connection, and each branch is planned for its own filter.
NEXT_DUE_AT_FUNCTION = """
CREATE OR REPLACE FUNCTION cleat.next_due_at(p_queues text[], p_tenant uuid DEFAULT NULL)
RETURNS timestamptz
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF p_tenant IS NULL THEN
        RETURN (SELECT min(next_wake_at) FROM workflows_workflowinstance
                 WHERE status = 'ready' AND task_queue = ANY(p_queues));
    END IF;
    RETURN (SELECT min(next_wake_at) FROM workflows_workflowinstance
             WHERE status = 'ready' AND task_queue = ANY(p_queues) AND tenant_id = p_tenant);
END
$$;"""


def definer_functions_sql(role: str) -> str:
    """The cross-tenant statements of the dispatch loop, as definer functions."""
    return f"""
DROP FUNCTION IF EXISTS cleat.claim_instances(text, text[], integer, timestamptz, uuid, integer);
CREATE OR REPLACE FUNCTION cleat.claim_instances(
    p_worker text, p_queues text[], p_limit integer, p_now timestamptz, p_tenant uuid,
    p_default_cap integer, p_run uuid)
RETURNS TABLE(id uuid, tenant_id uuid, generation bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_mode text;
BEGIN
    IF p_tenant IS NULL AND p_run IS NULL THEN
        -- The worker's claim, on every loop: planned once per connection (a generic plan,
        -- made again when PostgreSQL invalidates it, as after an ANALYZE that changes the
        -- table's size, and with each new connection) instead of at every call, where
        -- planning cost as much as the claim. The caller's setting is put back after it.
        v_mode := current_setting('plan_cache_mode');
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        RETURN QUERY
{_CLAIM_COMMON}
        PERFORM set_config('plan_cache_mode', v_mode, true);
        RETURN;
    END IF;
    -- One tenant's runs, or one named run (the broker dispatch): planned for the values.
    RETURN QUERY
{_CLAIM_GENERAL}END
$$;

CREATE OR REPLACE FUNCTION cleat.reap_expired_leases(p_cutoff timestamptz, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH reaped AS (
        UPDATE workflows_workflowinstance
           SET status = 'ready', assigned_to = NULL, generation = generation + 1,
               next_wake_at = p_now, updated_at = p_now
         WHERE status = 'running' AND heartbeat_at < p_cutoff
        RETURNING 1)
    SELECT count(*)::integer FROM reaped
$$;

CREATE OR REPLACE FUNCTION cleat.heartbeat_worker(p_worker text, p_now timestamptz)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    -- SKIP LOCKED: a row locked by one of the worker's own writes (a group-commit batch
    -- locks several) gets a fresh heartbeat_at from that write; waiting for it could
    -- deadlock with a batch waiting for a row this statement locked first.
    WITH beat AS (
        UPDATE workflows_workflowinstance SET heartbeat_at = p_now
         WHERE id IN (SELECT h.id FROM workflows_workflowinstance AS h
                       WHERE h.assigned_to = p_worker AND h.status = 'running'
                       FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*)::integer FROM beat
$$;

{NEXT_DUE_AT_FUNCTION}

{_function_privileges(role)}
"""


DEFINER_FUNCTIONS = (
    "cleat.claim_instances(text, text[], integer, timestamptz, uuid, integer, uuid)",
    "cleat.reap_expired_leases(timestamptz, timestamptz)",
    "cleat.heartbeat_worker(text, timestamptz)",
    "cleat.next_due_at(text[], uuid)",
)


def _function_privileges(role: str) -> str:
    """Owned by the dispatcher role; callable by the application role only."""
    lines = []
    for function in DEFINER_FUNCTIONS:
        lines += [
            f"ALTER FUNCTION {function} OWNER TO {DISPATCHER_ROLE};",
            f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC;",
            f"GRANT EXECUTE ON FUNCTION {function} TO {role};",
        ]
    return "\n".join(lines)


# A deactivated tenant's invocations wait with its runs (migration 0006_tenant_fairness installs
# this text; 0003 installed it without the tenant join).
CLAIM_INVOCATIONS_FUNCTION = """
CREATE OR REPLACE FUNCTION cleat.claim_invocations(
    p_now timestamptz, p_limit integer, p_until timestamptz)
RETURNS TABLE(id varchar, tenant_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    UPDATE workflows_invocation AS v SET deliver_at = p_until
     WHERE v.id IN (
           SELECT c.id FROM workflows_invocation AS c
             JOIN workflows_tenant AS t ON t.id = c.tenant_id AND t.is_active
            WHERE c.status = 'pending' AND c.deliver_at <= p_now
            ORDER BY c.deliver_at LIMIT p_limit FOR UPDATE OF c SKIP LOCKED)
    RETURNING v.id, v.tenant_id
$$;
"""


# The web process's /metrics reads the due backlog of every tenant (workflows/store/
# backlog.py holds the rule: ready and due at ``p_now``); its connection sees one tenant at
# a time, so the fleet-wide aggregate is a definer function. It returns counts per task
# queue and definition name, never a row. Installed by migration 0014_workers.
READY_BACKLOG_SIGNATURE = "cleat.ready_backlog(timestamptz)"


def ready_backlog_function_sql(role: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION cleat.ready_backlog(p_now timestamptz)
RETURNS TABLE(task_queue varchar, definition_name varchar, depth bigint, oldest timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT w.task_queue, w.definition_name, count(*), min(w.next_wake_at)
      FROM workflows_workflowinstance AS w
     WHERE w.status = 'ready' AND w.next_wake_at <= p_now
     GROUP BY w.task_queue, w.definition_name
$$;
ALTER FUNCTION {READY_BACKLOG_SIGNATURE} OWNER TO {DISPATCHER_ROLE};
REVOKE EXECUTE ON FUNCTION {READY_BACKLOG_SIGNATURE} FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {READY_BACKLOG_SIGNATURE} TO {role};
"""


# -- missed_wakes -- the wake sweep's candidates (workflows/store/wake.py): every tenant's waiting
# runs (ready, not due) that received something since p_since -- a child that ended, a run it
# started detached that ended (migration 0040), an unconsumed signal, a pending update, a reported
# task outcome, a settled promise -- or were asked to cancel. Each source is read by its index on
# when it arrived (migration 0015_wake_sweep), so a pass costs what arrived since the last one;
# the caller judges each run in its own tenant's context. Installed by 0015_wake_sweep.
MISSED_WAKES_SIGNATURE = "cleat.missed_wakes(timestamptz, timestamptz)"
MISSED_WAKES_FUNCTION = """
CREATE OR REPLACE FUNCTION cleat.missed_wakes(p_since timestamptz, p_now timestamptz)
RETURNS TABLE(id uuid, tenant_id uuid)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Planned at each call with the values in hand (EXECUTE): planned once for any
    -- p_since, the arrival ranges look like a third of each table, and the plan reads the
    -- tables whole (66 ms a call among 400,000 runs; 2 ms planned with the values).
    -- The arrivals are read first, once (MATERIALIZED): planned as a semi-join, a waiting
    -- set the statistics took for one row was scanned run by run against the arrivals,
    -- a seconds-long sweep among 10,000 waiting runs that held up the worker's loop.
    RETURN QUERY EXECUTE $sweep$
    WITH arrived AS MATERIALIZED (
        SELECT c.parent_id AS id FROM workflows_workflowinstance AS c
         WHERE c.completed_at >= $1 AND c.parent_id IS NOT NULL
        UNION ALL
        SELECT c.detached_from FROM workflows_workflowinstance AS c
         WHERE c.completed_at >= $1 AND c.detached_from IS NOT NULL
        UNION ALL
        SELECT s.instance_id FROM workflows_signal AS s
         WHERE s.created_at >= $1 AND s.consumed_at IS NULL
        UNION ALL
        SELECT u.instance_id FROM workflows_updaterequest AS u
         WHERE u.status = 'pending' AND u.created_at >= $1
        UNION ALL
        SELECT k.instance_id FROM workflows_taskcall AS k
         WHERE k.state = 'reported' AND k.reported_at >= $1
        UNION ALL
        SELECT p.instance_id FROM workflows_promise AS p
         WHERE p.settled_at >= $1)
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.id IN (SELECT a.id FROM arrived AS a)
       AND w.status = 'ready' AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    UNION
    SELECT w.id, w.tenant_id
      FROM workflows_workflowinstance AS w
     WHERE w.cancel_requested AND w.status = 'ready'
       AND (w.next_wake_at IS NULL OR w.next_wake_at > $2)
    $sweep$ USING p_since, p_now;
END
$$;
"""
# What the function reads, granted to its owner (it bypasses RLS, not privileges).
MISSED_WAKES_TABLES = (
    "workflows_signal",
    "workflows_updaterequest",
    "workflows_taskcall",
    "workflows_promise",
)


def missed_wakes_sql(role: str) -> str:
    """The sweep's definer function, owned by the dispatcher role, callable by ``role``."""
    grants = "\n".join(
        f"GRANT SELECT ON {table} TO {DISPATCHER_ROLE};" for table in MISSED_WAKES_TABLES
    )
    return f"""{grants}
{MISSED_WAKES_FUNCTION}
ALTER FUNCTION {MISSED_WAKES_SIGNATURE} OWNER TO {DISPATCHER_ROLE};
REVOKE EXECUTE ON FUNCTION {MISSED_WAKES_SIGNATURE} FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {MISSED_WAKES_SIGNATURE} TO {role};
"""
