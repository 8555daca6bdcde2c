//! cleat guest SDK for Rust: workflows as `wasm32-unknown-unknown` core modules over ABI v1.
//!
//! ```ignore
//! #![no_std]
//! extern crate alloc;
//! use cleat::{obj, Value};
//!
//! fn order(input: Value) -> cleat::Result<Value> {
//!     let reservation = cleat::call("inventory", "reserve", &input)?;
//!     let approval = cleat::await_signals(&["approved"], Some(3_600_000))?;
//!     Ok(obj! { "reservation" => reservation, "approval" => approval.payload })
//! }
//! cleat::workflow!(run, order);
//! ```
//!
//! Every function here is one host import (docs/abi.md §6): recorded by the host the first
//! time it runs and answered from the history on replay. Values are [`json::Value`]s; a
//! non-OK status is an [`Error`] carrying the status and the host's message, so `?` fails
//! the workflow with the same class. Blocking calls (sleep, signals, children, promises,
//! retries) may end the segment inside the call: the guest needs no handling for it.
//!
//! The crate is `no_std` + `alloc`. With the default `runtime` feature it also provides what
//! a module needs: a bump allocator (the global allocator and the `cleat_alloc` export; the
//! host never frees and an instance lives one segment), a panic handler that traps, and
//! `cleat_abi_version`.

#![no_std]

#[doc(hidden)]
pub extern crate alloc as __alloc;
extern crate alloc;

pub mod json;
pub mod sys;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

pub use json::Value;

// --- status codes and errors ------------------------------------------------------------------

/// An ABI status code (docs/abi.md §2). Wire values: new ones may appear, none change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u8);

impl Status {
    pub const OK: Status = Status(0);
    pub const ERROR: Status = Status(1);
    pub const PERMANENT: Status = Status(2);
    pub const AMBIGUOUS: Status = Status(3);
    pub const TIMEOUT: Status = Status(4);
    pub const CANCELLED: Status = Status(5);
    pub const RETRIES_EXHAUSTED: Status = Status(6);
    pub const NOT_FOUND: Status = Status(7);
    pub const DENIED: Status = Status(8);

    /// The lower-case label the host uses for run errors and child results.
    pub fn label(self) -> &'static str {
        match self.0 {
            0 => "ok",
            1 => "error",
            2 => "permanent",
            3 => "ambiguous",
            4 => "timeout",
            5 => "cancelled",
            6 => "retries_exhausted",
            7 => "not_found",
            8 => "denied",
            _ => "error",
        }
    }

    pub fn from_label(label: &str) -> Status {
        (0u8..=8).map(Status).find(|s| s.label() == label).unwrap_or(Status::ERROR)
    }
}

/// A failed host call, or the failure a workflow returns: a status and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new<M: Into<String>>(status: Status, message: M) -> Error {
        Error { status, message: message.into() }
    }
    /// Retryable (the worker retries the run under its definition's policy).
    pub fn error<M: Into<String>>(message: M) -> Error {
        Error::new(Status::ERROR, message)
    }
    /// Do not retry.
    pub fn permanent<M: Into<String>>(message: M) -> Error {
        Error::new(Status::PERMANENT, message)
    }
    /// A failed call in the sense of Python's `CallFailed`: ERROR or RETRIES_EXHAUSTED.
    pub fn is_call_failed(&self) -> bool {
        self.status == Status::ERROR || self.status == Status::RETRIES_EXHAUSTED
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.label(), self.message)
    }
}

pub type Result<T> = core::result::Result<T, Error>;

// --- packed buffers ---------------------------------------------------------------------------

/// A packed buffer the host returned: `(ptr << 32) | len`, status byte first.
#[derive(Clone, Copy, Debug)]
pub struct Packed(pub i64);

impl Packed {
    pub fn status(self) -> Status {
        Status(self.bytes().first().copied().unwrap_or(1))
    }
    fn bytes(self) -> &'static [u8] {
        let ptr = ((self.0 as u64) >> 32) as usize as *const u8;
        let len = (self.0 as u64 & 0xffff_ffff) as usize;
        if len == 0 {
            return &[];
        }
        // The host wrote `len` bytes at `ptr` through `cleat_alloc`; nothing frees them.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }
    /// The payload as text (the host only writes UTF-8).
    pub fn payload(self) -> &'static str {
        let bytes = self.bytes();
        let payload = if bytes.is_empty() { bytes } else { &bytes[1..] };
        core::str::from_utf8(payload).unwrap_or("")
    }
    /// The payload for OK, else the [`Error`] with the status and message.
    pub fn text(self) -> Result<String> {
        if self.status() == Status::OK {
            Ok(String::from(self.payload()))
        } else {
            Err(Error::new(self.status(), self.payload()))
        }
    }
    /// The payload as JSON for OK (an empty payload is `null`; a payload that is not JSON
    /// is kept as a string), else the [`Error`].
    pub fn json(self) -> Result<Value> {
        self.text().map(|text| loads(&text))
    }
    /// Like [`Packed::json`], with `NOT_FOUND` answered as `None`.
    pub fn json_or_missing(self) -> Result<Option<Value>> {
        if self.status() == Status::NOT_FOUND {
            return Ok(None);
        }
        self.json().map(Some)
    }
}

fn loads(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    json::parse(text).unwrap_or_else(|_| Value::String(String::from(text)))
}

/// Pack `status` and `payload` into a buffer the host reads (an entry point's reply).
pub fn pack_reply(status: Status, payload: &str) -> i64 {
    let len = payload.len() + 1;
    let ptr = cleat_alloc_impl(len);
    unsafe {
        *ptr = status.0;
        core::ptr::copy_nonoverlapping(payload.as_ptr(), ptr.add(1), payload.len());
    }
    ((ptr as usize as u64) << 32 | len as u64) as i64
}

// --- entry points -----------------------------------------------------------------------------

#[doc(hidden)]
pub fn __entry(ptr: *const u8, len: usize, f: fn(Value) -> Result<Value>) -> i64 {
    let input = if len == 0 {
        Value::Null
    } else {
        let bytes = unsafe { core::slice::from_raw_parts(ptr, len) };
        match core::str::from_utf8(bytes) {
            Ok(text) => loads(text),
            Err(_) => return pack_reply(Status::PERMANENT, "the input is not UTF-8"),
        }
    };
    match f(input) {
        Ok(value) => pack_reply(Status::OK, &value.to_string()),
        Err(e) => pack_reply(e.status, &e.message),
    }
}

/// Export `fn(Value) -> cleat::Result<Value>` as an entry point (or a defer or update
/// handler, which have the same shape): `cleat::workflow!(run, order_saga);`.
#[macro_export]
macro_rules! workflow {
    ($export:ident, $f:path) => {
        #[no_mangle]
        pub extern "C" fn $export(ptr: *const u8, len: usize) -> i64 {
            $crate::__entry(ptr, len, $f)
        }
    };
}

/// The same as [`workflow!`], for defer and update handlers.
#[macro_export]
macro_rules! handler {
    ($export:ident, $f:path) => {
        $crate::workflow!($export, $f);
    };
}

// --- the runtime: allocator, cleat_alloc, panic handler ---------------------------------------

static mut HEAP: usize = 0;

extern "C" {
    static __heap_base: u8;
}

/// Bump allocation from the end of the module's data, growing memory as needed.
fn bump(size: usize, align: usize) -> *mut u8 {
    unsafe {
        if HEAP == 0 {
            HEAP = &__heap_base as *const u8 as usize;
        }
        let start = (HEAP + align - 1) & !(align - 1);
        let end = start + size;
        let have = core::arch::wasm32::memory_size(0) * 65536;
        if end > have {
            let pages = (end - have + 65535) / 65536;
            if core::arch::wasm32::memory_grow(0, pages) == usize::MAX {
                core::arch::wasm32::unreachable();
            }
        }
        HEAP = end;
        start as *mut u8
    }
}

fn cleat_alloc_impl(size: usize) -> *mut u8 {
    bump(size, 8)
}

#[cfg(feature = "runtime")]
mod runtime {
    use core::alloc::{GlobalAlloc, Layout};

    struct Bump;

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            super::bump(layout.size(), layout.align())
        }
        unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
    }

    #[global_allocator]
    static ALLOCATOR: Bump = Bump;

    #[no_mangle]
    pub extern "C" fn cleat_alloc(size: usize) -> *mut u8 {
        super::cleat_alloc_impl(size)
    }

    #[no_mangle]
    pub extern "C" fn cleat_abi_version() -> i32 {
        1
    }

    /// A panic traps: the run fails with code `panic` (retried under the run's policy).
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
        core::arch::wasm32::unreachable()
    }
}

// --- calls to the outside world ---------------------------------------------------------------

/// Call `service.operation` once: the response, or the error status the host answered.
pub fn call(service: &str, operation: &str, request: &Value) -> Result<Value> {
    let request = request.to_string();
    Packed(unsafe { sys::durable_call(service.as_ptr(), service.len(), operation.as_ptr(), operation.len(), request.as_ptr(), request.len()) }).json()
}

/// The retry policy of [`call_with_retry`] (the Python SDK's defaults).
#[derive(Clone, Debug)]
pub struct Retry {
    pub max_attempts: i64,
    pub initial_interval_ms: i64,
    /// The backoff coefficient × 100 (200 doubles each wait).
    pub backoff_x100: i64,
    pub max_interval_ms: i64,
    /// Substrings of error messages that stop the retries at once (PERMANENT).
    pub non_retryable: Vec<String>,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_x100: 200,
            max_interval_ms: 60_000,
            non_retryable: Vec::new(),
        }
    }
}

impl Retry {
    pub fn attempts(n: i64) -> Retry {
        Retry { max_attempts: n, ..Retry::default() }
    }
    pub fn initial_interval_ms(mut self, ms: i64) -> Retry {
        self.initial_interval_ms = ms;
        self
    }
    pub fn backoff_x100(mut self, x100: i64) -> Retry {
        self.backoff_x100 = x100;
        self
    }
    pub fn max_interval_ms(mut self, ms: i64) -> Retry {
        self.max_interval_ms = ms;
        self
    }
    pub fn non_retryable(mut self, substrings: &[&str]) -> Retry {
        self.non_retryable = substrings.iter().map(|s| String::from(*s)).collect();
        self
    }
}

/// Call with durable retries (the waits between attempts are durable timers):
/// `RETRIES_EXHAUSTED` with the last error, or `PERMANENT` at once.
pub fn call_with_retry(service: &str, operation: &str, request: &Value, retry: &Retry) -> Result<Value> {
    let request = request.to_string();
    let non_retryable = Value::from(retry.non_retryable.clone()).to_string();
    Packed(unsafe {
        sys::durable_call_with_retry(
            service.as_ptr(), service.len(),
            operation.as_ptr(), operation.len(),
            request.as_ptr(), request.len(),
            retry.max_attempts,
            retry.initial_interval_ms,
            retry.backoff_x100,
            retry.max_interval_ms,
            non_retryable.as_ptr(), non_retryable.len(),
        )
    })
    .json()
}

/// A long call during which the host keeps the run's lease alive.
pub fn call_with_heartbeat(service: &str, operation: &str, request: &Value, heartbeat_ms: i64) -> Result<Value> {
    let request = request.to_string();
    Packed(unsafe { sys::durable_call_with_heartbeat(service.as_ptr(), service.len(), operation.as_ptr(), operation.len(), request.as_ptr(), request.len(), heartbeat_ms) })
        .json()
}

/// Fire and forget, delivered at least once.
pub fn send(service: &str, operation: &str, request: &Value) -> Result<()> {
    let request = request.to_string();
    Packed(unsafe { sys::durable_send(service.as_ptr(), service.len(), operation.as_ptr(), operation.len(), request.as_ptr(), request.len()) }).text().map(|_| ())
}

/// Call `service.operation` after `delay_ms`, even if the workflow has ended; the invocation id.
pub fn schedule_invoke(service: &str, operation: &str, request: &Value, delay_ms: i64) -> Result<String> {
    let request = request.to_string();
    Packed(unsafe { sys::durable_schedule_invoke(service.as_ptr(), service.len(), operation.as_ptr(), operation.len(), request.as_ptr(), request.len(), delay_ms) }).text()
}

/// The answer of [`fetch`].
#[derive(Clone, Debug)]
pub struct Response {
    pub status: i64,
    pub headers: Value,
    pub body: String,
}

/// An HTTP request through the host's allow-list (`DENIED` for a refused URL).
pub fn fetch(method: &str, url: &str, headers: &Value, body: &str) -> Result<Response> {
    let headers = if headers.is_null() { String::from("{}") } else { headers.to_string() };
    let data = Packed(unsafe { sys::fetch(method.as_ptr(), method.len(), url.as_ptr(), url.len(), headers.as_ptr(), headers.len(), body.as_ptr(), body.len()) }).json()?;
    Ok(Response {
        status: data["status"].as_i64().unwrap_or(0),
        headers: data["headers"].clone(),
        body: String::from(data["body"].as_str().unwrap_or("")),
    })
}

pub fn plugin_call(plugin: &str, function: &str, input: &Value) -> Result<Value> {
    let input = input.to_string();
    Packed(unsafe { sys::plugin_call(plugin.as_ptr(), plugin.len(), function.as_ptr(), function.len(), input.as_ptr(), input.len()) }).json()
}

/// A streaming plugin call: every chunk, each recorded as it arrived.
pub fn plugin_call_streaming(plugin: &str, function: &str, input: &Value) -> Result<Vec<Value>> {
    let input = input.to_string();
    match Packed(unsafe { sys::plugin_call_streaming(plugin.as_ptr(), plugin.len(), function.as_ptr(), function.len(), input.as_ptr(), input.len()) }).json()? {
        Value::Array(items) => Ok(items),
        other => Ok(alloc::vec![other]),
    }
}

// --- time, randomness, identity, logging ------------------------------------------------------

/// Virtual time, ms since the Unix epoch (replays see the same value).
pub fn now_ms() -> i64 {
    unsafe { sys::now() }
}

/// [`now_ms`] as ISO 8601 in UTC, as Python's `datetime.isoformat()` writes it:
/// `2026-01-01T07:00:00+00:00`, or `...07:00:00.250000+00:00` with milliseconds.
pub fn now_iso() -> String {
    iso8601(now_ms())
}

/// `ms` since the epoch as ISO 8601 in UTC (see [`now_iso`]).
pub fn iso8601(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    let mut out = String::new();
    let fields = [(year, 4, '-'), (month, 2, '-'), (day, 2, 'T'), (rem / 3600, 2, ':'), (rem % 3600 / 60, 2, ':'), (rem % 60, 2, ' ')];
    for (value, width, after) in fields {
        pad(&mut out, value, width);
        if after != ' ' {
            out.push(after);
        }
    }
    if millis != 0 {
        out.push('.');
        pad(&mut out, millis, 3);
        out.push_str("000");
    }
    out.push_str("+00:00");
    out
}

fn pad(out: &mut String, value: i64, width: usize) {
    let mut digits = String::new();
    json::write_int(&mut digits, value);
    for _ in digits.len()..width {
        out.push('0');
    }
    out.push_str(&digits);
}

/// A deterministic random value (the n-th call of a run is the same in every segment).
pub fn random() -> i64 {
    unsafe { sys::random() }
}

/// A UUID deterministic for (workflow, run, step, seed).
pub fn uuid(seed: &str) -> String {
    Packed(unsafe { sys::uuid(seed.as_ptr(), seed.len()) }).text().unwrap_or_default()
}

/// Record `value` on first execution; a replay returns the recorded value.
pub fn side_effect(value: &Value) -> Result<Value> {
    let value = value.to_string();
    Packed(unsafe { sys::side_effect(value.as_ptr(), value.len()) }).json()
}

pub fn workflow_id() -> String {
    Packed(unsafe { sys::workflow_id() }).text().unwrap_or_default()
}

pub fn run_id() -> String {
    Packed(unsafe { sys::run_id() }).text().unwrap_or_default()
}

/// The definition version of this run.
pub fn version() -> i64 {
    unsafe { sys::version() }
}

pub fn min_version() -> i64 {
    unsafe { sys::min_version() }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug = 0,
    Info = 1,
    Warn = 2,
    Error = 3,
}

/// Log `message` once (not again on replay).
pub fn log(level: Level, message: &str) {
    unsafe { sys::durable_log(level as i32, message.as_ptr(), message.len()) };
}

/// The host's JSON normalisation (`PERMANENT` for invalid JSON).
pub fn json_parse(input: &str) -> Result<String> {
    Packed(unsafe { sys::json_parse(input.as_ptr(), input.len()) }).text()
}

pub fn json_stringify(input: &str) -> Result<String> {
    Packed(unsafe { sys::json_stringify(input.as_ptr(), input.len()) }).text()
}

// --- timers, signals, promises, updates, queries ----------------------------------------------

/// A durable timer; `CANCELLED` when the run was cancelled while it slept.
pub fn sleep_ms(duration_ms: i64) -> Result<()> {
    match unsafe { sys::durable_sleep(duration_ms) } {
        0 => Ok(()),
        _ => Err(Error::new(Status::CANCELLED, "the workflow was cancelled while it slept")),
    }
}

/// A signal the workflow received.
#[derive(Clone, Debug)]
pub struct Signal {
    pub name: String,
    pub payload: Value,
    /// Set when the sender waits for an answer (`signal_and_wait`): pass it to
    /// [`reply_to_signal`]. Empty otherwise.
    pub correlation_id: String,
}

fn names_json(names: &[&str]) -> String {
    Value::Array(names.iter().map(|n| Value::from(*n)).collect()).to_string()
}

fn timeout_arg(timeout_ms: Option<i64>) -> i64 {
    timeout_ms.unwrap_or(-1)
}

/// The first signal named one of `names`; `TIMEOUT` or `CANCELLED` as errors.
pub fn await_signals(names: &[&str], timeout_ms: Option<i64>) -> Result<Signal> {
    let names = names_json(names);
    let data = Packed(unsafe { sys::durable_await_signals(names.as_ptr(), names.len(), timeout_arg(timeout_ms)) }).json()?;
    Ok(Signal {
        name: String::from(data["name"].as_str().unwrap_or("")),
        payload: data["payload"].clone(),
        correlation_id: String::from(data["correlation_id"].as_str().unwrap_or("")),
    })
}

/// The payload of signal `name` if one has arrived (never waits).
pub fn poll_signal(name: &str) -> Result<Option<Value>> {
    Packed(unsafe { sys::poll_signal(name.as_ptr(), name.len()) }).json_or_missing()
}

/// The reason if cancellation was requested.
pub fn poll_cancellation() -> Option<String> {
    let p = Packed(unsafe { sys::poll_cancellation() });
    if p.status() == Status::OK { Some(String::from(p.payload())) } else { None }
}

/// Signal another workflow (`NOT_FOUND`, `DENIED`).
pub fn signal(target_id: &str, name: &str, payload: &Value) -> Result<()> {
    let payload = payload.to_string();
    Packed(unsafe { sys::signal_workflow(target_id.as_ptr(), target_id.len(), name.as_ptr(), name.len(), payload.as_ptr(), payload.len()) }).text().map(|_| ())
}

/// Signal another workflow and wait for its reply (`TIMEOUT`).
pub fn signal_and_wait(target_id: &str, name: &str, payload: &Value, timeout_ms: Option<i64>) -> Result<Value> {
    let payload = payload.to_string();
    Packed(unsafe { sys::send_signal_and_wait(target_id.as_ptr(), target_id.len(), name.as_ptr(), name.len(), payload.as_ptr(), payload.len(), timeout_arg(timeout_ms)) })
        .json()
}

pub fn reply_to_signal(correlation_id: &str, response: &Value) -> Result<()> {
    let response = response.to_string();
    Packed(unsafe { sys::reply_to_signal(correlation_id.as_ptr(), correlation_id.len(), response.as_ptr(), response.len()) }).text().map(|_| ())
}

/// A new promise; its id.
pub fn create_promise(name: &str) -> Result<String> {
    Packed(unsafe { sys::create_promise(name.as_ptr(), name.len()) }).text()
}

/// The promise's value; `ERROR` with the rejection message, or `TIMEOUT`.
pub fn await_promise(promise_id: &str, timeout_ms: Option<i64>) -> Result<Value> {
    Packed(unsafe { sys::await_promise(promise_id.as_ptr(), promise_id.len(), timeout_arg(timeout_ms)) }).json()
}

pub fn resolve_promise(promise_id: &str, value: &Value) -> Result<()> {
    let value = value.to_string();
    Packed(unsafe { sys::resolve_promise(promise_id.as_ptr(), promise_id.len(), value.as_ptr(), value.len()) }).text().map(|_| ())
}

pub fn reject_promise(promise_id: &str, message: &str) -> Result<()> {
    Packed(unsafe { sys::reject_promise(promise_id.as_ptr(), promise_id.len(), message.as_ptr(), message.len()) }).text().map(|_| ())
}

/// Accept updates named `export_name`, handled by that export (see [`handler!`]).
pub fn register_update_handler(export_name: &str) {
    unsafe { sys::register_update_handler(export_name.as_ptr(), export_name.len()) };
}

/// Publish `value` under `key` for queries.
pub fn set_query(key: &str, value: &Value) {
    let value = value.to_string();
    unsafe { sys::set_query_state(key.as_ptr(), key.len(), value.as_ptr(), value.len()) };
}

// --- children, continue-as-new, detached runs, defers -----------------------------------------

/// Options of [`child_with_options`].
#[derive(Clone, Debug, Default)]
pub struct ChildOptions {
    /// ≤ 0: the default resolution.
    pub version: i64,
    pub priority: i64,
    /// `terminate` (default), `abandon` or `request_cancel`.
    pub parent_close_policy: String,
}

/// Start a child workflow; its run id.
pub fn child(name: &str, input: &Value) -> Result<String> {
    let input = input.to_string();
    Packed(unsafe { sys::child_workflow(name.as_ptr(), name.len(), input.as_ptr(), input.len()) }).text()
}

pub fn child_with_options(name: &str, input: &Value, options: &ChildOptions) -> Result<String> {
    let input = input.to_string();
    let policy = &options.parent_close_policy;
    Packed(unsafe {
        sys::child_workflow_with_options(name.as_ptr(), name.len(), input.as_ptr(), input.len(), options.version, options.priority, policy.as_ptr(), policy.len())
    })
    .text()
}

/// The child's result, or its failure as an [`Error`].
pub fn await_child(run_id: &str) -> Result<Value> {
    Packed(unsafe { sys::await_child(run_id.as_ptr(), run_id.len()) }).json()
}

/// How a child ended.
#[derive(Clone, Debug)]
pub struct ChildResult {
    pub run_id: String,
    pub status: Status,
    pub result: Value,
    pub error: String,
}

impl ChildResult {
    fn from_json(v: &Value) -> ChildResult {
        ChildResult {
            run_id: String::from(v["run_id"].as_str().unwrap_or("")),
            status: Status::from_label(v["status"].as_str().unwrap_or("error")),
            result: v["result"].clone(),
            error: String::from(v["error"].as_str().unwrap_or("")),
        }
    }
    /// The result, or the failure as an [`Error`].
    pub fn value(&self) -> Result<Value> {
        if self.status == Status::OK {
            Ok(self.result.clone())
        } else {
            Err(Error::new(self.status, self.error.clone()))
        }
    }
}

fn ids_json(run_ids: &[String]) -> String {
    Value::Array(run_ids.iter().map(Value::from).collect()).to_string()
}

/// Wait for every child; their outcomes in the given order.
pub fn await_all_children(run_ids: &[String]) -> Result<Vec<ChildResult>> {
    let ids = ids_json(run_ids);
    let data = Packed(unsafe { sys::await_all_children(ids.as_ptr(), ids.len()) }).json()?;
    Ok(data.as_array().map(|a| a.iter().map(ChildResult::from_json).collect()).unwrap_or_default())
}

/// The first of the children to finish.
pub fn await_any_child(run_ids: &[String]) -> Result<ChildResult> {
    let ids = ids_json(run_ids);
    Packed(unsafe { sys::await_any_child(ids.as_ptr(), ids.len()) }).json().map(|v| ChildResult::from_json(&v))
}

/// The child's outcome if it has finished (never waits).
pub fn poll_child(run_id: &str) -> Option<ChildResult> {
    let p = Packed(unsafe { sys::poll_child(run_id.as_ptr(), run_id.len()) });
    match p.status() {
        Status::NOT_FOUND => None,
        Status::OK => Some(ChildResult {
            run_id: String::from(run_id),
            status: Status::OK,
            result: loads(p.payload()),
            error: String::new(),
        }),
        status => Some(ChildResult {
            run_id: String::from(run_id),
            status,
            result: Value::Null,
            error: String::from(p.payload()),
        }),
    }
}

/// End this run and start a new one of the same definition with `input`. Never returns.
pub fn continue_as_new(input: &Value) -> ! {
    let input = input.to_string();
    unsafe { sys::continue_as_new(input.as_ptr(), input.len()) };
    core::arch::wasm32::unreachable()
}

pub fn continue_as_new_with_version(input: &Value, version: i64) -> ! {
    let input = input.to_string();
    unsafe { sys::continue_as_new_with_version(input.as_ptr(), input.len(), version) };
    core::arch::wasm32::unreachable()
}

/// Start an independent workflow (no parent link); its run id.
pub fn run_detached(name: &str, input: &Value) -> Result<String> {
    let input = input.to_string();
    Packed(unsafe { sys::run_detached(name.as_ptr(), name.len(), input.as_ptr(), input.len()) }).text()
}

/// Run export `export_name` when the workflow ends (last registered first); the defer id.
pub fn defer(export_name: &str) -> Result<String> {
    Packed(unsafe { sys::durable_defer(export_name.as_ptr(), export_name.len()) }).text()
}

// --- state, locks, scopes, schedules ----------------------------------------------------------

pub fn set_state(key: &str, value: &Value) {
    let value = value.to_string();
    unsafe { sys::set_state(key.as_ptr(), key.len(), value.as_ptr(), value.len()) };
}

/// The value under `key`, or `None`.
pub fn get_state(key: &str) -> Result<Option<Value>> {
    Packed(unsafe { sys::get_state(key.as_ptr(), key.len()) }).json_or_missing()
}

/// Delete `key`; whether it existed.
pub fn delete_state(key: &str) -> bool {
    unsafe { sys::delete_state(key.as_ptr(), key.len()) == 1 }
}

/// Add `delta` to the integer under `key` (0 when missing); the new value.
pub fn incr_state(key: &str, delta: i64) -> i64 {
    unsafe { sys::incr_state(key.as_ptr(), key.len(), delta) }
}

pub fn has_state(key: &str) -> bool {
    unsafe { sys::has_state(key.as_ptr(), key.len()) == 1 }
}

/// The keys starting with `prefix`, sorted.
pub fn list_state(prefix: &str) -> Result<Vec<String>> {
    let data = Packed(unsafe { sys::list_state(prefix.as_ptr(), prefix.len()) }).json()?;
    Ok(data
        .as_array()
        .map(|a| a.iter().filter_map(|k| k.as_str().map(String::from)).collect())
        .unwrap_or_default())
}

/// Address the state of virtual object `object_type/instance_key`; the previous scope.
pub fn set_scope(object_type: &str, instance_key: &str) -> Result<Value> {
    Packed(unsafe { sys::set_scope(object_type.as_ptr(), object_type.len(), instance_key.as_ptr(), instance_key.len()) }).json()
}

/// `{"object_type", "instance_key"}` of the current scope.
pub fn get_scope() -> Result<Value> {
    Packed(unsafe { sys::get_scope() }).json()
}

/// Whether the lock was taken (false: another workflow holds it).
pub fn acquire_lock(key: &str, ttl_ms: i64) -> bool {
    unsafe { sys::acquire_lock(key.as_ptr(), key.len(), ttl_ms) == 1 }
}

pub fn release_lock(key: &str) {
    unsafe { sys::release_lock(key.as_ptr(), key.len()) };
}

/// Start `workflow_name` on a cron schedule; the schedule id.
pub fn schedule_cron(workflow_name: &str, cron: &str, timezone: &str, input: &Value) -> Result<String> {
    let input = input.to_string();
    Packed(unsafe { sys::schedule_cron(workflow_name.as_ptr(), workflow_name.len(), cron.as_ptr(), cron.len(), timezone.as_ptr(), timezone.len(), input.as_ptr(), input.len()) }).text()
}

pub fn delete_cron(schedule_id: &str) -> Result<()> {
    Packed(unsafe { sys::delete_cron(schedule_id.as_ptr(), schedule_id.len()) }).text().map(|_| ())
}

/// This tenant's schedules (a JSON array).
pub fn list_crons() -> Result<Value> {
    Packed(unsafe { sys::list_crons() }).json()
}
