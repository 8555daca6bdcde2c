// The engine benchmark's step workload in AssemblyScript (bench/guest_bench.py): the input is
// N, and the workflow makes N durable calls to bench.echo with {}, then returns true.
import * as cleat from "../../sdk/assemblyscript/assembly/index";
import { Reply, Value } from "../../sdk/assemblyscript/assembly/index";

export { cleat_alloc, cleat_abi_version } from "../../sdk/assemblyscript/assembly/index";

function steps(input: Value): Reply {
  const n = input.asInt();
  const request = Value.object();
  for (let i: i64 = 0; i < n; i++) {
    const r = cleat.call("bench", "echo", request);
    if (!r.isOk()) return r;
  }
  return cleat.ok(Value.bool(true));
}

export function run(ptr: usize, len: usize): i64 {
  return cleat.entry(ptr, len, steps);
}
