"""The profiler: counters each worker keeps in shared memory (``counters``), the main
process's side that gathers them (``profile``), the frozen snapshot and its diagnosis
(``stats``), and its two renderings (``trace``, ``plot``). See docs/profiling.md."""
