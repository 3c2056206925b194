"""tensorpack's two ZMQ process runners, each with BatchData, configured as fairly as we can.

* ``tp-runner``: ``MultiProcessRunnerZMQ`` forks a whole copy of the flow into every
  worker. Unsharded, two workers would each produce the whole epoch (every sample
  twice), so each copy's ``reset_state()`` keeps only its share of the epoch's batches
  (``batches[idx::workers]``, ``idx`` being the runner's worker index); BatchData then
  forms exactly the sampler's batches inside the worker. Its workers loop forever and
  the main process takes ``len(flow)`` batches per epoch in arrival order, so an epoch
  can hold batches of a worker's next pass: the harness counts these duplicates.
* ``tp-map``: ``MultiProcessMapDataZMQ`` in strict mode (each datapoint exactly once per
  epoch) over BatchData of the indices: the workers load and stack a whole batch (the
  map function), the main process only sends index arrays. Arrival order.
  Its workers' ZMQ high-water mark is raised to at least 50: with the shipped value
  (2 * buffer_size / workers) strict mode can hang (tensorpack issue 673).

Both keep ``workers * prefetch_factor`` batches in flight (runner: ``hwm=prefetch_factor``
per worker socket; map: ``buffer_size=workers * prefetch_factor``), as torch and shmload do.
Both always fork (tensorpack's own processes), whatever the start method.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
from typing import Any

from tensorpack.dataflow import BatchData, DataFlow, DataFromList, MultiProcessMapDataZMQ, MultiProcessRunnerZMQ

from ..workloads import load_batch
from . import Harness, Options


class ShardedSamples(DataFlow):
    """Yields ``[image, label]`` for this runner worker's share of the epoch's batches."""

    def __init__(self, dataset: Any, batches: list[list[int]], workers: int):
        self.dataset, self.batches, self.workers = dataset, batches, workers
        self.mine = batches  # in the main process: the whole epoch, for len()

    def reset_state(self) -> None:  # called once in each worker, after the fork
        idx = getattr(mp.current_process(), "idx", 0)
        self.mine = self.batches[idx::self.workers]

    def __len__(self) -> int:
        return sum(len(b) for b in self.mine)

    def __iter__(self):
        for indices in self.mine:
            for i in indices:
                image, label = self.dataset[i]
                yield [image, label]


class MapDataRaisedHwm(MultiProcessMapDataZMQ):
    def _create_worker(self, id, pipename, hwm):
        return super()._create_worker(id, pipename, max(hwm, 50))


def _map_batch(dataset: Any, datapoint: list) -> list:
    return list(load_batch(dataset, datapoint[0].tolist()))


def _closer(flow: Any):
    def close() -> None:
        if not flow.context.closed:
            flow.socket.close(0)
            flow.context.destroy(0)
        for proc in flow._procs:
            proc.terminate()
            proc.join(5)
        flow._procs = []
    return close


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    batch_size = len(batches[0])
    if name == "tp-runner":
        flow = MultiProcessRunnerZMQ(BatchData(ShardedSamples(dataset, batches, options.workers), batch_size),
                                     num_proc=options.workers, hwm=options.prefetch_factor)
        description = (f"MultiProcessRunnerZMQ(num_proc={options.workers}, hwm={options.prefetch_factor}) over "
                       "BatchData of a per-worker shard; arrival order, epochs not exact")
        exact = False
    else:
        indices = DataFromList([[i] for b in batches for i in b], shuffle=False)
        flow = MapDataRaisedHwm(BatchData(indices, batch_size), num_proc=options.workers,
                                map_func=functools.partial(_map_batch, dataset),
                                buffer_size=options.workers * options.prefetch_factor, strict=True)
        description = (f"MultiProcessMapDataZMQ(num_proc={options.workers}, buffer_size="
                       f"{options.workers * options.prefetch_factor}, strict=True, worker hwm >= 50) "
                       "mapping BatchData of indices to stacked batches; arrival order")
        exact = True
    flow.reset_state()  # forks the workers
    return Harness(lambda: iter(flow), _closer(flow), description, ordered=False, exact=exact)


