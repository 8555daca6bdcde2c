// The raw ABI v1 imports of module "env" (docs/abi.md §6). Strings are (ptr, len) pairs of
// UTF-8 bytes; a packed buffer is (ptr << 32) | len with the status byte first. Prefer the
// typed wrappers of index.ts.

// BEGIN GENERATED IMPORTS (sdk/guest_imports.py)
// packed buffer
@external("env", "durable_call")
export declare function durable_call(service_ptr: usize, service_len: usize, operation_ptr: usize, operation_len: usize, request_ptr: usize, request_len: usize): i64;
// packed buffer, blocking
@external("env", "durable_call_with_retry")
export declare function durable_call_with_retry(service_ptr: usize, service_len: usize, operation_ptr: usize, operation_len: usize, request_ptr: usize, request_len: usize, max_attempts: i64, initial_interval_ms: i64, backoff_coefficient_x100: i64, max_interval_ms: i64, non_retryable_errors_ptr: usize, non_retryable_errors_len: usize): i64;
// packed buffer
@external("env", "durable_call_with_heartbeat")
export declare function durable_call_with_heartbeat(service_ptr: usize, service_len: usize, operation_ptr: usize, operation_len: usize, request_ptr: usize, request_len: usize, heartbeat_interval_ms: i64): i64;
// packed buffer
@external("env", "durable_send")
export declare function durable_send(service_ptr: usize, service_len: usize, operation_ptr: usize, operation_len: usize, request_ptr: usize, request_len: usize): i64;
// packed buffer
@external("env", "durable_schedule_invoke")
export declare function durable_schedule_invoke(service_ptr: usize, service_len: usize, operation_ptr: usize, operation_len: usize, request_ptr: usize, request_len: usize, delay_ms: i64): i64;
// packed buffer
@external("env", "fetch")
export declare function fetch(method_ptr: usize, method_len: usize, url_ptr: usize, url_len: usize, headers_ptr: usize, headers_len: usize, body_ptr: usize, body_len: usize): i64;
// packed buffer
@external("env", "plugin_call")
export declare function plugin_call(plugin_ptr: usize, plugin_len: usize, function_ptr: usize, function_len: usize, input_ptr: usize, input_len: usize): i64;
// packed buffer
@external("env", "plugin_call_streaming")
export declare function plugin_call_streaming(plugin_ptr: usize, plugin_len: usize, function_ptr: usize, function_len: usize, input_ptr: usize, input_len: usize): i64;
// scalar
@external("env", "now")
export declare function now(): i64;
// scalar
@external("env", "random")
export declare function random(): i64;
// packed buffer
@external("env", "uuid")
export declare function uuid(seed_ptr: usize, seed_len: usize): i64;
// packed buffer
@external("env", "side_effect")
export declare function side_effect(value_ptr: usize, value_len: usize): i64;
// packed buffer
@external("env", "workflow_id")
export declare function workflow_id(): i64;
// packed buffer
@external("env", "run_id")
export declare function run_id(): i64;
// scalar
@external("env", "version")
export declare function version(): i64;
// scalar
@external("env", "min_version")
export declare function min_version(): i64;
// scalar
@external("env", "durable_log")
export declare function durable_log(level: i32, message_ptr: usize, message_len: usize): i64;
// packed buffer
@external("env", "json_parse")
export declare function json_parse(input_ptr: usize, input_len: usize): i64;
// packed buffer
@external("env", "json_stringify")
export declare function json_stringify(input_ptr: usize, input_len: usize): i64;
// scalar, blocking
@external("env", "durable_sleep")
export declare function durable_sleep(duration_ms: i64): i64;
// packed buffer, blocking
@external("env", "durable_await_signals")
export declare function durable_await_signals(names_ptr: usize, names_len: usize, timeout_ms: i64): i64;
// packed buffer
@external("env", "poll_signal")
export declare function poll_signal(name_ptr: usize, name_len: usize): i64;
// packed buffer
@external("env", "poll_cancellation")
export declare function poll_cancellation(): i64;
// packed buffer
@external("env", "signal_workflow")
export declare function signal_workflow(target_id_ptr: usize, target_id_len: usize, name_ptr: usize, name_len: usize, payload_ptr: usize, payload_len: usize): i64;
// packed buffer, blocking
@external("env", "send_signal_and_wait")
export declare function send_signal_and_wait(target_id_ptr: usize, target_id_len: usize, name_ptr: usize, name_len: usize, payload_ptr: usize, payload_len: usize, timeout_ms: i64): i64;
// packed buffer
@external("env", "reply_to_signal")
export declare function reply_to_signal(correlation_id_ptr: usize, correlation_id_len: usize, response_ptr: usize, response_len: usize): i64;
// packed buffer
@external("env", "create_promise")
export declare function create_promise(name_ptr: usize, name_len: usize): i64;
// packed buffer, blocking
@external("env", "await_promise")
export declare function await_promise(promise_id_ptr: usize, promise_id_len: usize, timeout_ms: i64): i64;
// packed buffer
@external("env", "resolve_promise")
export declare function resolve_promise(promise_id_ptr: usize, promise_id_len: usize, value_ptr: usize, value_len: usize): i64;
// packed buffer
@external("env", "reject_promise")
export declare function reject_promise(promise_id_ptr: usize, promise_id_len: usize, message_ptr: usize, message_len: usize): i64;
// scalar
@external("env", "register_update_handler")
export declare function register_update_handler(export_name_ptr: usize, export_name_len: usize): i64;
// scalar
@external("env", "set_query_state")
export declare function set_query_state(key_ptr: usize, key_len: usize, value_ptr: usize, value_len: usize): i64;
// packed buffer
@external("env", "child_workflow")
export declare function child_workflow(name_ptr: usize, name_len: usize, input_ptr: usize, input_len: usize): i64;
// packed buffer
@external("env", "child_workflow_with_options")
export declare function child_workflow_with_options(name_ptr: usize, name_len: usize, input_ptr: usize, input_len: usize, version: i64, priority: i64, parent_close_policy_ptr: usize, parent_close_policy_len: usize): i64;
// packed buffer, blocking
@external("env", "await_child")
export declare function await_child(run_id_ptr: usize, run_id_len: usize): i64;
// packed buffer, blocking
@external("env", "await_all_children")
export declare function await_all_children(run_ids_ptr: usize, run_ids_len: usize): i64;
// packed buffer, blocking
@external("env", "await_any_child")
export declare function await_any_child(run_ids_ptr: usize, run_ids_len: usize): i64;
// packed buffer
@external("env", "poll_child")
export declare function poll_child(run_id_ptr: usize, run_id_len: usize): i64;
// scalar
@external("env", "continue_as_new")
export declare function continue_as_new(input_ptr: usize, input_len: usize): i64;
// scalar
@external("env", "continue_as_new_with_version")
export declare function continue_as_new_with_version(input_ptr: usize, input_len: usize, version: i64): i64;
// packed buffer
@external("env", "run_detached")
export declare function run_detached(name_ptr: usize, name_len: usize, input_ptr: usize, input_len: usize): i64;
// packed buffer
@external("env", "durable_defer")
export declare function durable_defer(export_name_ptr: usize, export_name_len: usize): i64;
// scalar
@external("env", "set_state")
export declare function set_state(key_ptr: usize, key_len: usize, value_ptr: usize, value_len: usize): i64;
// packed buffer
@external("env", "get_state")
export declare function get_state(key_ptr: usize, key_len: usize): i64;
// scalar
@external("env", "delete_state")
export declare function delete_state(key_ptr: usize, key_len: usize): i64;
// scalar
@external("env", "incr_state")
export declare function incr_state(key_ptr: usize, key_len: usize, delta: i64): i64;
// scalar
@external("env", "has_state")
export declare function has_state(key_ptr: usize, key_len: usize): i64;
// packed buffer
@external("env", "list_state")
export declare function list_state(prefix_ptr: usize, prefix_len: usize): i64;
// packed buffer
@external("env", "set_scope")
export declare function set_scope(object_type_ptr: usize, object_type_len: usize, instance_key_ptr: usize, instance_key_len: usize): i64;
// packed buffer
@external("env", "get_scope")
export declare function get_scope(): i64;
// scalar
@external("env", "acquire_lock")
export declare function acquire_lock(key_ptr: usize, key_len: usize, ttl_ms: i64): i64;
// scalar
@external("env", "release_lock")
export declare function release_lock(key_ptr: usize, key_len: usize): i64;
// packed buffer
@external("env", "schedule_cron")
export declare function schedule_cron(workflow_name_ptr: usize, workflow_name_len: usize, cron_expr_ptr: usize, cron_expr_len: usize, timezone_ptr: usize, timezone_len: usize, input_ptr: usize, input_len: usize): i64;
// packed buffer
@external("env", "delete_cron")
export declare function delete_cron(schedule_id_ptr: usize, schedule_id_len: usize): i64;
// packed buffer
@external("env", "list_crons")
export declare function list_crons(): i64;
// END GENERATED IMPORTS
