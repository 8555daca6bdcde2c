/* cleat guest SDK for C: the allocator, strings, JSON, and the typed host calls (cleat.h). */
#include "cleat.h"

/* ---- memory -------------------------------------------------------------------------------- */

extern unsigned char __heap_base;
static uintptr_t heap_next;

/* Bump allocation from the end of the module's data, growing memory when needed. The host
 * calls it to place the input and every reply; nothing is freed (one segment per instance). */
__attribute__((export_name("cleat_alloc"))) void *cleat_alloc(size_t size) {
    if (heap_next == 0) heap_next = (uintptr_t)&__heap_base;
    uintptr_t start = (heap_next + 7) & ~(uintptr_t)7;
    uintptr_t end = start + size;
    uintptr_t have = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    if (end > have) {
        size_t pages = (end - have + 65535u) / 65536u;
        if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1) __builtin_trap();
    }
    heap_next = end;
    return (void *)start;
}

__attribute__((export_name("cleat_abi_version"))) int32_t cleat_abi_version(void) { return 1; }

void *cleat_memcpy(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    while (n--) *d++ = *s++;
    return dst;
}

cleat_str cleat_cstr(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return (cleat_str){s, n};
}

bool cleat_str_eq(cleat_str a, cleat_str b) {
    if (a.len != b.len) return false;
    for (size_t i = 0; i < a.len; i++)
        if (a.ptr[i] != b.ptr[i]) return false;
    return true;
}

static const char *const LABELS[] = {"ok",      "error",     "permanent",
                                     "ambiguous", "timeout", "cancelled",
                                     "retries_exhausted", "not_found", "denied"};

cleat_str cleat_status_label(uint8_t status) {
    return cleat_cstr(status < 9 ? LABELS[status] : "error");
}

/* ---- buffers ------------------------------------------------------------------------------- */

cleat_buf cleat_buf_new(void) { return (cleat_buf){0, 0, 0}; }

static void reserve(cleat_buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->len + extra) cap *= 2;
    char *next = cleat_alloc(cap);
    if (b->len) cleat_memcpy(next, b->ptr, b->len);
    b->ptr = next;
    b->cap = cap;
}

void cleat_buf_bytes(cleat_buf *b, const char *p, size_t n) {
    reserve(b, n);
    cleat_memcpy(b->ptr + b->len, p, n);
    b->len += n;
}
void cleat_buf_str(cleat_buf *b, cleat_str s) { cleat_buf_bytes(b, s.ptr, s.len); }
void cleat_buf_cstr(cleat_buf *b, const char *s) { cleat_buf_str(b, cleat_cstr(s)); }
void cleat_buf_char(cleat_buf *b, char c) { cleat_buf_bytes(b, &c, 1); }

void cleat_buf_int(cleat_buf *b, int64_t n) {
    char digits[24];
    int i = 0;
    uint64_t u = n < 0 ? (uint64_t)0 - (uint64_t)n : (uint64_t)n;
    do {
        digits[i++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (n < 0) cleat_buf_char(b, '-');
    while (i) cleat_buf_char(b, digits[--i]);
}

cleat_str cleat_buf_view(const cleat_buf *b) { return (cleat_str){b->ptr, b->len}; }

/* ---- JSON writing -------------------------------------------------------------------------- */

static void sep(cleat_buf *b) {
    if (b->len == 0) return;
    char last = b->ptr[b->len - 1];
    if (last != '{' && last != '[' && last != ':') cleat_buf_char(b, ',');
}

void cleat_json_begin_object(cleat_buf *b) { sep(b); cleat_buf_char(b, '{'); }
void cleat_json_end_object(cleat_buf *b) { cleat_buf_char(b, '}'); }
void cleat_json_begin_array(cleat_buf *b) { sep(b); cleat_buf_char(b, '['); }
void cleat_json_end_array(cleat_buf *b) { cleat_buf_char(b, ']'); }

static void write_string(cleat_buf *b, cleat_str s) {
    static const char hex[] = "0123456789abcdef";
    cleat_buf_char(b, '"');
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        switch (c) {
        case '"': cleat_buf_cstr(b, "\\\""); break;
        case '\\': cleat_buf_cstr(b, "\\\\"); break;
        case '\n': cleat_buf_cstr(b, "\\n"); break;
        case '\r': cleat_buf_cstr(b, "\\r"); break;
        case '\t': cleat_buf_cstr(b, "\\t"); break;
        case '\b': cleat_buf_cstr(b, "\\b"); break;
        case '\f': cleat_buf_cstr(b, "\\f"); break;
        default:
            if (c < 0x20) {
                cleat_buf_cstr(b, "\\u00");
                cleat_buf_char(b, hex[c >> 4]);
                cleat_buf_char(b, hex[c & 15]);
            } else {
                cleat_buf_char(b, (char)c);
            }
        }
    }
    cleat_buf_char(b, '"');
}

void cleat_json_key(cleat_buf *b, const char *key) {
    sep(b);
    write_string(b, cleat_cstr(key));
    cleat_buf_char(b, ':');
}
void cleat_json_string(cleat_buf *b, cleat_str s) { sep(b); write_string(b, s); }
void cleat_json_int(cleat_buf *b, int64_t n) { sep(b); cleat_buf_int(b, n); }
void cleat_json_bool(cleat_buf *b, bool v) { sep(b); cleat_buf_cstr(b, v ? "true" : "false"); }
void cleat_json_null(cleat_buf *b) { sep(b); cleat_buf_cstr(b, "null"); }
void cleat_json_raw(cleat_buf *b, cleat_str json) {
    sep(b);
    if (json.ptr == 0 || json.len == 0) cleat_buf_cstr(b, "null");
    else cleat_buf_str(b, json);
}

/* ---- JSON reading -------------------------------------------------------------------------- */

static size_t skip_ws(cleat_str s, size_t i) {
    while (i < s.len && (s.ptr[i] == ' ' || s.ptr[i] == '\n' || s.ptr[i] == '\r' || s.ptr[i] == '\t'))
        i++;
    return i;
}

/* The end of the value starting at i (after white space), or (size_t)-1 if malformed. */
static size_t skip_value(cleat_str s, size_t i, int depth) {
    i = skip_ws(s, i);
    if (i >= s.len || depth > 128) return (size_t)-1;
    char c = s.ptr[i];
    if (c == '"') {
        for (i++; i < s.len; i++) {
            if (s.ptr[i] == '\\') i++;
            else if (s.ptr[i] == '"') return i + 1;
        }
        return (size_t)-1;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, i + 1);
        if (i < s.len && s.ptr[i] == close) return i + 1;
        for (;;) {
            if (c == '{') {
                i = skip_value(s, i, depth + 1); /* the key */
                if (i == (size_t)-1) return i;
                i = skip_ws(s, i);
                if (i >= s.len || s.ptr[i] != ':') return (size_t)-1;
                i++;
            }
            i = skip_value(s, i, depth + 1);
            if (i == (size_t)-1) return i;
            i = skip_ws(s, i);
            if (i >= s.len) return (size_t)-1;
            if (s.ptr[i] == close) return i + 1;
            if (s.ptr[i] != ',') return (size_t)-1;
            i++;
        }
    }
    size_t start = i;
    while (i < s.len && s.ptr[i] != ',' && s.ptr[i] != '}' && s.ptr[i] != ']' && s.ptr[i] != ' ' &&
           s.ptr[i] != '\n' && s.ptr[i] != '\r' && s.ptr[i] != '\t')
        i++;
    return i > start ? i : (size_t)-1;
}

static cleat_str trimmed(cleat_str s) {
    size_t i = skip_ws(s, 0);
    size_t end = s.len;
    while (end > i && (s.ptr[end - 1] == ' ' || s.ptr[end - 1] == '\n' || s.ptr[end - 1] == '\r' ||
                       s.ptr[end - 1] == '\t'))
        end--;
    return (cleat_str){s.ptr + i, end - i};
}

bool cleat_json_valid(cleat_str value) {
    value = trimmed(value);
    return value.len > 0 && skip_value(value, 0, 0) == value.len;
}

cleat_str cleat_json_get(cleat_str object, const char *key) {
    cleat_str k = cleat_cstr(key);
    object = trimmed(object);
    if (object.len == 0 || object.ptr[0] != '{') return CLEAT_NULL_STR;
    size_t i = skip_ws(object, 1);
    while (i < object.len && object.ptr[i] == '"') {
        size_t key_end = skip_value(object, i, 0);
        if (key_end == (size_t)-1) return CLEAT_NULL_STR;
        cleat_str found = {object.ptr + i + 1, key_end - i - 2};
        i = skip_ws(object, key_end);
        if (i >= object.len || object.ptr[i] != ':') return CLEAT_NULL_STR;
        size_t start = skip_ws(object, i + 1);
        size_t end = skip_value(object, start, 0);
        if (end == (size_t)-1) return CLEAT_NULL_STR;
        if (cleat_str_eq(found, k)) return (cleat_str){object.ptr + start, end - start};
        i = skip_ws(object, end);
        if (i < object.len && object.ptr[i] == ',') i = skip_ws(object, i + 1);
    }
    return CLEAT_NULL_STR;
}

cleat_str cleat_json_at(cleat_str array, size_t index) {
    array = trimmed(array);
    if (array.len == 0 || array.ptr[0] != '[') return CLEAT_NULL_STR;
    size_t i = skip_ws(array, 1);
    for (size_t n = 0; i < array.len && array.ptr[i] != ']'; n++) {
        size_t end = skip_value(array, i, 0);
        if (end == (size_t)-1) return CLEAT_NULL_STR;
        if (n == index) return (cleat_str){array.ptr + i, end - i};
        i = skip_ws(array, end);
        if (i < array.len && array.ptr[i] == ',') i = skip_ws(array, i + 1);
    }
    return CLEAT_NULL_STR;
}

size_t cleat_json_length(cleat_str array) {
    size_t n = 0;
    while (cleat_json_at(array, n).ptr) n++;
    return n;
}

bool cleat_json_is_null(cleat_str value) {
    value = trimmed(value);
    return value.ptr == 0 || value.len == 0 || cleat_str_eq(value, CLEAT_S("null"));
}

bool cleat_json_as_int(cleat_str value, int64_t *out) {
    value = trimmed(value);
    size_t i = 0;
    bool negative = value.len > 0 && value.ptr[0] == '-';
    if (negative) i++;
    if (i >= value.len) return false;
    int64_t n = 0;
    for (; i < value.len; i++) {
        char c = value.ptr[i];
        if (c < '0' || c > '9') return false;
        n = n * 10 + (c - '0');
    }
    *out = negative ? -n : n;
    return true;
}

bool cleat_json_as_bool(cleat_str value, bool *out) {
    value = trimmed(value);
    if (cleat_str_eq(value, CLEAT_S("true"))) *out = true;
    else if (cleat_str_eq(value, CLEAT_S("false"))) *out = false;
    else return false;
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(cleat_buf *b, uint32_t cp) {
    if (cp < 0x80) {
        cleat_buf_char(b, (char)cp);
    } else if (cp < 0x800) {
        cleat_buf_char(b, (char)(0xC0 | (cp >> 6)));
        cleat_buf_char(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        cleat_buf_char(b, (char)(0xE0 | (cp >> 12)));
        cleat_buf_char(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        cleat_buf_char(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        cleat_buf_char(b, (char)(0xF0 | (cp >> 18)));
        cleat_buf_char(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        cleat_buf_char(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        cleat_buf_char(b, (char)(0x80 | (cp & 0x3F)));
    }
}

static int32_t hex4(cleat_str s, size_t i) {
    if (i + 4 > s.len) return -1;
    int32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int h = hexval(s.ptr[i + k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

cleat_str cleat_json_as_string(cleat_str value) {
    value = trimmed(value);
    if (value.len < 2 || value.ptr[0] != '"' || value.ptr[value.len - 1] != '"')
        return CLEAT_NULL_STR;
    cleat_buf b = cleat_buf_new();
    reserve(&b, value.len);
    for (size_t i = 1; i + 1 < value.len; i++) {
        char c = value.ptr[i];
        if (c != '\\') {
            cleat_buf_char(&b, c);
            continue;
        }
        c = value.ptr[++i];
        switch (c) {
        case 'n': cleat_buf_char(&b, '\n'); break;
        case 'r': cleat_buf_char(&b, '\r'); break;
        case 't': cleat_buf_char(&b, '\t'); break;
        case 'b': cleat_buf_char(&b, '\b'); break;
        case 'f': cleat_buf_char(&b, '\f'); break;
        case 'u': {
            int32_t cp = hex4(value, i + 1);
            if (cp < 0) return CLEAT_NULL_STR;
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 2 < value.len && value.ptr[i + 1] == '\\' &&
                value.ptr[i + 2] == 'u') {
                int32_t low = hex4(value, i + 3);
                if (low >= 0xDC00 && low < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    i += 6;
                }
            }
            put_utf8(&b, (uint32_t)cp);
            break;
        }
        default: cleat_buf_char(&b, c); /* \" \\ \/ */
        }
    }
    return cleat_buf_view(&b);
}

/* ---- packed buffers and entry points -------------------------------------------------------- */

static cleat_reply unpack(int64_t packed) {
    uint64_t u = (uint64_t)packed;
    const char *ptr = (const char *)(uintptr_t)(u >> 32);
    size_t len = (size_t)(u & 0xffffffffu);
    if (len == 0) return (cleat_reply){CLEAT_ERROR, CLEAT_NULL_STR};
    return (cleat_reply){(uint8_t)ptr[0], {ptr + 1, len - 1}};
}

cleat_reply cleat_ok(cleat_str json) { return (cleat_reply){CLEAT_OK, json}; }
cleat_reply cleat_fail(uint8_t status, cleat_str message) {
    return (cleat_reply){status, message};
}

int64_t cleat_pack(cleat_reply reply) {
    size_t len = reply.value.len + 1;
    char *out = cleat_alloc(len);
    out[0] = (char)reply.status;
    if (reply.value.len) cleat_memcpy(out + 1, reply.value.ptr, reply.value.len);
    return (int64_t)(((uint64_t)(uintptr_t)out << 32) | (uint64_t)len);
}

/* ---- typed host calls ------------------------------------------------------------------------ */

#define S(x) (x).ptr, (x).len

cleat_reply cleat_call(cleat_str service, cleat_str operation, cleat_str request) {
    return unpack(cleat_sys_durable_call(S(service), S(operation), S(request)));
}

cleat_reply cleat_call_with_retry(cleat_str service, cleat_str operation, cleat_str request,
                                  cleat_retry r) {
    cleat_str nr = r.non_retryable.len ? r.non_retryable : CLEAT_S("[]");
    return unpack(cleat_sys_durable_call_with_retry(S(service), S(operation), S(request),
                                                    r.max_attempts, r.initial_interval_ms,
                                                    r.backoff_x100, r.max_interval_ms, S(nr)));
}

cleat_reply cleat_call_with_heartbeat(cleat_str service, cleat_str operation, cleat_str request,
                                      int64_t heartbeat_ms) {
    return unpack(
        cleat_sys_durable_call_with_heartbeat(S(service), S(operation), S(request), heartbeat_ms));
}

cleat_reply cleat_send(cleat_str service, cleat_str operation, cleat_str request) {
    return unpack(cleat_sys_durable_send(S(service), S(operation), S(request)));
}

cleat_reply cleat_schedule_invoke(cleat_str service, cleat_str operation, cleat_str request,
                                  int64_t delay_ms) {
    return unpack(cleat_sys_durable_schedule_invoke(S(service), S(operation), S(request), delay_ms));
}

cleat_reply cleat_fetch(cleat_str method, cleat_str url, cleat_str headers, cleat_str body) {
    if (headers.len == 0) headers = CLEAT_S("{}");
    return unpack(cleat_sys_fetch(S(method), S(url), S(headers), S(body)));
}

cleat_reply cleat_plugin_call(cleat_str plugin, cleat_str function, cleat_str input) {
    return unpack(cleat_sys_plugin_call(S(plugin), S(function), S(input)));
}

cleat_reply cleat_plugin_call_streaming(cleat_str plugin, cleat_str function, cleat_str input) {
    return unpack(cleat_sys_plugin_call_streaming(S(plugin), S(function), S(input)));
}

int64_t cleat_now_ms(void) { return cleat_sys_now(); }

static void pad(cleat_buf *b, int64_t n, int width) {
    char digits[8];
    for (int i = width - 1; i >= 0; i--) {
        digits[i] = (char)('0' + n % 10);
        n /= 10;
    }
    cleat_buf_bytes(b, digits, (size_t)width);
}

static int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

cleat_str cleat_iso8601(int64_t ms) {
    int64_t secs = floor_div(ms, 1000), millis = ms - secs * 1000;
    int64_t days = floor_div(secs, 86400), rem = secs - days * 86400;
    /* Civil date from days since 1970-01-01 (Howard Hinnant's algorithm). */
    int64_t z = days + 719468;
    int64_t era = floor_div(z, 146097);
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    int64_t day = doy - (153 * mp + 2) / 5 + 1;
    int64_t month = mp < 10 ? mp + 3 : mp - 9;
    int64_t year = yoe + era * 400 + (month <= 2);
    cleat_buf b = cleat_buf_new();
    pad(&b, year, 4); cleat_buf_char(&b, '-');
    pad(&b, month, 2); cleat_buf_char(&b, '-');
    pad(&b, day, 2); cleat_buf_char(&b, 'T');
    pad(&b, rem / 3600, 2); cleat_buf_char(&b, ':');
    pad(&b, rem % 3600 / 60, 2); cleat_buf_char(&b, ':');
    pad(&b, rem % 60, 2);
    if (millis) {
        cleat_buf_char(&b, '.');
        pad(&b, millis, 3);
        cleat_buf_cstr(&b, "000");
    }
    cleat_buf_cstr(&b, "+00:00");
    return cleat_buf_view(&b);
}

int64_t cleat_random(void) { return cleat_sys_random(); }
cleat_str cleat_uuid(cleat_str seed) { return unpack(cleat_sys_uuid(S(seed))).value; }
cleat_reply cleat_side_effect(cleat_str value) { return unpack(cleat_sys_side_effect(S(value))); }
cleat_str cleat_workflow_id(void) { return unpack(cleat_sys_workflow_id()).value; }
cleat_str cleat_run_id(void) { return unpack(cleat_sys_run_id()).value; }
int64_t cleat_version(void) { return cleat_sys_version(); }
int64_t cleat_min_version(void) { return cleat_sys_min_version(); }
void cleat_log(int32_t level, cleat_str message) { cleat_sys_durable_log(level, S(message)); }
cleat_reply cleat_json_parse(cleat_str input) { return unpack(cleat_sys_json_parse(S(input))); }
cleat_reply cleat_json_stringify(cleat_str input) {
    return unpack(cleat_sys_json_stringify(S(input)));
}

int64_t cleat_sleep_ms(int64_t duration_ms) { return cleat_sys_durable_sleep(duration_ms); }
cleat_reply cleat_await_signals(cleat_str names, int64_t timeout_ms) {
    return unpack(cleat_sys_durable_await_signals(S(names), timeout_ms));
}
cleat_reply cleat_poll_signal(cleat_str name) { return unpack(cleat_sys_poll_signal(S(name))); }
cleat_reply cleat_poll_cancellation(void) { return unpack(cleat_sys_poll_cancellation()); }
cleat_reply cleat_signal(cleat_str target_id, cleat_str name, cleat_str payload) {
    return unpack(cleat_sys_signal_workflow(S(target_id), S(name), S(payload)));
}
cleat_reply cleat_signal_and_wait(cleat_str target_id, cleat_str name, cleat_str payload,
                                  int64_t timeout_ms) {
    return unpack(cleat_sys_send_signal_and_wait(S(target_id), S(name), S(payload), timeout_ms));
}
cleat_reply cleat_reply_to_signal(cleat_str correlation_id, cleat_str response) {
    return unpack(cleat_sys_reply_to_signal(S(correlation_id), S(response)));
}
cleat_reply cleat_create_promise(cleat_str name) { return unpack(cleat_sys_create_promise(S(name))); }
cleat_reply cleat_await_promise(cleat_str promise_id, int64_t timeout_ms) {
    return unpack(cleat_sys_await_promise(S(promise_id), timeout_ms));
}
cleat_reply cleat_resolve_promise(cleat_str promise_id, cleat_str value) {
    return unpack(cleat_sys_resolve_promise(S(promise_id), S(value)));
}
cleat_reply cleat_reject_promise(cleat_str promise_id, cleat_str message) {
    return unpack(cleat_sys_reject_promise(S(promise_id), S(message)));
}
void cleat_register_update_handler(cleat_str export_name) {
    cleat_sys_register_update_handler(S(export_name));
}
void cleat_set_query(cleat_str key, cleat_str value) { cleat_sys_set_query_state(S(key), S(value)); }

cleat_reply cleat_child(cleat_str name, cleat_str input) {
    return unpack(cleat_sys_child_workflow(S(name), S(input)));
}
cleat_reply cleat_child_with_options(cleat_str name, cleat_str input, int64_t version,
                                     int64_t priority, cleat_str policy) {
    return unpack(cleat_sys_child_workflow_with_options(S(name), S(input), version, priority, S(policy)));
}
cleat_reply cleat_await_child(cleat_str run_id) { return unpack(cleat_sys_await_child(S(run_id))); }
cleat_reply cleat_await_all_children(cleat_str run_ids) {
    return unpack(cleat_sys_await_all_children(S(run_ids)));
}
cleat_reply cleat_await_any_child(cleat_str run_ids) {
    return unpack(cleat_sys_await_any_child(S(run_ids)));
}
cleat_reply cleat_poll_child(cleat_str run_id) { return unpack(cleat_sys_poll_child(S(run_id))); }
_Noreturn void cleat_continue_as_new(cleat_str input) {
    cleat_sys_continue_as_new(S(input));
    __builtin_trap();
}
_Noreturn void cleat_continue_as_new_with_version(cleat_str input, int64_t version) {
    cleat_sys_continue_as_new_with_version(S(input), version);
    __builtin_trap();
}
cleat_reply cleat_run_detached(cleat_str name, cleat_str input) {
    return unpack(cleat_sys_run_detached(S(name), S(input)));
}
cleat_reply cleat_defer(cleat_str export_name) { return unpack(cleat_sys_durable_defer(S(export_name))); }

void cleat_set_state(cleat_str key, cleat_str value) { cleat_sys_set_state(S(key), S(value)); }
cleat_reply cleat_get_state(cleat_str key) { return unpack(cleat_sys_get_state(S(key))); }
bool cleat_delete_state(cleat_str key) { return cleat_sys_delete_state(S(key)) == 1; }
int64_t cleat_incr_state(cleat_str key, int64_t delta) { return cleat_sys_incr_state(S(key), delta); }
bool cleat_has_state(cleat_str key) { return cleat_sys_has_state(S(key)) == 1; }
cleat_reply cleat_list_state(cleat_str prefix) { return unpack(cleat_sys_list_state(S(prefix))); }
cleat_reply cleat_set_scope(cleat_str object_type, cleat_str instance_key) {
    return unpack(cleat_sys_set_scope(S(object_type), S(instance_key)));
}
cleat_reply cleat_get_scope(void) { return unpack(cleat_sys_get_scope()); }
bool cleat_acquire_lock(cleat_str key, int64_t ttl_ms) { return cleat_sys_acquire_lock(S(key), ttl_ms) == 1; }
void cleat_release_lock(cleat_str key) { cleat_sys_release_lock(S(key)); }
cleat_reply cleat_schedule_cron(cleat_str workflow_name, cleat_str cron, cleat_str timezone,
                                cleat_str input) {
    return unpack(cleat_sys_schedule_cron(S(workflow_name), S(cron), S(timezone), S(input)));
}
cleat_reply cleat_delete_cron(cleat_str schedule_id) {
    return unpack(cleat_sys_delete_cron(S(schedule_id)));
}
cleat_reply cleat_list_crons(void) { return unpack(cleat_sys_list_crons()); }
