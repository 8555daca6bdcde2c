/* cleat guest SDK for C: workflows as wasm32 core modules over ABI v1 (docs/abi.md).
 *
 *     #include "cleat.h"
 *
 *     static cleat_reply order(cleat_str input) {
 *         cleat_reply reservation = cleat_call(CLEAT_S("inventory"), CLEAT_S("reserve"), input);
 *         if (!cleat_is_ok(reservation)) return reservation;   // fail with the same status
 *         return cleat_ok(reservation.value);
 *     }
 *     CLEAT_WORKFLOW(run, order)
 *
 * Build: manage.py build_workflow order.c  (zig cc -target wasm32-freestanding, no libc).
 *
 * Strings are views (cleat_str: pointer + length, not NUL-terminated); CLEAT_S("...") makes
 * one from a literal, cleat_cstr() from a C string. Every host call is recorded on first
 * execution and answered from the history on replay. Calls answering a packed buffer return
 * a cleat_reply: a status (CLEAT_OK, CLEAT_ERROR, ...) and the payload (the value's JSON, or
 * the error message). Blocking calls may end the segment inside the call; nothing to handle.
 * Memory comes from a bump allocator (cleat_alloc) that never frees: an instance lives for
 * one segment only.
 */
#ifndef CLEAT_H
#define CLEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes (docs/abi.md §2; wire values, never change) ---------------------------- */
enum {
    CLEAT_OK = 0,
    CLEAT_ERROR = 1,
    CLEAT_PERMANENT = 2,
    CLEAT_AMBIGUOUS = 3,
    CLEAT_TIMEOUT = 4,
    CLEAT_CANCELLED = 5,
    CLEAT_RETRIES_EXHAUSTED = 6,
    CLEAT_NOT_FOUND = 7,
    CLEAT_DENIED = 8,
};

typedef struct {
    const char *ptr;
    size_t len;
} cleat_str;

#define CLEAT_S(literal) ((cleat_str){(literal), sizeof(literal) - 1})
#define CLEAT_NULL_STR ((cleat_str){0, 0})

typedef struct {
    uint8_t status;
    cleat_str value; /* OK: the payload (JSON or text); otherwise the error message */
} cleat_reply;

static inline bool cleat_is_ok(cleat_reply r) { return r.status == CLEAT_OK; }
/* Python's CallFailed: ERROR or RETRIES_EXHAUSTED. */
static inline bool cleat_is_call_failed(cleat_reply r) {
    return r.status == CLEAT_ERROR || r.status == CLEAT_RETRIES_EXHAUSTED;
}

/* ---- memory and strings ------------------------------------------------------------------ */
void *cleat_alloc(size_t size); /* the export the host calls too */
cleat_str cleat_cstr(const char *s);
bool cleat_str_eq(cleat_str a, cleat_str b);
void *cleat_memcpy(void *dst, const void *src, size_t n);
/* The lower-case label of a status ("permanent") and back. */
cleat_str cleat_status_label(uint8_t status);

/* A growable byte buffer (for JSON documents and messages). */
typedef struct {
    char *ptr;
    size_t len, cap;
} cleat_buf;

cleat_buf cleat_buf_new(void);
void cleat_buf_bytes(cleat_buf *b, const char *p, size_t n);
void cleat_buf_str(cleat_buf *b, cleat_str s);
void cleat_buf_cstr(cleat_buf *b, const char *s);
void cleat_buf_char(cleat_buf *b, char c);
void cleat_buf_int(cleat_buf *b, int64_t n);
cleat_str cleat_buf_view(const cleat_buf *b);

/* ---- JSON -------------------------------------------------------------------------------- */
/* Writing: cleat_json_begin_object(&b); cleat_json_key(&b, "id"); cleat_json_string(&b, s);
 * ...; cleat_json_end_object(&b). Commas are inserted for you. Values taken from another
 * document (a cleat_json_get result) go in unchanged with cleat_json_raw. */
void cleat_json_begin_object(cleat_buf *b);
void cleat_json_end_object(cleat_buf *b);
void cleat_json_begin_array(cleat_buf *b);
void cleat_json_end_array(cleat_buf *b);
void cleat_json_key(cleat_buf *b, const char *key);
void cleat_json_string(cleat_buf *b, cleat_str s);
void cleat_json_int(cleat_buf *b, int64_t n);
void cleat_json_bool(cleat_buf *b, bool v);
void cleat_json_null(cleat_buf *b);
void cleat_json_raw(cleat_buf *b, cleat_str json); /* an empty view writes null */

/* Reading: views into a document, no copies. A missing member or item is an empty view
 * (.ptr == NULL). Keys are compared byte for byte with their JSON text. */
cleat_str cleat_json_get(cleat_str object, const char *key);
cleat_str cleat_json_at(cleat_str array, size_t index);
size_t cleat_json_length(cleat_str array);
bool cleat_json_is_null(cleat_str value); /* null, or missing */
bool cleat_json_as_int(cleat_str value, int64_t *out);
bool cleat_json_as_bool(cleat_str value, bool *out);
/* The decoded text of a JSON string (escapes resolved), or an empty view. */
cleat_str cleat_json_as_string(cleat_str value);
/* Whether the view is one complete JSON value. */
bool cleat_json_valid(cleat_str value);

/* ---- entry points ------------------------------------------------------------------------ */
cleat_reply cleat_ok(cleat_str json);
cleat_reply cleat_fail(uint8_t status, cleat_str message);
int64_t cleat_pack(cleat_reply reply);

/* Export `fn` (cleat_reply fn(cleat_str input_json)) as the entry point `name`; defer and
 * update handlers are exported the same way. */
#define CLEAT_WORKFLOW(name, fn)                                               \
    __attribute__((export_name(#name))) int64_t name(const char *ptr, size_t len) { \
        return cleat_pack(fn((cleat_str){ptr, len}));                          \
    }
#define CLEAT_HANDLER(name, fn) CLEAT_WORKFLOW(name, fn)

/* ---- calls to the outside world ---------------------------------------------------------- */
typedef struct {
    int64_t max_attempts;
    int64_t initial_interval_ms;
    int64_t backoff_x100; /* 200: each wait doubles */
    int64_t max_interval_ms;
    cleat_str non_retryable; /* JSON array of substrings; empty: [] */
} cleat_retry;

/* The Python SDK's defaults: 3 attempts, 1 s, x2, at most 60 s. */
#define CLEAT_RETRY_DEFAULT ((cleat_retry){3, 1000, 200, 60000, {0, 0}})

cleat_reply cleat_call(cleat_str service, cleat_str operation, cleat_str request);
cleat_reply cleat_call_with_retry(cleat_str service, cleat_str operation, cleat_str request,
                                  cleat_retry retry);
cleat_reply cleat_call_with_heartbeat(cleat_str service, cleat_str operation, cleat_str request,
                                      int64_t heartbeat_ms);
cleat_reply cleat_send(cleat_str service, cleat_str operation, cleat_str request);
cleat_reply cleat_schedule_invoke(cleat_str service, cleat_str operation, cleat_str request,
                                  int64_t delay_ms);
/* OK: {"status":int,"headers":{...},"body":"..."}; DENIED for a refused URL. */
cleat_reply cleat_fetch(cleat_str method, cleat_str url, cleat_str headers_json, cleat_str body);
cleat_reply cleat_plugin_call(cleat_str plugin, cleat_str function, cleat_str input);
cleat_reply cleat_plugin_call_streaming(cleat_str plugin, cleat_str function, cleat_str input);

/* ---- time, randomness, identity, logging ------------------------------------------------- */
int64_t cleat_now_ms(void);
/* ms since the epoch as Python's datetime.isoformat() in UTC: 2026-01-01T07:00:00+00:00 */
cleat_str cleat_iso8601(int64_t ms);
int64_t cleat_random(void);
cleat_str cleat_uuid(cleat_str seed);
cleat_reply cleat_side_effect(cleat_str value_json);
cleat_str cleat_workflow_id(void);
cleat_str cleat_run_id(void);
int64_t cleat_version(void);
int64_t cleat_min_version(void);
enum { CLEAT_DEBUG = 0, CLEAT_INFO = 1, CLEAT_WARN = 2, CLEAT_LOG_ERROR = 3 };
void cleat_log(int32_t level, cleat_str message);
cleat_reply cleat_json_parse(cleat_str input);
cleat_reply cleat_json_stringify(cleat_str input);

/* ---- timers, signals, promises, updates, queries ----------------------------------------- */
/* 0, or CLEAT_CANCELLED when the run was cancelled while it slept. */
int64_t cleat_sleep_ms(int64_t duration_ms);
#define CLEAT_NO_TIMEOUT ((int64_t)-1)
/* names: a JSON array; OK: {"name":..,"payload":..}; TIMEOUT; CANCELLED. */
cleat_reply cleat_await_signals(cleat_str names_json, int64_t timeout_ms);
cleat_reply cleat_poll_signal(cleat_str name); /* NOT_FOUND when none arrived */
cleat_reply cleat_poll_cancellation(void);     /* OK: the reason; NOT_FOUND */
cleat_reply cleat_signal(cleat_str target_id, cleat_str name, cleat_str payload);
cleat_reply cleat_signal_and_wait(cleat_str target_id, cleat_str name, cleat_str payload,
                                  int64_t timeout_ms);
cleat_reply cleat_reply_to_signal(cleat_str correlation_id, cleat_str response);
cleat_reply cleat_create_promise(cleat_str name);
cleat_reply cleat_await_promise(cleat_str promise_id, int64_t timeout_ms);
cleat_reply cleat_resolve_promise(cleat_str promise_id, cleat_str value);
cleat_reply cleat_reject_promise(cleat_str promise_id, cleat_str message);
void cleat_register_update_handler(cleat_str export_name);
void cleat_set_query(cleat_str key, cleat_str value_json);

/* ---- children, continue-as-new, detached runs, defers ------------------------------------ */
cleat_reply cleat_child(cleat_str name, cleat_str input);
cleat_reply cleat_child_with_options(cleat_str name, cleat_str input, int64_t version,
                                     int64_t priority, cleat_str parent_close_policy);
cleat_reply cleat_await_child(cleat_str run_id);
cleat_reply cleat_await_all_children(cleat_str run_ids_json);
cleat_reply cleat_await_any_child(cleat_str run_ids_json);
cleat_reply cleat_poll_child(cleat_str run_id); /* NOT_FOUND while it runs */
_Noreturn void cleat_continue_as_new(cleat_str input);
_Noreturn void cleat_continue_as_new_with_version(cleat_str input, int64_t version);
cleat_reply cleat_run_detached(cleat_str name, cleat_str input);
cleat_reply cleat_defer(cleat_str export_name);

/* ---- state, locks, scopes, schedules ----------------------------------------------------- */
void cleat_set_state(cleat_str key, cleat_str value_json);
cleat_reply cleat_get_state(cleat_str key); /* NOT_FOUND */
bool cleat_delete_state(cleat_str key);
int64_t cleat_incr_state(cleat_str key, int64_t delta);
bool cleat_has_state(cleat_str key);
cleat_reply cleat_list_state(cleat_str prefix);
cleat_reply cleat_set_scope(cleat_str object_type, cleat_str instance_key);
cleat_reply cleat_get_scope(void);
bool cleat_acquire_lock(cleat_str key, int64_t ttl_ms);
void cleat_release_lock(cleat_str key);
cleat_reply cleat_schedule_cron(cleat_str workflow_name, cleat_str cron, cleat_str timezone,
                                cleat_str input);
cleat_reply cleat_delete_cron(cleat_str schedule_id);
cleat_reply cleat_list_crons(void);

/* ---- the raw imports of module "env" (prefer the wrappers above) ------------------------- */
// BEGIN GENERATED IMPORTS (sdk/guest_imports.py)
/* packed buffer */
__attribute__((import_module("env"), import_name("durable_call")))
int64_t cleat_sys_durable_call(const char *service, size_t service_len, const char *operation, size_t operation_len, const char *request, size_t request_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("durable_call_with_retry")))
int64_t cleat_sys_durable_call_with_retry(const char *service, size_t service_len, const char *operation, size_t operation_len, const char *request, size_t request_len, int64_t max_attempts, int64_t initial_interval_ms, int64_t backoff_coefficient_x100, int64_t max_interval_ms, const char *non_retryable_errors, size_t non_retryable_errors_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("durable_call_with_heartbeat")))
int64_t cleat_sys_durable_call_with_heartbeat(const char *service, size_t service_len, const char *operation, size_t operation_len, const char *request, size_t request_len, int64_t heartbeat_interval_ms);
/* packed buffer */
__attribute__((import_module("env"), import_name("durable_send")))
int64_t cleat_sys_durable_send(const char *service, size_t service_len, const char *operation, size_t operation_len, const char *request, size_t request_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("durable_schedule_invoke")))
int64_t cleat_sys_durable_schedule_invoke(const char *service, size_t service_len, const char *operation, size_t operation_len, const char *request, size_t request_len, int64_t delay_ms);
/* packed buffer */
__attribute__((import_module("env"), import_name("fetch")))
int64_t cleat_sys_fetch(const char *method, size_t method_len, const char *url, size_t url_len, const char *headers, size_t headers_len, const char *body, size_t body_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("plugin_call")))
int64_t cleat_sys_plugin_call(const char *plugin, size_t plugin_len, const char *function, size_t function_len, const char *input, size_t input_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("plugin_call_streaming")))
int64_t cleat_sys_plugin_call_streaming(const char *plugin, size_t plugin_len, const char *function, size_t function_len, const char *input, size_t input_len);
/* scalar */
__attribute__((import_module("env"), import_name("now")))
int64_t cleat_sys_now(void);
/* scalar */
__attribute__((import_module("env"), import_name("random")))
int64_t cleat_sys_random(void);
/* packed buffer */
__attribute__((import_module("env"), import_name("uuid")))
int64_t cleat_sys_uuid(const char *seed, size_t seed_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("side_effect")))
int64_t cleat_sys_side_effect(const char *value, size_t value_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("workflow_id")))
int64_t cleat_sys_workflow_id(void);
/* packed buffer */
__attribute__((import_module("env"), import_name("run_id")))
int64_t cleat_sys_run_id(void);
/* scalar */
__attribute__((import_module("env"), import_name("version")))
int64_t cleat_sys_version(void);
/* scalar */
__attribute__((import_module("env"), import_name("min_version")))
int64_t cleat_sys_min_version(void);
/* scalar */
__attribute__((import_module("env"), import_name("durable_log")))
int64_t cleat_sys_durable_log(int32_t level, const char *message, size_t message_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("json_parse")))
int64_t cleat_sys_json_parse(const char *input, size_t input_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("json_stringify")))
int64_t cleat_sys_json_stringify(const char *input, size_t input_len);
/* scalar, blocking */
__attribute__((import_module("env"), import_name("durable_sleep")))
int64_t cleat_sys_durable_sleep(int64_t duration_ms);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("durable_await_signals")))
int64_t cleat_sys_durable_await_signals(const char *names, size_t names_len, int64_t timeout_ms);
/* packed buffer */
__attribute__((import_module("env"), import_name("poll_signal")))
int64_t cleat_sys_poll_signal(const char *name, size_t name_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("poll_cancellation")))
int64_t cleat_sys_poll_cancellation(void);
/* packed buffer */
__attribute__((import_module("env"), import_name("signal_workflow")))
int64_t cleat_sys_signal_workflow(const char *target_id, size_t target_id_len, const char *name, size_t name_len, const char *payload, size_t payload_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("send_signal_and_wait")))
int64_t cleat_sys_send_signal_and_wait(const char *target_id, size_t target_id_len, const char *name, size_t name_len, const char *payload, size_t payload_len, int64_t timeout_ms);
/* packed buffer */
__attribute__((import_module("env"), import_name("reply_to_signal")))
int64_t cleat_sys_reply_to_signal(const char *correlation_id, size_t correlation_id_len, const char *response, size_t response_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("create_promise")))
int64_t cleat_sys_create_promise(const char *name, size_t name_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("await_promise")))
int64_t cleat_sys_await_promise(const char *promise_id, size_t promise_id_len, int64_t timeout_ms);
/* packed buffer */
__attribute__((import_module("env"), import_name("resolve_promise")))
int64_t cleat_sys_resolve_promise(const char *promise_id, size_t promise_id_len, const char *value, size_t value_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("reject_promise")))
int64_t cleat_sys_reject_promise(const char *promise_id, size_t promise_id_len, const char *message, size_t message_len);
/* scalar */
__attribute__((import_module("env"), import_name("register_update_handler")))
int64_t cleat_sys_register_update_handler(const char *export_name, size_t export_name_len);
/* scalar */
__attribute__((import_module("env"), import_name("set_query_state")))
int64_t cleat_sys_set_query_state(const char *key, size_t key_len, const char *value, size_t value_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("child_workflow")))
int64_t cleat_sys_child_workflow(const char *name, size_t name_len, const char *input, size_t input_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("child_workflow_with_options")))
int64_t cleat_sys_child_workflow_with_options(const char *name, size_t name_len, const char *input, size_t input_len, int64_t version, int64_t priority, const char *parent_close_policy, size_t parent_close_policy_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("await_child")))
int64_t cleat_sys_await_child(const char *run_id, size_t run_id_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("await_all_children")))
int64_t cleat_sys_await_all_children(const char *run_ids, size_t run_ids_len);
/* packed buffer, blocking */
__attribute__((import_module("env"), import_name("await_any_child")))
int64_t cleat_sys_await_any_child(const char *run_ids, size_t run_ids_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("poll_child")))
int64_t cleat_sys_poll_child(const char *run_id, size_t run_id_len);
/* scalar */
__attribute__((import_module("env"), import_name("continue_as_new")))
int64_t cleat_sys_continue_as_new(const char *input, size_t input_len);
/* scalar */
__attribute__((import_module("env"), import_name("continue_as_new_with_version")))
int64_t cleat_sys_continue_as_new_with_version(const char *input, size_t input_len, int64_t version);
/* packed buffer */
__attribute__((import_module("env"), import_name("run_detached")))
int64_t cleat_sys_run_detached(const char *name, size_t name_len, const char *input, size_t input_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("durable_defer")))
int64_t cleat_sys_durable_defer(const char *export_name, size_t export_name_len);
/* scalar */
__attribute__((import_module("env"), import_name("set_state")))
int64_t cleat_sys_set_state(const char *key, size_t key_len, const char *value, size_t value_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("get_state")))
int64_t cleat_sys_get_state(const char *key, size_t key_len);
/* scalar */
__attribute__((import_module("env"), import_name("delete_state")))
int64_t cleat_sys_delete_state(const char *key, size_t key_len);
/* scalar */
__attribute__((import_module("env"), import_name("incr_state")))
int64_t cleat_sys_incr_state(const char *key, size_t key_len, int64_t delta);
/* scalar */
__attribute__((import_module("env"), import_name("has_state")))
int64_t cleat_sys_has_state(const char *key, size_t key_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("list_state")))
int64_t cleat_sys_list_state(const char *prefix, size_t prefix_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("set_scope")))
int64_t cleat_sys_set_scope(const char *object_type, size_t object_type_len, const char *instance_key, size_t instance_key_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("get_scope")))
int64_t cleat_sys_get_scope(void);
/* scalar */
__attribute__((import_module("env"), import_name("acquire_lock")))
int64_t cleat_sys_acquire_lock(const char *key, size_t key_len, int64_t ttl_ms);
/* scalar */
__attribute__((import_module("env"), import_name("release_lock")))
int64_t cleat_sys_release_lock(const char *key, size_t key_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("schedule_cron")))
int64_t cleat_sys_schedule_cron(const char *workflow_name, size_t workflow_name_len, const char *cron_expr, size_t cron_expr_len, const char *timezone, size_t timezone_len, const char *input, size_t input_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("delete_cron")))
int64_t cleat_sys_delete_cron(const char *schedule_id, size_t schedule_id_len);
/* packed buffer */
__attribute__((import_module("env"), import_name("list_crons")))
int64_t cleat_sys_list_crons(void);
// END GENERATED IMPORTS

#ifdef __cplusplus
}
#endif
#endif /* CLEAT_H */
