//! cleat guest SDK for Zig: workflows as wasm32 core modules over ABI v1 (docs/abi.md).
//!
//!     const cleat = @import("cleat");
//!
//!     fn order(input: []const u8) cleat.Reply {
//!         const reservation = cleat.call("inventory", "reserve", input);
//!         if (!reservation.isOk()) return reservation; // fail with the same status
//!         return cleat.ok(reservation.value);
//!     }
//!     export fn run(ptr: [*]const u8, len: usize) i64 {
//!         return cleat.entry(ptr, len, order);
//!     }
//!
//! Build: manage.py build_workflow order.zig (zig build-exe -target wasm32-freestanding).
//!
//! Every host call is recorded on first execution and answered from the history on replay.
//! Calls answering a packed buffer return a `Reply`: a status and the payload (the value's
//! JSON, or the error message). Blocking calls may end the segment inside the call; nothing
//! to handle. Memory comes from a bump allocator (`cleat_alloc`) that never frees: an
//! instance lives for one segment only. The SDK depends on nothing but the language.

// --- status codes (docs/abi.md §2; wire values, never change) --------------------------------

pub const OK: u8 = 0;
pub const ERROR: u8 = 1;
pub const PERMANENT: u8 = 2;
pub const AMBIGUOUS: u8 = 3;
pub const TIMEOUT: u8 = 4;
pub const CANCELLED: u8 = 5;
pub const RETRIES_EXHAUSTED: u8 = 6;
pub const NOT_FOUND: u8 = 7;
pub const DENIED: u8 = 8;

const labels = [_][]const u8{
    "ok",        "error",     "permanent",         "ambiguous", "timeout",
    "cancelled", "retries_exhausted", "not_found", "denied",
};

/// The lower-case label of a status (`"permanent"`), as the host reports it.
pub fn statusLabel(status: u8) []const u8 {
    return if (status < labels.len) labels[status] else "error";
}

/// A host call's answer, or a workflow's own: a status and the payload.
pub const Reply = struct {
    status: u8,
    value: []const u8,

    pub fn isOk(self: Reply) bool {
        return self.status == OK;
    }
    /// Python's `CallFailed`: ERROR or RETRIES_EXHAUSTED.
    pub fn isCallFailed(self: Reply) bool {
        return self.status == ERROR or self.status == RETRIES_EXHAUSTED;
    }
};

pub fn ok(json_value: []const u8) Reply {
    return .{ .status = OK, .value = json_value };
}

pub fn fail(status: u8, message: []const u8) Reply {
    return .{ .status = status, .value = message };
}

// --- memory ------------------------------------------------------------------------------------

extern var __heap_base: u8;
var heap_next: usize = 0;

/// Bump allocation from the end of the module's data, growing memory when needed. The host
/// calls it to place the input and every reply; nothing is freed.
pub fn alloc(size: usize) [*]u8 {
    if (heap_next == 0) heap_next = @intFromPtr(&__heap_base);
    const start = (heap_next + 7) & ~@as(usize, 7);
    const end = start + size;
    const have = @wasmMemorySize(0) * 65536;
    if (end > have) {
        const pages = (end - have + 65535) / 65536;
        if (@wasmMemoryGrow(0, pages) < 0) @trap();
    }
    heap_next = end;
    return @ptrFromInt(start);
}

export fn cleat_alloc(size: usize) [*]u8 {
    return alloc(size);
}

export fn cleat_abi_version() i32 {
    return 1;
}

fn copy(dst: [*]u8, src: []const u8) void {
    for (src, 0..) |b, i| dst[i] = b;
}

pub fn eql(a: []const u8, b: []const u8) bool {
    if (a.len != b.len) return false;
    for (a, b) |x, y| if (x != y) return false;
    return true;
}

/// A growable byte buffer for JSON documents and messages.
pub const Buf = struct {
    ptr: [*]u8 = undefined,
    len: usize = 0,
    cap: usize = 0,

    fn reserve(self: *Buf, extra: usize) void {
        if (self.len + extra <= self.cap) return;
        var cap: usize = if (self.cap == 0) 64 else self.cap * 2;
        while (cap < self.len + extra) cap *= 2;
        const next = alloc(cap);
        if (self.len > 0) copy(next, self.ptr[0..self.len]);
        self.ptr = next;
        self.cap = cap;
    }
    pub fn bytes(self: *Buf, s: []const u8) void {
        self.reserve(s.len);
        copy(self.ptr + self.len, s);
        self.len += s.len;
    }
    pub fn char(self: *Buf, c: u8) void {
        self.bytes(&[_]u8{c});
    }
    pub fn int(self: *Buf, n: i64) void {
        var digits: [24]u8 = undefined;
        var i: usize = 0;
        var u: u64 = if (n < 0) @as(u64, 0) -% @as(u64, @bitCast(n)) else @intCast(n);
        while (true) {
            digits[i] = @intCast('0' + u % 10);
            i += 1;
            u /= 10;
            if (u == 0) break;
        }
        if (n < 0) self.char('-');
        while (i > 0) {
            i -= 1;
            self.char(digits[i]);
        }
    }
    pub fn slice(self: *const Buf) []const u8 {
        return if (self.len == 0) "" else self.ptr[0..self.len];
    }
};

// --- JSON --------------------------------------------------------------------------------------

/// JSON writing into a `Buf` (commas are inserted for you) and reading by views into a
/// document (no copies; a missing member is `null`).
pub const json = struct {
    fn sep(b: *Buf) void {
        if (b.len == 0) return;
        const last = b.ptr[b.len - 1];
        if (last != '{' and last != '[' and last != ':') b.char(',');
    }
    pub fn beginObject(b: *Buf) void {
        sep(b);
        b.char('{');
    }
    pub fn endObject(b: *Buf) void {
        b.char('}');
    }
    pub fn beginArray(b: *Buf) void {
        sep(b);
        b.char('[');
    }
    pub fn endArray(b: *Buf) void {
        b.char(']');
    }
    fn writeString(b: *Buf, s: []const u8) void {
        const hex = "0123456789abcdef";
        b.char('"');
        for (s) |c| switch (c) {
            '"' => b.bytes("\\\""),
            '\\' => b.bytes("\\\\"),
            '\n' => b.bytes("\\n"),
            '\r' => b.bytes("\\r"),
            '\t' => b.bytes("\\t"),
            8 => b.bytes("\\b"),
            12 => b.bytes("\\f"),
            else => if (c < 0x20) {
                b.bytes("\\u00");
                b.char(hex[c >> 4]);
                b.char(hex[c & 15]);
            } else b.char(c),
        };
        b.char('"');
    }
    pub fn key(b: *Buf, k: []const u8) void {
        sep(b);
        writeString(b, k);
        b.char(':');
    }
    pub fn string(b: *Buf, s: []const u8) void {
        sep(b);
        writeString(b, s);
    }
    pub fn int(b: *Buf, n: i64) void {
        sep(b);
        b.int(n);
    }
    pub fn boolean(b: *Buf, v: bool) void {
        sep(b);
        b.bytes(if (v) "true" else "false");
    }
    pub fn @"null"(b: *Buf) void {
        sep(b);
        b.bytes("null");
    }
    /// A value taken from another document, unchanged (`null` when missing).
    pub fn raw(b: *Buf, value: ?[]const u8) void {
        sep(b);
        b.bytes(if (value) |v| (if (v.len == 0) "null" else v) else "null");
    }
    /// A JSON string literal of `s`, as a new slice.
    pub fn quote(s: []const u8) []const u8 {
        var b = Buf{};
        writeString(&b, s);
        return b.slice();
    }

    fn ws(s: []const u8, start: usize) usize {
        var i = start;
        while (i < s.len and (s[i] == ' ' or s[i] == '\n' or s[i] == '\r' or s[i] == '\t')) i += 1;
        return i;
    }
    /// The end of the value starting at `start`, or null if malformed.
    fn skip(s: []const u8, start: usize, depth: u32) ?usize {
        var i = ws(s, start);
        if (i >= s.len or depth > 128) return null;
        const c = s[i];
        if (c == '"') {
            i += 1;
            while (i < s.len) : (i += 1) {
                if (s[i] == '\\') {
                    i += 1;
                } else if (s[i] == '"') return i + 1;
            }
            return null;
        }
        if (c == '{' or c == '[') {
            const close: u8 = if (c == '{') '}' else ']';
            i = ws(s, i + 1);
            if (i < s.len and s[i] == close) return i + 1;
            while (true) {
                if (c == '{') {
                    i = skip(s, i, depth + 1) orelse return null;
                    i = ws(s, i);
                    if (i >= s.len or s[i] != ':') return null;
                    i += 1;
                }
                i = skip(s, i, depth + 1) orelse return null;
                i = ws(s, i);
                if (i >= s.len) return null;
                if (s[i] == close) return i + 1;
                if (s[i] != ',') return null;
                i += 1;
            }
        }
        const begin = i;
        while (i < s.len and s[i] != ',' and s[i] != '}' and s[i] != ']' and s[i] != ' ' and
            s[i] != '\n' and s[i] != '\r' and s[i] != '\t') i += 1;
        return if (i > begin) i else null;
    }
    fn trim(s: []const u8) []const u8 {
        const i = ws(s, 0);
        var end = s.len;
        while (end > i and (s[end - 1] == ' ' or s[end - 1] == '\n' or s[end - 1] == '\r' or s[end - 1] == '\t')) end -= 1;
        return s[i..end];
    }
    /// The member `k` of an object (keys compared with their JSON text), or null.
    pub fn get(object: ?[]const u8, k: []const u8) ?[]const u8 {
        const s = trim(object orelse return null);
        if (s.len == 0 or s[0] != '{') return null;
        var i = ws(s, 1);
        while (i < s.len and s[i] == '"') {
            const key_end = skip(s, i, 0) orelse return null;
            const found = s[i + 1 .. key_end - 1];
            i = ws(s, key_end);
            if (i >= s.len or s[i] != ':') return null;
            const begin = ws(s, i + 1);
            const end = skip(s, begin, 0) orelse return null;
            if (eql(found, k)) return s[begin..end];
            i = ws(s, end);
            if (i < s.len and s[i] == ',') i = ws(s, i + 1);
        }
        return null;
    }
    /// The item `index` of an array, or null.
    pub fn at(array: ?[]const u8, index: usize) ?[]const u8 {
        const s = trim(array orelse return null);
        if (s.len == 0 or s[0] != '[') return null;
        var i = ws(s, 1);
        var n: usize = 0;
        while (i < s.len and s[i] != ']') : (n += 1) {
            const end = skip(s, i, 0) orelse return null;
            if (n == index) return s[i..end];
            i = ws(s, end);
            if (i < s.len and s[i] == ',') i = ws(s, i + 1);
        }
        return null;
    }
    pub fn isNull(value: ?[]const u8) bool {
        const v = trim(value orelse return true);
        return v.len == 0 or eql(v, "null");
    }
    pub fn asInt(value: ?[]const u8) ?i64 {
        const v = trim(value orelse return null);
        if (v.len == 0) return null;
        const negative = v[0] == '-';
        const digits = if (negative) v[1..] else v;
        if (digits.len == 0) return null;
        var n: i64 = 0;
        for (digits) |c| {
            if (c < '0' or c > '9') return null;
            n = n * 10 + (c - '0');
        }
        return if (negative) -n else n;
    }
    fn hex4(s: []const u8, i: usize) ?u21 {
        if (i + 4 > s.len) return null;
        var v: u21 = 0;
        for (s[i .. i + 4]) |c| {
            const d: u21 = switch (c) {
                '0'...'9' => c - '0',
                'a'...'f' => c - 'a' + 10,
                'A'...'F' => c - 'A' + 10,
                else => return null,
            };
            v = v * 16 + d;
        }
        return v;
    }
    fn utf8(b: *Buf, cp: u21) void {
        if (cp < 0x80) {
            b.char(@intCast(cp));
        } else if (cp < 0x800) {
            b.char(@intCast(0xC0 | (cp >> 6)));
            b.char(@intCast(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            b.char(@intCast(0xE0 | (cp >> 12)));
            b.char(@intCast(0x80 | ((cp >> 6) & 0x3F)));
            b.char(@intCast(0x80 | (cp & 0x3F)));
        } else {
            b.char(@intCast(0xF0 | (cp >> 18)));
            b.char(@intCast(0x80 | ((cp >> 12) & 0x3F)));
            b.char(@intCast(0x80 | ((cp >> 6) & 0x3F)));
            b.char(@intCast(0x80 | (cp & 0x3F)));
        }
    }
    /// The decoded text of a JSON string, or null.
    pub fn asString(value: ?[]const u8) ?[]const u8 {
        const v = trim(value orelse return null);
        if (v.len < 2 or v[0] != '"' or v[v.len - 1] != '"') return null;
        var b = Buf{};
        var i: usize = 1;
        while (i + 1 < v.len) : (i += 1) {
            const c = v[i];
            if (c != '\\') {
                b.char(c);
                continue;
            }
            i += 1;
            switch (v[i]) {
                'n' => b.char('\n'),
                'r' => b.char('\r'),
                't' => b.char('\t'),
                'b' => b.char(8),
                'f' => b.char(12),
                'u' => {
                    var cp = hex4(v, i + 1) orelse return null;
                    i += 4;
                    if (cp >= 0xD800 and cp < 0xDC00 and i + 2 < v.len and v[i + 1] == '\\' and v[i + 2] == 'u') {
                        if (hex4(v, i + 3)) |low| if (low >= 0xDC00 and low < 0xE000) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                            i += 6;
                        };
                    }
                    utf8(&b, cp);
                },
                else => |e| b.char(e),
            }
        }
        return b.slice();
    }
};

// --- entry points --------------------------------------------------------------------------------

/// Pack a reply into a buffer the host reads.
pub fn pack(reply: Reply) i64 {
    const len = reply.value.len + 1;
    const out = alloc(len);
    out[0] = reply.status;
    copy(out + 1, reply.value);
    return @bitCast((@as(u64, @intFromPtr(out)) << 32) | @as(u64, len));
}

/// The body of an exported entry point (or defer or update handler):
/// `export fn run(ptr: [*]const u8, len: usize) i64 { return cleat.entry(ptr, len, order); }`
pub fn entry(ptr: [*]const u8, len: usize, comptime f: fn ([]const u8) Reply) i64 {
    return pack(f(ptr[0..len]));
}

fn unpack(packed_buffer: i64) Reply {
    const u: u64 = @bitCast(packed_buffer);
    const len: usize = @intCast(u & 0xffff_ffff);
    if (len == 0) return .{ .status = ERROR, .value = "" };
    const ptr: [*]const u8 = @ptrFromInt(@as(usize, @intCast(u >> 32)));
    return .{ .status = ptr[0], .value = ptr[1..len] };
}

// --- calls to the outside world --------------------------------------------------------------------

pub fn call(service: []const u8, operation: []const u8, request: []const u8) Reply {
    return unpack(sys.durable_call(service.ptr, service.len, operation.ptr, operation.len, request.ptr, request.len));
}

/// The retry policy of `callWithRetry` (the Python SDK's defaults).
pub const Retry = struct {
    max_attempts: i64 = 3,
    initial_interval_ms: i64 = 1000,
    backoff_x100: i64 = 200,
    max_interval_ms: i64 = 60_000,
    /// A JSON array of substrings of error messages that stop the retries at once.
    non_retryable: []const u8 = "[]",
};

/// Durable retries (the waits between attempts are durable timers): RETRIES_EXHAUSTED with
/// the last error, or PERMANENT at once.
pub fn callWithRetry(service: []const u8, operation: []const u8, request: []const u8, r: Retry) Reply {
    return unpack(sys.durable_call_with_retry(service.ptr, service.len, operation.ptr, operation.len, request.ptr, request.len, r.max_attempts, r.initial_interval_ms, r.backoff_x100, r.max_interval_ms, r.non_retryable.ptr, r.non_retryable.len));
}

pub fn callWithHeartbeat(service: []const u8, operation: []const u8, request: []const u8, heartbeat_ms: i64) Reply {
    return unpack(sys.durable_call_with_heartbeat(service.ptr, service.len, operation.ptr, operation.len, request.ptr, request.len, heartbeat_ms));
}

/// Fire and forget, delivered at least once.
pub fn send(service: []const u8, operation: []const u8, request: []const u8) Reply {
    return unpack(sys.durable_send(service.ptr, service.len, operation.ptr, operation.len, request.ptr, request.len));
}

pub fn scheduleInvoke(service: []const u8, operation: []const u8, request: []const u8, delay_ms: i64) Reply {
    return unpack(sys.durable_schedule_invoke(service.ptr, service.len, operation.ptr, operation.len, request.ptr, request.len, delay_ms));
}

/// OK: `{"status":int,"headers":{...},"body":"..."}`; DENIED for a refused URL.
pub fn fetch(method: []const u8, url: []const u8, headers: []const u8, body: []const u8) Reply {
    const h = if (headers.len == 0) "{}" else headers;
    return unpack(sys.fetch(method.ptr, method.len, url.ptr, url.len, h.ptr, h.len, body.ptr, body.len));
}

pub fn pluginCall(plugin: []const u8, function: []const u8, input: []const u8) Reply {
    return unpack(sys.plugin_call(plugin.ptr, plugin.len, function.ptr, function.len, input.ptr, input.len));
}

pub fn pluginCallStreaming(plugin: []const u8, function: []const u8, input: []const u8) Reply {
    return unpack(sys.plugin_call_streaming(plugin.ptr, plugin.len, function.ptr, function.len, input.ptr, input.len));
}

// --- time, randomness, identity, logging -----------------------------------------------------------

pub fn nowMs() i64 {
    return sys.now();
}

fn pad(b: *Buf, value: i64, width: usize) void {
    var digits: [8]u8 = undefined;
    var n = value;
    var i = width;
    while (i > 0) {
        i -= 1;
        digits[i] = @intCast('0' + @as(u8, @intCast(@mod(n, 10))));
        n = @divFloor(n, 10);
    }
    b.bytes(digits[0..width]);
}

/// `ms` since the epoch as Python's `datetime.isoformat()` in UTC: `2026-01-01T07:00:00+00:00`.
pub fn iso8601(ms: i64) []const u8 {
    const secs = @divFloor(ms, 1000);
    const millis = @mod(ms, 1000);
    const days = @divFloor(secs, 86_400);
    const rem = @mod(secs, 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    const z = days + 719_468;
    const era = @divFloor(z, 146_097);
    const doe = z - era * 146_097;
    const yoe = @divTrunc(doe - @divTrunc(doe, 1460) + @divTrunc(doe, 36_524) - @divTrunc(doe, 146_096), 365);
    const doy = doe - (365 * yoe + @divTrunc(yoe, 4) - @divTrunc(yoe, 100));
    const mp = @divTrunc(5 * doy + 2, 153);
    const day = doy - @divTrunc(153 * mp + 2, 5) + 1;
    const month = if (mp < 10) mp + 3 else mp - 9;
    const year = yoe + era * 400 + @as(i64, if (month <= 2) 1 else 0);
    var b = Buf{};
    pad(&b, year, 4);
    b.char('-');
    pad(&b, month, 2);
    b.char('-');
    pad(&b, day, 2);
    b.char('T');
    pad(&b, @divTrunc(rem, 3600), 2);
    b.char(':');
    pad(&b, @divTrunc(@mod(rem, 3600), 60), 2);
    b.char(':');
    pad(&b, @mod(rem, 60), 2);
    if (millis != 0) {
        b.char('.');
        pad(&b, millis, 3);
        b.bytes("000");
    }
    b.bytes("+00:00");
    return b.slice();
}

pub fn random() i64 {
    return sys.random();
}

pub fn uuid(seed: []const u8) []const u8 {
    return unpack(sys.uuid(seed.ptr, seed.len)).value;
}

/// Record `value` (JSON) on first execution; a replay returns the recorded value.
pub fn sideEffect(value: []const u8) Reply {
    return unpack(sys.side_effect(value.ptr, value.len));
}

pub fn workflowId() []const u8 {
    return unpack(sys.workflow_id()).value;
}

pub fn runId() []const u8 {
    return unpack(sys.run_id()).value;
}

pub fn version() i64 {
    return sys.version();
}

pub fn minVersion() i64 {
    return sys.min_version();
}

pub const Level = enum(i32) { debug = 0, info = 1, warn = 2, err = 3 };

/// Logged once, not again on replay.
pub fn log(level: Level, message: []const u8) void {
    _ = sys.durable_log(@intFromEnum(level), message.ptr, message.len);
}

pub fn jsonParse(input: []const u8) Reply {
    return unpack(sys.json_parse(input.ptr, input.len));
}

pub fn jsonStringify(input: []const u8) Reply {
    return unpack(sys.json_stringify(input.ptr, input.len));
}

// --- timers, signals, promises, updates, queries ---------------------------------------------------

pub const NO_TIMEOUT: i64 = -1;

/// A durable timer; false when the run was cancelled while it slept.
pub fn sleepMs(duration_ms: i64) bool {
    return sys.durable_sleep(duration_ms) == 0;
}

/// `names`: a JSON array. OK: `{"name":..,"payload":..}`; TIMEOUT; CANCELLED.
pub fn awaitSignals(names: []const u8, timeout_ms: i64) Reply {
    return unpack(sys.durable_await_signals(names.ptr, names.len, timeout_ms));
}

/// NOT_FOUND when no such signal has arrived.
pub fn pollSignal(name: []const u8) Reply {
    return unpack(sys.poll_signal(name.ptr, name.len));
}

/// OK with the reason if cancellation was requested, else NOT_FOUND.
pub fn pollCancellation() Reply {
    return unpack(sys.poll_cancellation());
}

pub fn signal(target_id: []const u8, name: []const u8, payload: []const u8) Reply {
    return unpack(sys.signal_workflow(target_id.ptr, target_id.len, name.ptr, name.len, payload.ptr, payload.len));
}

pub fn signalAndWait(target_id: []const u8, name: []const u8, payload: []const u8, timeout_ms: i64) Reply {
    return unpack(sys.send_signal_and_wait(target_id.ptr, target_id.len, name.ptr, name.len, payload.ptr, payload.len, timeout_ms));
}

pub fn replyToSignal(correlation_id: []const u8, response: []const u8) Reply {
    return unpack(sys.reply_to_signal(correlation_id.ptr, correlation_id.len, response.ptr, response.len));
}

pub fn createPromise(name: []const u8) Reply {
    return unpack(sys.create_promise(name.ptr, name.len));
}

pub fn awaitPromise(promise_id: []const u8, timeout_ms: i64) Reply {
    return unpack(sys.await_promise(promise_id.ptr, promise_id.len, timeout_ms));
}

pub fn resolvePromise(promise_id: []const u8, value: []const u8) Reply {
    return unpack(sys.resolve_promise(promise_id.ptr, promise_id.len, value.ptr, value.len));
}

pub fn rejectPromise(promise_id: []const u8, message: []const u8) Reply {
    return unpack(sys.reject_promise(promise_id.ptr, promise_id.len, message.ptr, message.len));
}

pub fn registerUpdateHandler(export_name: []const u8) void {
    _ = sys.register_update_handler(export_name.ptr, export_name.len);
}

/// Publish `value` (JSON) under `key` for queries.
pub fn setQuery(key: []const u8, value: []const u8) void {
    _ = sys.set_query_state(key.ptr, key.len, value.ptr, value.len);
}

// --- children, continue-as-new, detached runs, defers ----------------------------------------------

pub fn child(name: []const u8, input: []const u8) Reply {
    return unpack(sys.child_workflow(name.ptr, name.len, input.ptr, input.len));
}

pub fn childWithOptions(name: []const u8, input: []const u8, child_version: i64, priority: i64, parent_close_policy: []const u8) Reply {
    return unpack(sys.child_workflow_with_options(name.ptr, name.len, input.ptr, input.len, child_version, priority, parent_close_policy.ptr, parent_close_policy.len));
}

pub fn awaitChild(run_id: []const u8) Reply {
    return unpack(sys.await_child(run_id.ptr, run_id.len));
}

pub fn awaitAllChildren(run_ids: []const u8) Reply {
    return unpack(sys.await_all_children(run_ids.ptr, run_ids.len));
}

pub fn awaitAnyChild(run_ids: []const u8) Reply {
    return unpack(sys.await_any_child(run_ids.ptr, run_ids.len));
}

/// NOT_FOUND while the child runs.
pub fn pollChild(run_id: []const u8) Reply {
    return unpack(sys.poll_child(run_id.ptr, run_id.len));
}

pub fn continueAsNew(input: []const u8) noreturn {
    _ = sys.continue_as_new(input.ptr, input.len);
    @trap();
}

pub fn continueAsNewWithVersion(input: []const u8, new_version: i64) noreturn {
    _ = sys.continue_as_new_with_version(input.ptr, input.len, new_version);
    @trap();
}

pub fn runDetached(name: []const u8, input: []const u8) Reply {
    return unpack(sys.run_detached(name.ptr, name.len, input.ptr, input.len));
}

pub fn defer_(export_name: []const u8) Reply {
    return unpack(sys.durable_defer(export_name.ptr, export_name.len));
}

// --- state, locks, scopes, schedules ---------------------------------------------------------------

pub fn setState(key: []const u8, value: []const u8) void {
    _ = sys.set_state(key.ptr, key.len, value.ptr, value.len);
}

/// NOT_FOUND when there is no such key.
pub fn getState(key: []const u8) Reply {
    return unpack(sys.get_state(key.ptr, key.len));
}

pub fn deleteState(key: []const u8) bool {
    return sys.delete_state(key.ptr, key.len) == 1;
}

pub fn incrState(key: []const u8, delta: i64) i64 {
    return sys.incr_state(key.ptr, key.len, delta);
}

pub fn hasState(key: []const u8) bool {
    return sys.has_state(key.ptr, key.len) == 1;
}

pub fn listState(prefix: []const u8) Reply {
    return unpack(sys.list_state(prefix.ptr, prefix.len));
}

pub fn setScope(object_type: []const u8, instance_key: []const u8) Reply {
    return unpack(sys.set_scope(object_type.ptr, object_type.len, instance_key.ptr, instance_key.len));
}

pub fn getScope() Reply {
    return unpack(sys.get_scope());
}

pub fn acquireLock(key: []const u8, ttl_ms: i64) bool {
    return sys.acquire_lock(key.ptr, key.len, ttl_ms) == 1;
}

pub fn releaseLock(key: []const u8) void {
    _ = sys.release_lock(key.ptr, key.len);
}

pub fn scheduleCron(workflow_name: []const u8, cron: []const u8, timezone: []const u8, input: []const u8) Reply {
    return unpack(sys.schedule_cron(workflow_name.ptr, workflow_name.len, cron.ptr, cron.len, timezone.ptr, timezone.len, input.ptr, input.len));
}

pub fn deleteCron(schedule_id: []const u8) Reply {
    return unpack(sys.delete_cron(schedule_id.ptr, schedule_id.len));
}

pub fn listCrons() Reply {
    return unpack(sys.list_crons());
}

/// The raw imports of module `"env"` (prefer the wrappers above).
pub const sys = struct {
    // BEGIN GENERATED IMPORTS (sdk/guest_imports.py)
    /// packed buffer
    pub extern "env" fn durable_call(service_ptr: [*]const u8, service_len: usize, operation_ptr: [*]const u8, operation_len: usize, request_ptr: [*]const u8, request_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn durable_call_with_retry(service_ptr: [*]const u8, service_len: usize, operation_ptr: [*]const u8, operation_len: usize, request_ptr: [*]const u8, request_len: usize, max_attempts: i64, initial_interval_ms: i64, backoff_coefficient_x100: i64, max_interval_ms: i64, non_retryable_errors_ptr: [*]const u8, non_retryable_errors_len: usize) i64;
    /// packed buffer
    pub extern "env" fn durable_call_with_heartbeat(service_ptr: [*]const u8, service_len: usize, operation_ptr: [*]const u8, operation_len: usize, request_ptr: [*]const u8, request_len: usize, heartbeat_interval_ms: i64) i64;
    /// packed buffer
    pub extern "env" fn durable_send(service_ptr: [*]const u8, service_len: usize, operation_ptr: [*]const u8, operation_len: usize, request_ptr: [*]const u8, request_len: usize) i64;
    /// packed buffer
    pub extern "env" fn durable_schedule_invoke(service_ptr: [*]const u8, service_len: usize, operation_ptr: [*]const u8, operation_len: usize, request_ptr: [*]const u8, request_len: usize, delay_ms: i64) i64;
    /// packed buffer
    pub extern "env" fn fetch(method_ptr: [*]const u8, method_len: usize, url_ptr: [*]const u8, url_len: usize, headers_ptr: [*]const u8, headers_len: usize, body_ptr: [*]const u8, body_len: usize) i64;
    /// packed buffer
    pub extern "env" fn plugin_call(plugin_ptr: [*]const u8, plugin_len: usize, function_ptr: [*]const u8, function_len: usize, input_ptr: [*]const u8, input_len: usize) i64;
    /// packed buffer
    pub extern "env" fn plugin_call_streaming(plugin_ptr: [*]const u8, plugin_len: usize, function_ptr: [*]const u8, function_len: usize, input_ptr: [*]const u8, input_len: usize) i64;
    /// scalar
    pub extern "env" fn now() i64;
    /// scalar
    pub extern "env" fn random() i64;
    /// packed buffer
    pub extern "env" fn uuid(seed_ptr: [*]const u8, seed_len: usize) i64;
    /// packed buffer
    pub extern "env" fn side_effect(value_ptr: [*]const u8, value_len: usize) i64;
    /// packed buffer
    pub extern "env" fn workflow_id() i64;
    /// packed buffer
    pub extern "env" fn run_id() i64;
    /// scalar
    pub extern "env" fn version() i64;
    /// scalar
    pub extern "env" fn min_version() i64;
    /// scalar
    pub extern "env" fn durable_log(level: i32, message_ptr: [*]const u8, message_len: usize) i64;
    /// packed buffer
    pub extern "env" fn json_parse(input_ptr: [*]const u8, input_len: usize) i64;
    /// packed buffer
    pub extern "env" fn json_stringify(input_ptr: [*]const u8, input_len: usize) i64;
    /// scalar, blocking
    pub extern "env" fn durable_sleep(duration_ms: i64) i64;
    /// packed buffer, blocking
    pub extern "env" fn durable_await_signals(names_ptr: [*]const u8, names_len: usize, timeout_ms: i64) i64;
    /// packed buffer
    pub extern "env" fn poll_signal(name_ptr: [*]const u8, name_len: usize) i64;
    /// packed buffer
    pub extern "env" fn poll_cancellation() i64;
    /// packed buffer
    pub extern "env" fn signal_workflow(target_id_ptr: [*]const u8, target_id_len: usize, name_ptr: [*]const u8, name_len: usize, payload_ptr: [*]const u8, payload_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn send_signal_and_wait(target_id_ptr: [*]const u8, target_id_len: usize, name_ptr: [*]const u8, name_len: usize, payload_ptr: [*]const u8, payload_len: usize, timeout_ms: i64) i64;
    /// packed buffer
    pub extern "env" fn reply_to_signal(correlation_id_ptr: [*]const u8, correlation_id_len: usize, response_ptr: [*]const u8, response_len: usize) i64;
    /// packed buffer
    pub extern "env" fn create_promise(name_ptr: [*]const u8, name_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn await_promise(promise_id_ptr: [*]const u8, promise_id_len: usize, timeout_ms: i64) i64;
    /// packed buffer
    pub extern "env" fn resolve_promise(promise_id_ptr: [*]const u8, promise_id_len: usize, value_ptr: [*]const u8, value_len: usize) i64;
    /// packed buffer
    pub extern "env" fn reject_promise(promise_id_ptr: [*]const u8, promise_id_len: usize, message_ptr: [*]const u8, message_len: usize) i64;
    /// scalar
    pub extern "env" fn register_update_handler(export_name_ptr: [*]const u8, export_name_len: usize) i64;
    /// scalar
    pub extern "env" fn set_query_state(key_ptr: [*]const u8, key_len: usize, value_ptr: [*]const u8, value_len: usize) i64;
    /// packed buffer
    pub extern "env" fn child_workflow(name_ptr: [*]const u8, name_len: usize, input_ptr: [*]const u8, input_len: usize) i64;
    /// packed buffer
    pub extern "env" fn child_workflow_with_options(name_ptr: [*]const u8, name_len: usize, input_ptr: [*]const u8, input_len: usize, version: i64, priority: i64, parent_close_policy_ptr: [*]const u8, parent_close_policy_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn await_child(run_id_ptr: [*]const u8, run_id_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn await_all_children(run_ids_ptr: [*]const u8, run_ids_len: usize) i64;
    /// packed buffer, blocking
    pub extern "env" fn await_any_child(run_ids_ptr: [*]const u8, run_ids_len: usize) i64;
    /// packed buffer
    pub extern "env" fn poll_child(run_id_ptr: [*]const u8, run_id_len: usize) i64;
    /// scalar
    pub extern "env" fn continue_as_new(input_ptr: [*]const u8, input_len: usize) i64;
    /// scalar
    pub extern "env" fn continue_as_new_with_version(input_ptr: [*]const u8, input_len: usize, version: i64) i64;
    /// packed buffer
    pub extern "env" fn run_detached(name_ptr: [*]const u8, name_len: usize, input_ptr: [*]const u8, input_len: usize) i64;
    /// packed buffer
    pub extern "env" fn durable_defer(export_name_ptr: [*]const u8, export_name_len: usize) i64;
    /// scalar
    pub extern "env" fn set_state(key_ptr: [*]const u8, key_len: usize, value_ptr: [*]const u8, value_len: usize) i64;
    /// packed buffer
    pub extern "env" fn get_state(key_ptr: [*]const u8, key_len: usize) i64;
    /// scalar
    pub extern "env" fn delete_state(key_ptr: [*]const u8, key_len: usize) i64;
    /// scalar
    pub extern "env" fn incr_state(key_ptr: [*]const u8, key_len: usize, delta: i64) i64;
    /// scalar
    pub extern "env" fn has_state(key_ptr: [*]const u8, key_len: usize) i64;
    /// packed buffer
    pub extern "env" fn list_state(prefix_ptr: [*]const u8, prefix_len: usize) i64;
    /// packed buffer
    pub extern "env" fn set_scope(object_type_ptr: [*]const u8, object_type_len: usize, instance_key_ptr: [*]const u8, instance_key_len: usize) i64;
    /// packed buffer
    pub extern "env" fn get_scope() i64;
    /// scalar
    pub extern "env" fn acquire_lock(key_ptr: [*]const u8, key_len: usize, ttl_ms: i64) i64;
    /// scalar
    pub extern "env" fn release_lock(key_ptr: [*]const u8, key_len: usize) i64;
    /// packed buffer
    pub extern "env" fn schedule_cron(workflow_name_ptr: [*]const u8, workflow_name_len: usize, cron_expr_ptr: [*]const u8, cron_expr_len: usize, timezone_ptr: [*]const u8, timezone_len: usize, input_ptr: [*]const u8, input_len: usize) i64;
    /// packed buffer
    pub extern "env" fn delete_cron(schedule_id_ptr: [*]const u8, schedule_id_len: usize) i64;
    /// packed buffer
    pub extern "env" fn list_crons() i64;
    // END GENERATED IMPORTS
};
