"""The part of the DataLoader that saves and loads its place: ``state_dict``,
``load_state_dict`` and ``set_epoch`` (a mixin of ``loader.DataLoader``, which owns the
attributes it reads; the state's format and checks are resume.py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core._checks import check_int
from .._ordering.elastic import is_elastic
from .._ordering.shuffle import StreamShuffle
from .._session.config import LoaderConfig
from ..errors import ShmloadWarning
from . import elastic_state as _elastic_state
from . import resume as _resume


class Stateful:
    """Saving and loading a :class:`~shmload.DataLoader`'s place (torchdata's
    ``Stateful`` protocol: ``state_dict()`` and ``load_state_dict()``)."""

    _iterable: bool
    _resume: dict | None
    _progress: Any
    _next_epoch: int
    _own_sampler: bool
    _order_source: Any
    _source: Any
    _shard: tuple[int, int] | None
    _parts_seed: int | None
    _cfg: Any
    seed: int
    elastic: bool
    num_workers: int | str
    _sessions: Any
    batch_size: int | None
    drop_last: bool
    sampler: Any

    if TYPE_CHECKING:  # DataLoader's
        def _sync_distributed(self, unshard: bool = False) -> None: ...
        def _stream_shuffle(self) -> StreamShuffle: ...
        def _note(self, message: str, category: type) -> None: ...
        def _config(self) -> Any: ...

    def state_dict(self) -> dict:
        """Where the loader is: at an epoch's start or in the middle of one (the latest
        ``iter()``), for :meth:`load_state_dict` in a new loader, with any ``num_workers``
        (for an iterable source: the same). Small, and JSON-serializable when the
        sampler's (or source's) own state is; see docs/api.md. With num_workers="auto" it
        also holds the count run last (``"workers"``), which a resumed "auto" loader starts from."""
        state = self._state()
        tuner = self._sessions.tuner
        if tuner is not None and self.num_workers == "auto" and self._resume is None:
            state = {**state, "workers": tuner.count}
        return state

    def _state(self) -> dict:
        if self._resume is not None:
            return self._resume  # loaded, not used yet
        self._sync_distributed()
        current = self._progress
        live = current is not None and current.saveable
        if self._iterable:
            if live:
                self._saveable(_resume.capture(self._source, kind="iterable source"), "iterable source")
                return _resume.stream_state(current.epoch, self.seed, len(current.draws), current, self._batching(),
                                            self._stream_shuffle())
            return _resume.stream_state(self._next_epoch, self.seed, max(1, self._config().num_workers), None,
                                        self._batching(), self._stream_shuffle())
        if live:
            sampler_state = self._saveable(current.sampler_state)
            if is_elastic(sampler_state):  # the global position, the same on every rank
                sampler_state = _elastic_state.elastic_at(sampler_state, current.saved()[0])
            return _resume.map_state(current.epoch, self.seed, sampler_state, current, self._batching())
        return _resume.map_state(self._upcoming_epoch(), self.seed, self._saveable(_resume.capture(self._order_source)),
                                 None, self._batching())

    def _saveable(self, state: Any, kind: str = "sampler") -> Any:
        """``state``, or None (with one warning) for a sampler or source that has none
        (NOTE [ Saving without the sampler's state ])."""
        if type(state) is not _resume.Unsaveable:
            return state
        self._note(_resume.fast_forward_note(state.reason, kind), ShmloadWarning)
        return None

    def _batching(self) -> dict:
        """How samples are grouped into batches: a position means something only under the
        same grouping."""
        return {"batch_size": self.batch_size, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` (from :meth:`state_dict`) was saved: the next ``iter()``
        yields the rest of the saved epoch, bit-identical to an uninterrupted run (with
        ``in_order=False``: every batch not delivered before the save, once each, in
        any order); later ones the epochs after it. Sets this loader's seed to the
        saved one. Epoch iterators already running are not changed.

        The sampler's saved state is loaded now, so a ``set_epoch()`` of yours afterwards
        acts as it would have in the uninterrupted run (torch's idiom calls it before
        every epoch); in the middle of an epoch, ``iter()`` then checks that the sampler's
        state is still the saved one. ``loader.set_epoch(n)`` with another epoch than
        the saved one cancels the resume."""
        state = _resume.check(state, "iterable" if self._iterable else "map")  # its whole shape
        workers = state.get("workers")  # num_workers="auto"'s count run last (checked before anything changes)
        if workers is not None:
            check_int("state['workers']", workers, 1)
        elastic = not self._iterable and _elastic_state.check_elastic(state, self.elastic)
        if not elastic:  # (an elastic position counts samples: any batch size continues it)
            _resume.check_batching(state["batching"], self._batching())
        if not self._iterable:
            self._sync_distributed()
            if self._own_sampler and not elastic:
                _resume.check_same_sharding(state["sampler"], self._shard)
            if state["sampler"] is not None:  # None: saved without it (NOTE [ Saving without the sampler's state ])
                _resume.check_resumable(self._order_source)
                self._order_source.load_state_dict(state["sampler"])
            if elastic:
                state = _elastic_state.elastic_resume(state, self._order_source)
        else:
            self._sync_distributed()
            saved_parts_seed = state.get("parts_seed")
            _resume.check_shuffling(state, self._stream_shuffle())
            if any(s["state"] is not None for s in state["streams"]):
                _resume.check_resumable(self._source, "iterable source")
            if saved_parts_seed is not None and saved_parts_seed != self._parts_seed:
                self._parts_seed = saved_parts_seed
                self._cfg = None
        if state["seed"] != self.seed:
            self.seed = int(state["seed"])
        if workers is not None and self.num_workers == "auto":
            self._sessions.first_count = workers
        self._resume = state
        self._next_epoch = int(state["epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch ``epoch`` (later ones continue epoch+1, ...), also for an
        iterator made by ``iter()`` that has not yielded its first batch yet; forwarded to
        the sampler (or batch sampler) that has ``set_epoch``. After
        :meth:`load_state_dict`, another epoch than the saved one cancels the resume; the
        saved one keeps it, and leaves the loaded sampler as it is."""
        check_int("epoch", epoch, 0)
        self._next_epoch = int(epoch)
        if self._progress is not None and not self._progress.finished:
            self._progress = None  # an epoch left with break: state_dict() now describes epoch `epoch`
        if self._resume is not None:
            if self._resume["epoch"] == epoch:
                return
            self._resume = None
        source = self._order_source
        if source is not None and hasattr(source, "set_epoch"):
            source.set_epoch(epoch)

    def _upcoming_epoch(self) -> int:
        """The number the next epoch takes: a loaded state's; else the loader's own
        sampler's epoch, so a ``set_epoch`` on it (trainers call ``loader.sampler.set_epoch``)
        moves the epoch's seeds with its order, and one number means the epoch; else the
        loader's own count (a sampler of yours may not count epochs, or be told the same
        one every time, and a batch's seeds must still change from epoch to epoch)."""
        if self._resume is not None:
            return self._resume["epoch"]
        if self._own_sampler and not self._iterable:
            return self.sampler.epoch
        return self._next_epoch

    def _check_resume(self, cfg: LoaderConfig, resume: dict) -> None:
        """Refuse at iter() what the loaded state ``resume`` cannot be resumed with."""
        if cfg.iterable:
            _resume.check_streams(cfg.num_workers, resume)
        elif resume["next_batch"] or resume["delivered_beyond"]:
            _resume.check_unchanged(self._order_source, resume, _resume.capture(self._order_source))
