//! The raw ABI v1 imports of module `"env"` (docs/abi.md §6), one `extern` declaration each.
//! Strings are `(ptr, len)` pairs of UTF-8; a packed buffer is `(ptr << 32) | len` with the
//! status byte first. Prefer the typed wrappers of the crate root.

#[link(wasm_import_module = "env")]
extern "C" {
    // BEGIN GENERATED IMPORTS (sdk/guest_imports.py)
    /// packed buffer
    pub fn durable_call(service_ptr: *const u8, service_len: usize, operation_ptr: *const u8, operation_len: usize, request_ptr: *const u8, request_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn durable_call_with_retry(service_ptr: *const u8, service_len: usize, operation_ptr: *const u8, operation_len: usize, request_ptr: *const u8, request_len: usize, max_attempts: i64, initial_interval_ms: i64, backoff_coefficient_x100: i64, max_interval_ms: i64, non_retryable_errors_ptr: *const u8, non_retryable_errors_len: usize) -> i64;
    /// packed buffer
    pub fn durable_call_with_heartbeat(service_ptr: *const u8, service_len: usize, operation_ptr: *const u8, operation_len: usize, request_ptr: *const u8, request_len: usize, heartbeat_interval_ms: i64) -> i64;
    /// packed buffer
    pub fn durable_send(service_ptr: *const u8, service_len: usize, operation_ptr: *const u8, operation_len: usize, request_ptr: *const u8, request_len: usize) -> i64;
    /// packed buffer
    pub fn durable_schedule_invoke(service_ptr: *const u8, service_len: usize, operation_ptr: *const u8, operation_len: usize, request_ptr: *const u8, request_len: usize, delay_ms: i64) -> i64;
    /// packed buffer
    pub fn fetch(method_ptr: *const u8, method_len: usize, url_ptr: *const u8, url_len: usize, headers_ptr: *const u8, headers_len: usize, body_ptr: *const u8, body_len: usize) -> i64;
    /// packed buffer
    pub fn plugin_call(plugin_ptr: *const u8, plugin_len: usize, function_ptr: *const u8, function_len: usize, input_ptr: *const u8, input_len: usize) -> i64;
    /// packed buffer
    pub fn plugin_call_streaming(plugin_ptr: *const u8, plugin_len: usize, function_ptr: *const u8, function_len: usize, input_ptr: *const u8, input_len: usize) -> i64;
    /// scalar
    pub fn now() -> i64;
    /// scalar
    pub fn random() -> i64;
    /// packed buffer
    pub fn uuid(seed_ptr: *const u8, seed_len: usize) -> i64;
    /// packed buffer
    pub fn side_effect(value_ptr: *const u8, value_len: usize) -> i64;
    /// packed buffer
    pub fn workflow_id() -> i64;
    /// packed buffer
    pub fn run_id() -> i64;
    /// scalar
    pub fn version() -> i64;
    /// scalar
    pub fn min_version() -> i64;
    /// scalar
    pub fn durable_log(level: i32, message_ptr: *const u8, message_len: usize) -> i64;
    /// packed buffer
    pub fn json_parse(input_ptr: *const u8, input_len: usize) -> i64;
    /// packed buffer
    pub fn json_stringify(input_ptr: *const u8, input_len: usize) -> i64;
    /// scalar, blocking
    pub fn durable_sleep(duration_ms: i64) -> i64;
    /// packed buffer, blocking
    pub fn durable_await_signals(names_ptr: *const u8, names_len: usize, timeout_ms: i64) -> i64;
    /// packed buffer
    pub fn poll_signal(name_ptr: *const u8, name_len: usize) -> i64;
    /// packed buffer
    pub fn poll_cancellation() -> i64;
    /// packed buffer
    pub fn signal_workflow(target_id_ptr: *const u8, target_id_len: usize, name_ptr: *const u8, name_len: usize, payload_ptr: *const u8, payload_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn send_signal_and_wait(target_id_ptr: *const u8, target_id_len: usize, name_ptr: *const u8, name_len: usize, payload_ptr: *const u8, payload_len: usize, timeout_ms: i64) -> i64;
    /// packed buffer
    pub fn reply_to_signal(correlation_id_ptr: *const u8, correlation_id_len: usize, response_ptr: *const u8, response_len: usize) -> i64;
    /// packed buffer
    pub fn create_promise(name_ptr: *const u8, name_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn await_promise(promise_id_ptr: *const u8, promise_id_len: usize, timeout_ms: i64) -> i64;
    /// packed buffer
    pub fn resolve_promise(promise_id_ptr: *const u8, promise_id_len: usize, value_ptr: *const u8, value_len: usize) -> i64;
    /// packed buffer
    pub fn reject_promise(promise_id_ptr: *const u8, promise_id_len: usize, message_ptr: *const u8, message_len: usize) -> i64;
    /// scalar
    pub fn register_update_handler(export_name_ptr: *const u8, export_name_len: usize) -> i64;
    /// scalar
    pub fn set_query_state(key_ptr: *const u8, key_len: usize, value_ptr: *const u8, value_len: usize) -> i64;
    /// packed buffer
    pub fn child_workflow(name_ptr: *const u8, name_len: usize, input_ptr: *const u8, input_len: usize) -> i64;
    /// packed buffer
    pub fn child_workflow_with_options(name_ptr: *const u8, name_len: usize, input_ptr: *const u8, input_len: usize, version: i64, priority: i64, parent_close_policy_ptr: *const u8, parent_close_policy_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn await_child(run_id_ptr: *const u8, run_id_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn await_all_children(run_ids_ptr: *const u8, run_ids_len: usize) -> i64;
    /// packed buffer, blocking
    pub fn await_any_child(run_ids_ptr: *const u8, run_ids_len: usize) -> i64;
    /// packed buffer
    pub fn poll_child(run_id_ptr: *const u8, run_id_len: usize) -> i64;
    /// scalar
    pub fn continue_as_new(input_ptr: *const u8, input_len: usize) -> i64;
    /// scalar
    pub fn continue_as_new_with_version(input_ptr: *const u8, input_len: usize, version: i64) -> i64;
    /// packed buffer
    pub fn run_detached(name_ptr: *const u8, name_len: usize, input_ptr: *const u8, input_len: usize) -> i64;
    /// packed buffer
    pub fn durable_defer(export_name_ptr: *const u8, export_name_len: usize) -> i64;
    /// scalar
    pub fn set_state(key_ptr: *const u8, key_len: usize, value_ptr: *const u8, value_len: usize) -> i64;
    /// packed buffer
    pub fn get_state(key_ptr: *const u8, key_len: usize) -> i64;
    /// scalar
    pub fn delete_state(key_ptr: *const u8, key_len: usize) -> i64;
    /// scalar
    pub fn incr_state(key_ptr: *const u8, key_len: usize, delta: i64) -> i64;
    /// scalar
    pub fn has_state(key_ptr: *const u8, key_len: usize) -> i64;
    /// packed buffer
    pub fn list_state(prefix_ptr: *const u8, prefix_len: usize) -> i64;
    /// packed buffer
    pub fn set_scope(object_type_ptr: *const u8, object_type_len: usize, instance_key_ptr: *const u8, instance_key_len: usize) -> i64;
    /// packed buffer
    pub fn get_scope() -> i64;
    /// scalar
    pub fn acquire_lock(key_ptr: *const u8, key_len: usize, ttl_ms: i64) -> i64;
    /// scalar
    pub fn release_lock(key_ptr: *const u8, key_len: usize) -> i64;
    /// packed buffer
    pub fn schedule_cron(workflow_name_ptr: *const u8, workflow_name_len: usize, cron_expr_ptr: *const u8, cron_expr_len: usize, timezone_ptr: *const u8, timezone_len: usize, input_ptr: *const u8, input_len: usize) -> i64;
    /// packed buffer
    pub fn delete_cron(schedule_id_ptr: *const u8, schedule_id_len: usize) -> i64;
    /// packed buffer
    pub fn list_crons() -> i64;
    // END GENERATED IMPORTS
}
