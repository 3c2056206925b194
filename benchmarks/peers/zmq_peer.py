"""A process pool hand-rolled with pyzmq: PUSH/PULL sockets, pickle protocol 5, out-of-band buffers.

``workers`` processes (the run's start method), each given the dataset once when it starts.
The main process PUSHes tasks (a pickle of sequence number and index list) over ``ipc://``
sockets in a temporary directory (removed by ``close()``), round-robin to the workers' PULL
sockets. A worker runs ``load_batch`` and PUSHes back one multipart message: the sequence
number, ``pickle.dumps(batch, protocol=5, buffer_callback=...)``, and the arrays' out-of-band
buffers as frames of their own, sent with ``copy=False`` (pyzmq still copies frames under its
``copy_threshold``, 64 KiB: tiny's 32 KiB images are copied, rows' 1 MiB are not). The main
process receives with ``copy=False`` and ``pickle.loads(data, buffers=frames)``: the arrays
are views on the received frames. It reorders by sequence number, so batches come in sampler
order, every sample once per epoch; at most ``workers * prefetch_factor`` batches are
outstanding besides the one the consumer holds, as in torch's loader.

What it measures: batches moved through ZMQ with pickle 5, no array copy in Python on either
side, plus the main process's per-batch dispatch and reordering (libzmq's I/O threads count in
the CPU of the process they run in).
"""

from __future__ import annotations

import multiprocessing
import pickle
import shutil
import tempfile
from typing import Any, Callable, Iterator

import zmq

from ..workloads import load_batch
from . import Harness, Options

TIMEOUT_S = 120  # polls of 1 s the main process makes, checking its workers, before it gives up


def _work(dataset: Any, tasks_at: str, results_at: str, hwm: int) -> None:
    parent, context = multiprocessing.parent_process(), zmq.Context()
    tasks, results = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    tasks.rcvhwm, tasks.rcvtimeo, results.sndhwm = hwm, 1000, hwm
    tasks.connect(tasks_at)
    results.connect(results_at)
    try:
        while True:
            try:
                task = tasks.recv()
            except zmq.Again:  # nothing for 1 s: stop if the main process is gone
                if parent is not None and not parent.is_alive():
                    return
                continue
            if not task:  # the stop message
                return
            seq, indices = pickle.loads(task)
            buffers: list[pickle.PickleBuffer] = []
            data = pickle.dumps(load_batch(dataset, indices), protocol=5, buffer_callback=buffers.append)
            results.send_multipart([seq.to_bytes(8, "little"), data, *buffers], copy=False)
    finally:
        context.destroy(linger=0)


class _Pool:
    def __init__(self, dataset: Any, batches: list[list[int]], options: Options):
        self.batches, self.limit, self.in_flight = batches, options.workers * options.prefetch_factor, 0
        self.tmp = tempfile.mkdtemp(prefix="zmq-pool-")
        tasks_at, results_at = f"ipc://{self.tmp}/tasks", f"ipc://{self.tmp}/results"
        hwm = self.limit + options.workers  # room for every task in flight and the stop messages
        mp: Any = multiprocessing.get_context(options.start_method)
        # The workers start before this process makes its ZMQ context: a fork copies no live one.
        self.procs = [mp.Process(target=_work, args=(dataset, tasks_at, results_at, hwm), daemon=True)
                      for _ in range(options.workers)]
        for p in self.procs:
            p.start()
        self.context = zmq.Context()
        self.tasks, self.results = self.context.socket(zmq.PUSH), self.context.socket(zmq.PULL)
        self.tasks.sndhwm, self.results.rcvhwm = hwm, hwm
        self.tasks.bind(tasks_at)
        self.results.bind(results_at)

    def _io(self, call: Callable[[], Any], socket: zmq.Socket, event: int, what: str) -> Any:
        """``call()``, a send or receive with NOBLOCK; while it would block, poll 1 s at a time."""
        for _ in range(TIMEOUT_S):
            try:
                return call()
            except zmq.Again:  # a PUSH with no worker connected yet blocks too
                if socket.poll(1000, event):
                    continue
            dead = [p for p in self.procs if p.exitcode is not None]
            if dead:
                raise RuntimeError(f"zmq-pool: worker pid {dead[0].pid} exited with code {dead[0].exitcode} "
                                   f"while the main process waited for {what}")
        raise RuntimeError(f"zmq-pool: waited {TIMEOUT_S} s for {what}, every worker alive")

    def _send(self, seq: int) -> None:
        message = pickle.dumps((seq, self.batches[seq]), protocol=5)
        self._io(lambda: self.tasks.send(message, zmq.NOBLOCK), self.tasks, zmq.POLLOUT, "a worker to take a task")
        self.in_flight += 1

    def _receive(self) -> tuple[int, Any]:
        seq, data, *frames = self._io(lambda: self.results.recv_multipart(zmq.NOBLOCK, copy=False),
                                      self.results, zmq.POLLIN, "a batch")
        self.in_flight -= 1
        return int.from_bytes(seq.buffer, "little"), pickle.loads(data.buffer, buffers=frames)

    def epoch(self) -> Iterator[Any]:
        while self.in_flight:  # the results of an epoch left unfinished: dropped
            self._receive()
        sent, ready = 0, {}
        for want in range(len(self.batches)):
            while sent < min(len(self.batches), want + 1 + self.limit):
                self._send(sent)
                sent += 1
            while want not in ready:
                seq, batch = self._receive()
                ready[seq] = batch
            yield ready.pop(want)

    def close(self) -> None:
        for _ in self.procs:
            try:
                self.tasks.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                break
        for p in self.procs:
            p.join(5)
            if p.exitcode is None:
                p.terminate()
                p.join(5)
        self.context.destroy(linger=0)
        shutil.rmtree(self.tmp, ignore_errors=True)


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    pool = _Pool(dataset, batches, options)
    return Harness(pool.epoch, pool.close,
                   f"{options.workers} processes, ZMQ PUSH/PULL over ipc://, pickle 5 with out-of-band buffers "
                   f"as copy=False frames; {pool.limit} batches outstanding; reordered to sampler order")
