// cleat guest SDK for AssemblyScript: workflows as wasm32 core modules over ABI v1
// (docs/abi.md).
//
//   import * as cleat from "../../sdk/assemblyscript/assembly/index";
//   export { cleat_alloc, cleat_abi_version } from "../../sdk/assemblyscript/assembly/index";
//
//   function order(input: cleat.Value): cleat.Reply {
//     const reservation = cleat.call("inventory", "reserve", input);
//     if (!reservation.isOk()) return reservation; // fail with the same status
//     return cleat.ok(reservation.json());
//   }
//   export function run(ptr: usize, len: usize): i64 {
//     return cleat.entry(ptr, len, order);
//   }
//
// Build: manage.py build_workflow order.ts (asc --runtime stub: memory is never freed, as an
// instance lives for one segment only).
//
// Every host call is recorded on first execution and answered from the history on replay.
// Calls answering a packed buffer return a Reply: a status and the payload (the value's JSON,
// or the error message). Blocking calls may end the segment inside the call; nothing to
// handle. Strings cross the boundary as UTF-8.

import * as sys from "./sys";
import { Value, parse } from "./json";

export { Value, Kind, parse, quote } from "./json";

// ---- status codes (docs/abi.md §2; wire values, never change) ------------------------------

export const OK: u8 = 0;
export const ERROR: u8 = 1;
export const PERMANENT: u8 = 2;
export const AMBIGUOUS: u8 = 3;
export const TIMEOUT: u8 = 4;
export const CANCELLED: u8 = 5;
export const RETRIES_EXHAUSTED: u8 = 6;
export const NOT_FOUND: u8 = 7;
export const DENIED: u8 = 8;

const LABELS: string[] = [
  "ok", "error", "permanent", "ambiguous", "timeout", "cancelled", "retries_exhausted",
  "not_found", "denied",
];

/** The lower-case label of a status ("permanent"), as the host reports it. */
export function statusLabel(status: u8): string {
  return status < <u8>LABELS.length ? LABELS[status] : "error";
}

/** A host call's answer, or a workflow's own: a status and the payload text. */
export class Reply {
  constructor(public status: u8, public text: string) {}

  isOk(): bool {
    return this.status == OK;
  }
  /** Python's CallFailed: ERROR or RETRIES_EXHAUSTED. */
  isCallFailed(): bool {
    return this.status == ERROR || this.status == RETRIES_EXHAUSTED;
  }
  /** The payload as JSON (empty: null; text that is not JSON: a string value). */
  json(): Value {
    if (this.text.length == 0) return Value.null();
    const v = parse(this.text);
    return v === null ? Value.str(this.text) : v;
  }
}

export function ok(value: Value): Reply {
  return new Reply(OK, value.stringify());
}

export function fail(status: u8, message: string): Reply {
  return new Reply(status, message);
}

// ---- memory and the entry point ------------------------------------------------------------

/** The allocator the host calls to place the input and every reply. Re-export it (and
 * cleat_abi_version) from the workflow's entry file. */
export function cleat_alloc(size: usize): usize {
  return heap.alloc(size);
}

export function cleat_abi_version(): i32 {
  return 1;
}

function pack(reply: Reply): i64 {
  const payload = String.UTF8.encode(reply.text);
  const len = <usize>payload.byteLength + 1;
  const out = heap.alloc(len);
  store<u8>(out, reply.status);
  memory.copy(out + 1, changetype<usize>(payload), len - 1);
  return <i64>((<u64>out << 32) | <u64>len);
}

/** The body of an exported entry point (or defer or update handler):
 * `export function run(ptr: usize, len: usize): i64 { return cleat.entry(ptr, len, order); }` */
export function entry(ptr: usize, len: usize, f: (input: Value) => Reply): i64 {
  const text = String.UTF8.decodeUnsafe(ptr, len);
  let input = Value.null();
  if (text.length > 0) {
    const parsed = parse(text);
    input = parsed === null ? Value.str(text) : parsed;
  }
  return pack(f(input));
}

function unpack(packed: i64): Reply {
  const u = <u64>packed;
  const ptr = <usize>(u >> 32);
  const len = <usize>(u & 0xffffffff);
  if (len == 0) return new Reply(ERROR, "");
  return new Reply(load<u8>(ptr), String.UTF8.decodeUnsafe(ptr + 1, len - 1));
}

// UTF-8 bytes of a string; the buffer is never freed (stub runtime), so its pointer stays valid.
function u8s(s: string): ArrayBuffer {
  return String.UTF8.encode(s);
}
function p(b: ArrayBuffer): usize {
  return changetype<usize>(b);
}
function n(b: ArrayBuffer): usize {
  return <usize>b.byteLength;
}

// ---- calls to the outside world ------------------------------------------------------------

export function call(service: string, operation: string, request: Value): Reply {
  const a = u8s(service), b = u8s(operation), c = u8s(request.stringify());
  return unpack(sys.durable_call(p(a), n(a), p(b), n(b), p(c), n(c)));
}

/** The retry policy of callWithRetry (the Python SDK's defaults). */
export class Retry {
  maxAttempts: i64 = 3;
  initialIntervalMs: i64 = 1000;
  backoffX100: i64 = 200;
  maxIntervalMs: i64 = 60000;
  /** Substrings of error messages that stop the retries at once. */
  nonRetryable: string[] = [];

  static attempts(count: i64): Retry {
    const r = new Retry();
    r.maxAttempts = count;
    return r;
  }
}

/** Durable retries (the waits are durable timers): RETRIES_EXHAUSTED with the last error,
 * or PERMANENT at once. */
export function callWithRetry(service: string, operation: string, request: Value, retry: Retry): Reply {
  const a = u8s(service), b = u8s(operation), c = u8s(request.stringify());
  const d = u8s(Value.strings(retry.nonRetryable).stringify());
  return unpack(sys.durable_call_with_retry(p(a), n(a), p(b), n(b), p(c), n(c), retry.maxAttempts,
    retry.initialIntervalMs, retry.backoffX100, retry.maxIntervalMs, p(d), n(d)));
}

export function callWithHeartbeat(service: string, operation: string, request: Value, heartbeatMs: i64): Reply {
  const a = u8s(service), b = u8s(operation), c = u8s(request.stringify());
  return unpack(sys.durable_call_with_heartbeat(p(a), n(a), p(b), n(b), p(c), n(c), heartbeatMs));
}

/** Fire and forget, delivered at least once. */
export function send(service: string, operation: string, request: Value): Reply {
  const a = u8s(service), b = u8s(operation), c = u8s(request.stringify());
  return unpack(sys.durable_send(p(a), n(a), p(b), n(b), p(c), n(c)));
}

export function scheduleInvoke(service: string, operation: string, request: Value, delayMs: i64): Reply {
  const a = u8s(service), b = u8s(operation), c = u8s(request.stringify());
  return unpack(sys.durable_schedule_invoke(p(a), n(a), p(b), n(b), p(c), n(c), delayMs));
}

/** OK: {"status":int,"headers":{...},"body":"..."}; DENIED for a refused URL. */
export function fetch(method: string, url: string, headers: Value, body: string): Reply {
  const a = u8s(method), b = u8s(url), c = u8s(headers.isNull ? "{}" : headers.stringify()), d = u8s(body);
  return unpack(sys.fetch(p(a), n(a), p(b), n(b), p(c), n(c), p(d), n(d)));
}

export function pluginCall(plugin: string, fn: string, input: Value): Reply {
  const a = u8s(plugin), b = u8s(fn), c = u8s(input.stringify());
  return unpack(sys.plugin_call(p(a), n(a), p(b), n(b), p(c), n(c)));
}

export function pluginCallStreaming(plugin: string, fn: string, input: Value): Reply {
  const a = u8s(plugin), b = u8s(fn), c = u8s(input.stringify());
  return unpack(sys.plugin_call_streaming(p(a), n(a), p(b), n(b), p(c), n(c)));
}

// ---- time, randomness, identity, logging ---------------------------------------------------

export function nowMs(): i64 {
  return sys.now();
}

function pad(value: i64, width: i32): string {
  let s = value.toString();
  while (s.length < width) s = "0" + s;
  return s;
}

function floorDiv(a: i64, b: i64): i64 {
  const q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/** `ms` since the epoch as Python's datetime.isoformat() in UTC: 2026-01-01T07:00:00+00:00 */
export function iso8601(ms: i64): string {
  const secs = floorDiv(ms, 1000);
  const millis = ms - secs * 1000;
  const days = floorDiv(secs, 86400);
  const rem = secs - days * 86400;
  // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
  const z = days + 719468;
  const era = floorDiv(z, 146097);
  const doe = z - era * 146097;
  const yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const mp = (5 * doy + 2) / 153;
  const day = doy - (153 * mp + 2) / 5 + 1;
  const month = mp < 10 ? mp + 3 : mp - 9;
  const year = yoe + era * 400 + (month <= 2 ? 1 : 0);
  let out = pad(year, 4) + "-" + pad(month, 2) + "-" + pad(day, 2) + "T" + pad(rem / 3600, 2) +
    ":" + pad((rem % 3600) / 60, 2) + ":" + pad(rem % 60, 2);
  if (millis != 0) out += "." + pad(millis, 3) + "000";
  return out + "+00:00";
}

export function random(): i64 {
  return sys.random();
}

export function uuid(seed: string): string {
  const a = u8s(seed);
  return unpack(sys.uuid(p(a), n(a))).text;
}

/** Record `value` on first execution; a replay returns the recorded value. */
export function sideEffect(value: Value): Reply {
  const a = u8s(value.stringify());
  return unpack(sys.side_effect(p(a), n(a)));
}

export function workflowId(): string {
  return unpack(sys.workflow_id()).text;
}

export function runId(): string {
  return unpack(sys.run_id()).text;
}

export function version(): i64 {
  return sys.version();
}

export function minVersion(): i64 {
  return sys.min_version();
}

export const DEBUG: i32 = 0;
export const INFO: i32 = 1;
export const WARN: i32 = 2;
export const LOG_ERROR: i32 = 3;

/** Logged once, not again on replay. */
export function log(level: i32, message: string): void {
  const a = u8s(message);
  sys.durable_log(level, p(a), n(a));
}

export function jsonParse(input: string): Reply {
  const a = u8s(input);
  return unpack(sys.json_parse(p(a), n(a)));
}

export function jsonStringify(input: string): Reply {
  const a = u8s(input);
  return unpack(sys.json_stringify(p(a), n(a)));
}

// ---- timers, signals, promises, updates, queries -------------------------------------------

export const NO_TIMEOUT: i64 = -1;

/** A durable timer; false when the run was cancelled while it slept. */
export function sleepMs(durationMs: i64): bool {
  return sys.durable_sleep(durationMs) == 0;
}

/** OK: {"name":..,"payload":..} for the first of `names` to arrive; TIMEOUT; CANCELLED. */
export function awaitSignals(names: string[], timeoutMs: i64): Reply {
  const a = u8s(Value.strings(names).stringify());
  return unpack(sys.durable_await_signals(p(a), n(a), timeoutMs));
}

/** NOT_FOUND when no such signal has arrived. */
export function pollSignal(name: string): Reply {
  const a = u8s(name);
  return unpack(sys.poll_signal(p(a), n(a)));
}

/** OK with the reason if cancellation was requested, else NOT_FOUND. */
export function pollCancellation(): Reply {
  return unpack(sys.poll_cancellation());
}

export function signal(targetId: string, name: string, payload: Value): Reply {
  const a = u8s(targetId), b = u8s(name), c = u8s(payload.stringify());
  return unpack(sys.signal_workflow(p(a), n(a), p(b), n(b), p(c), n(c)));
}

export function signalAndWait(targetId: string, name: string, payload: Value, timeoutMs: i64): Reply {
  const a = u8s(targetId), b = u8s(name), c = u8s(payload.stringify());
  return unpack(sys.send_signal_and_wait(p(a), n(a), p(b), n(b), p(c), n(c), timeoutMs));
}

export function replyToSignal(correlationId: string, response: Value): Reply {
  const a = u8s(correlationId), b = u8s(response.stringify());
  return unpack(sys.reply_to_signal(p(a), n(a), p(b), n(b)));
}

export function createPromise(name: string): Reply {
  const a = u8s(name);
  return unpack(sys.create_promise(p(a), n(a)));
}

export function awaitPromise(promiseId: string, timeoutMs: i64): Reply {
  const a = u8s(promiseId);
  return unpack(sys.await_promise(p(a), n(a), timeoutMs));
}

export function resolvePromise(promiseId: string, value: Value): Reply {
  const a = u8s(promiseId), b = u8s(value.stringify());
  return unpack(sys.resolve_promise(p(a), n(a), p(b), n(b)));
}

export function rejectPromise(promiseId: string, message: string): Reply {
  const a = u8s(promiseId), b = u8s(message);
  return unpack(sys.reject_promise(p(a), n(a), p(b), n(b)));
}

export function registerUpdateHandler(exportName: string): void {
  const a = u8s(exportName);
  sys.register_update_handler(p(a), n(a));
}

/** Publish `value` under `key` for queries. */
export function setQuery(key: string, value: Value): void {
  const a = u8s(key), b = u8s(value.stringify());
  sys.set_query_state(p(a), n(a), p(b), n(b));
}

// ---- children, continue-as-new, detached runs, defers --------------------------------------

export function child(name: string, input: Value): Reply {
  const a = u8s(name), b = u8s(input.stringify());
  return unpack(sys.child_workflow(p(a), n(a), p(b), n(b)));
}

export function childWithOptions(name: string, input: Value, childVersion: i64, priority: i64, parentClosePolicy: string): Reply {
  const a = u8s(name), b = u8s(input.stringify()), c = u8s(parentClosePolicy);
  return unpack(sys.child_workflow_with_options(p(a), n(a), p(b), n(b), childVersion, priority, p(c), n(c)));
}

export function awaitChild(runId: string): Reply {
  const a = u8s(runId);
  return unpack(sys.await_child(p(a), n(a)));
}

export function awaitAllChildren(runIds: string[]): Reply {
  const a = u8s(Value.strings(runIds).stringify());
  return unpack(sys.await_all_children(p(a), n(a)));
}

export function awaitAnyChild(runIds: string[]): Reply {
  const a = u8s(Value.strings(runIds).stringify());
  return unpack(sys.await_any_child(p(a), n(a)));
}

/** NOT_FOUND while the child runs. */
export function pollChild(runId: string): Reply {
  const a = u8s(runId);
  return unpack(sys.poll_child(p(a), n(a)));
}

export function continueAsNew(input: Value): void {
  const a = u8s(input.stringify());
  sys.continue_as_new(p(a), n(a));
  unreachable();
}

export function continueAsNewWithVersion(input: Value, newVersion: i64): void {
  const a = u8s(input.stringify());
  sys.continue_as_new_with_version(p(a), n(a), newVersion);
  unreachable();
}

export function runDetached(name: string, input: Value): Reply {
  const a = u8s(name), b = u8s(input.stringify());
  return unpack(sys.run_detached(p(a), n(a), p(b), n(b)));
}

/** Run export `exportName` when the workflow ends (last registered first); the defer id. */
export function defer(exportName: string): Reply {
  const a = u8s(exportName);
  return unpack(sys.durable_defer(p(a), n(a)));
}

// ---- state, locks, scopes, schedules -------------------------------------------------------

export function setState(key: string, value: Value): void {
  const a = u8s(key), b = u8s(value.stringify());
  sys.set_state(p(a), n(a), p(b), n(b));
}

/** NOT_FOUND when there is no such key. */
export function getState(key: string): Reply {
  const a = u8s(key);
  return unpack(sys.get_state(p(a), n(a)));
}

export function deleteState(key: string): bool {
  const a = u8s(key);
  return sys.delete_state(p(a), n(a)) == 1;
}

export function incrState(key: string, delta: i64): i64 {
  const a = u8s(key);
  return sys.incr_state(p(a), n(a), delta);
}

export function hasState(key: string): bool {
  const a = u8s(key);
  return sys.has_state(p(a), n(a)) == 1;
}

export function listState(prefix: string): Reply {
  const a = u8s(prefix);
  return unpack(sys.list_state(p(a), n(a)));
}

export function setScope(objectType: string, instanceKey: string): Reply {
  const a = u8s(objectType), b = u8s(instanceKey);
  return unpack(sys.set_scope(p(a), n(a), p(b), n(b)));
}

export function getScope(): Reply {
  return unpack(sys.get_scope());
}

export function acquireLock(key: string, ttlMs: i64): bool {
  const a = u8s(key);
  return sys.acquire_lock(p(a), n(a), ttlMs) == 1;
}

export function releaseLock(key: string): void {
  const a = u8s(key);
  sys.release_lock(p(a), n(a));
}

export function scheduleCron(workflowName: string, cron: string, timezone: string, input: Value): Reply {
  const a = u8s(workflowName), b = u8s(cron), c = u8s(timezone), d = u8s(input.stringify());
  return unpack(sys.schedule_cron(p(a), n(a), p(b), n(b), p(c), n(c), p(d), n(d)));
}

export function deleteCron(scheduleId: string): Reply {
  const a = u8s(scheduleId);
  return unpack(sys.delete_cron(p(a), n(a)));
}

export function listCrons(): Reply {
  return unpack(sys.list_crons());
}
