/* The engine benchmark's step workload in C (bench/guest_bench.py): the input is N, and the
 * workflow makes N durable calls to bench.echo with {}, then returns true. */
#include "cleat.h"

static cleat_reply steps(cleat_str input) {
    int64_t n = 0;
    cleat_json_as_int(input, &n);
    for (int64_t i = 0; i < n; i++) {
        cleat_reply r = cleat_call(CLEAT_S("bench"), CLEAT_S("echo"), CLEAT_S("{}"));
        if (!cleat_is_ok(r)) return r;
    }
    return cleat_ok(CLEAT_S("true"));
}

CLEAT_WORKFLOW(run, steps)
