"""Engine configuration: limits of one execution segment and the runtime's knobs.

Framework-free: the Django side builds one from ``CLEAT_*`` settings
(``workflows.conf``); tests build their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
WASM_PAGE = 64 * 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Limits and runtime settings. Defaults are those of ABI.md section 5."""

    memory_limit_bytes: int = 32 * MIB
    max_string_bytes: int = 1 * MIB
    segment_timeout_s: float = 30.0
    fuel: int = 0  # instructions per segment; 0 switches metering off
    max_instances: int = 256
    max_tables: int = 64
    max_table_elements: int = 8 * 1024 * 1024
    # A run whose history reaches this many events continues as new automatically.
    max_history_events: int = 100_000
    # Epoch ticker period: the deadline is enforced to within one tick.
    epoch_tick_s: float = 0.01
    module_cache_size: int = 64
    module_cache_dir: Path | None = None
    # The disk cache keeps the most recently used artifacts within this size; 0: no limit.
    module_cache_max_bytes: int = 4096 * MIB
    # Check each replayed event's checksum against its content.
    verify_checksums: bool = True
    # "service.operation" calls that record a write-ahead intent before dispatch.
    write_ahead_ops: frozenset[str] = field(default_factory=frozenset)
    # Threads one ``durable_call_many`` batch makes its calls on (at most; a batch of fewer
    # calls uses fewer). 1 makes a batch's calls one after another.
    max_parallel_calls: int = 8
    # Fresh instances of each recently run component (Python workflow) kept made ahead of
    # the segments that take them (engine.ready_instances); 0 makes every one inline.
    ready_instances: int = 2
    # Instances made ahead get the pages a first call writes made private before a segment
    # takes them (engine.warm_pages; Linux): the segment's start shorter by those page
    # faults, which the maker's thread takes instead.
    warm_pages: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.memory_limit_bytes < WASM_PAGE:
            problems.append("memory_limit_bytes must be at least one 64 KiB page")
        if self.max_string_bytes < 1:
            problems.append("max_string_bytes must be positive")
        if self.segment_timeout_s <= 0:
            problems.append("segment_timeout_s must be positive")
        if self.fuel < 0:
            problems.append("fuel must be 0 (off) or positive")
        if self.epoch_tick_s <= 0 or self.epoch_tick_s > self.segment_timeout_s:
            problems.append("epoch_tick_s must be positive and below segment_timeout_s")
        if self.module_cache_max_bytes < 0:
            problems.append("module_cache_max_bytes must be 0 (no limit) or positive")
        if self.max_history_events < 10:
            problems.append("max_history_events must be at least 10")
        if self.max_parallel_calls < 1:
            problems.append("max_parallel_calls must be at least 1")
        if self.ready_instances < 0:
            problems.append("ready_instances must be 0 (off) or positive")
        if problems:
            raise ValueError("invalid engine configuration: " + "; ".join(problems))

    @property
    def deadline_ticks(self) -> int:
        return max(1, round(self.segment_timeout_s / self.epoch_tick_s))

    def fingerprint(self) -> str:
        """The part of the configuration that changes compiled code (disk-cache key)."""
        return f"epoch1-fuel{int(self.fuel > 0)}"
