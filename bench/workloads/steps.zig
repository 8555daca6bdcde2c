//! The engine benchmark's step workload in Zig (bench/guest_bench.py): the input is N, and
//! the workflow makes N durable calls to bench.echo with {}, then returns true.
const cleat = @import("cleat");

fn steps(input: []const u8) cleat.Reply {
    const n = cleat.json.asInt(input) orelse 0;
    var i: i64 = 0;
    while (i < n) : (i += 1) {
        const r = cleat.call("bench", "echo", "{}");
        if (!r.isOk()) return r;
    }
    return cleat.ok("true");
}

export fn run(ptr: [*]const u8, len: usize) i64 {
    return cleat.entry(ptr, len, steps);
}
