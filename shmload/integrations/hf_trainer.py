"""The HF Trainer (transformers): exact mid-epoch resume of a shmload loader.

The Trainer takes a shmload loader as it is, from an overridden
``get_train_dataloader()``: it calls ``len()``, ``set_epoch(epoch)`` and ``iter()`` on it,
and gives it no distributed sampler (the loader shards itself). What it cannot do is
resume one. It saves nothing of the loader in its checkpoints, and on
``train(resume_from_checkpoint=...)`` it calls accelerate's ``skip_first_batches(loader,
n)``, which rebuilds any loader as a torch ``DataLoader`` over the same dataset: numpy
batches, no shmload, another order and other augmentations, silently.
:class:`ShmloadCheckpoint`, a ``TrainerCallback``, saves the position and resumes it:

- after every optimizer step (``on_step_end``) it takes ``loader.state_dict()``, and when
  the Trainer saves (``on_save``) it writes the one of that step to
  ``<output_dir>/checkpoint-<global_step>/shmload_loader.json`` (one file per process,
  ``shmload_loader.rank<r>.json``, when there are several);
- on a resumed run (``on_train_begin`` with ``global_step > 0``) it loads that file into
  the loader, and makes the Trainer's ``skip_first_batches`` return the loader itself,
  resumed, after checking that the Trainer's count of batches to skip is the saved
  position (NOTE [ Skipping the batches of a resumed epoch ]).

Where the Trainer is when it saves (transformers 5.23, ``Trainer._run_epoch``): it
reads each optimizer step's ``gradient_accumulation_steps`` batches (fewer in an epoch's
last step, the "remainder") before training the first of them (``get_batch_samples``), and
saves only after a step's last batch (or at an epoch's end). So at ``on_save`` the loader
has normally handed out exactly the batches of the steps completed; but a stop requested
in the middle of a step (``control.should_training_stop`` in ``on_step_begin`` or
``on_substep_end``, then a save at the epoch's end) leaves the loader up to a whole step
ahead of ``global_step``. The state saved is therefore the one taken at the end of step
``global_step``, never the loader's state at the time of the save.
"""

from __future__ import annotations

import functools
import json
import os
import weakref
from typing import Any

from .._loader.loader import DataLoader
from ..errors import OptionalDependencyError

LOADER_STATE_NAME = "shmload_loader.json"


def loader_state_file(checkpoint_dir: str, process_index: int = 0, world_size: int = 1,
                      elastic: bool = False) -> str:
    """Where :class:`ShmloadCheckpoint` keeps the loader's state in a checkpoint folder:
    ``shmload_loader.json``, or ``shmload_loader.rank<r>.json`` for each process of several
    (each rank's loader reads its own share, so each has its own position). An elastic
    loader's state is the same on every rank and resumes on any number of processes
    (docs/distributed.md): one ``shmload_loader.json``, which every process writes (the
    same bytes) and reads."""
    if world_size <= 1 or elastic:
        return os.path.join(checkpoint_dir, LOADER_STATE_NAME)
    return os.path.join(checkpoint_dir, f"shmload_loader.rank{process_index}.json")


def check_training_args(args: Any) -> None:
    """Refuse the TrainingArguments under which a resumed run cannot be exact. Checked at
    every run's start, not only at a resume: a job should learn it at its first start, not
    when it comes back from a crash."""
    if args.ignore_data_skip:
        raise ValueError(
            "ShmloadCheckpoint: TrainingArguments(ignore_data_skip=True) makes the Trainer count a resumed epoch's "
            "batches from 0 while the shmload loader continues where it stopped, so the epoch's last gradient "
            "accumulation step (its remainder) is never stepped and the schedule is off. Leave ignore_data_skip at "
            "its default, False: ShmloadCheckpoint makes the Trainer's skip exact, and costs nothing (the skipped "
            "batches are not loaded)")
    if getattr(args, "enable_jit_checkpoint", False):
        raise ValueError(
            "ShmloadCheckpoint: TrainingArguments(enable_jit_checkpoint=True) writes checkpoints without calling "
            "on_save, so they would hold no loader state and could not be resumed exactly. Set "
            "enable_jit_checkpoint=False and save with save_strategy/save_steps")


def delivered_batches(state: dict) -> int | None:
    """How many batches of its epoch a map-style loader state has handed out (with
    ``in_order=False``, some may lie beyond ``next_batch``); None for an iterable source."""
    if state.get("kind") != "map":
        return None
    return state["next_batch"] + len(state["delivered_beyond"])


class ShmloadCheckpoint:
    """A ``transformers.TrainerCallback`` that saves the train loader's position in every
    checkpoint and resumes it exactly: the resumed run trains on the same batches, sample
    for sample and augmentation for augmentation, as a run that was never stopped.

    Usage: ``Trainer(..., callbacks=[ShmloadCheckpoint()])`` with ``get_train_dataloader()``
    returning a ``shmload.DataLoader`` (the callback takes the Trainer's train loader; it
    needs no arguments), and ``trainer.train(resume_from_checkpoint=True)`` (or a path to a
    checkpoint in ``output_dir``) to resume. ``ignore_data_skip`` must stay False and
    ``enable_jit_checkpoint`` off (:func:`check_training_args` says why).

    Constructing one needs transformers (``pip install 'shmload[hf]'``); importing this
    module does not.
    """

    # NOTE [ A TrainerCallback without importing transformers ]
    # The class the Trainer gets must be a TrainerCallback (the Trainer calls every event
    # method of its callbacks), but importing this module must not import transformers
    # (seconds, and it may be missing). So ShmloadCheckpoint itself derives from object,
    # and __new__ makes, once per class, a subclass of it and of TrainerCallback, named
    # alike: ShmloadCheckpoint() is an instance of both, and the ImportError becomes an
    # OptionalDependencyError at construction.
    def __new__(cls, *args: Any, **kwargs: Any) -> ShmloadCheckpoint:
        # (a class is hashable; mypy says this one is not: python/typeshed#4638)
        return super().__new__(_as_trainer_callback(cls))  # type: ignore[arg-type]

    def __init__(self) -> None:
        self.loader: DataLoader | None = None
        self._position: tuple[int, str] | None = None  # (global_step, the loader's state after it, as JSON)

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        if not isinstance(train_dataloader, DataLoader):
            raise TypeError(
                f"ShmloadCheckpoint: the Trainer's train loader is a {type(train_dataloader).__name__}, not a "
                "shmload.DataLoader: override Trainer.get_train_dataloader() to return one")
        check_training_args(args)
        self.loader = train_dataloader
        _ARMED.discard(train_dataloader)
        if state.global_step > 0:  # resumed: the Trainer loaded checkpoint-<global_step>
            path = loader_state_file(_checkpoint_dir(args.output_dir, state.global_step), args.process_index,
                                     args.world_size, train_dataloader.elastic)
            train_dataloader.load_state_dict(_read_state(path, state.global_step))
            _arm_skip(train_dataloader)
        self._take(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._take(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._position is None:
            raise RuntimeError(f"ShmloadCheckpoint: the Trainer saves step {state.global_step}, but the loader's "
                               "state was never taken (was on_train_begin not called?)")
        step, saved = self._position
        if step != state.global_step:
            raise RuntimeError(f"ShmloadCheckpoint: the Trainer saves step {state.global_step}, but the loader's "
                               f"state was last taken at the end of step {step} (was on_step_end not called?)")
        assert self.loader is not None, "a position was taken without a loader"  # (_take needs one)
        path = loader_state_file(_checkpoint_dir(args.output_dir, step), args.process_index, args.world_size,
                                 self.loader.elastic)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"  # (an elastic state's file is written by every process)
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(saved)
        os.replace(temporary, path)  # a job killed while writing leaves no half file

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loader is not None:
            _ARMED.discard(self.loader)

    def _take(self, global_step: int) -> None:
        if self.loader is None:
            raise RuntimeError(f"ShmloadCheckpoint: step {global_step} ended, but no loader was given to the callback "
                               "(was on_train_begin not called?)")
        state = self.loader.state_dict()
        try:
            text = json.dumps(state)
        except TypeError as exc:
            raise TypeError(f"ShmloadCheckpoint: the loader's state_dict() is not JSON-serializable ({exc}); give "
                            "the sampler a state_dict() of plain ints, strings, lists and dicts") from exc
        self._position = (global_step, text)


@functools.lru_cache(maxsize=None)
def _transformers() -> Any:
    try:
        import transformers.trainer
        import transformers.trainer_utils
    except ImportError as exc:
        raise OptionalDependencyError(
            f"ShmloadCheckpoint needs transformers ({exc}): pip install 'shmload[hf]' (transformers==5.23.0, "
            "accelerate==1.15.0 and torch==2.13.0, the versions shmload is tested with)") from exc
    return transformers


@functools.lru_cache(maxsize=None)
def _as_trainer_callback(cls: type) -> type:
    """``cls``, or (see the NOTE in ShmloadCheckpoint) a subclass of it and of TrainerCallback."""
    callback = _transformers().TrainerCallback
    if issubclass(cls, callback):
        return cls
    return type(cls.__name__, (cls, callback), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                 "__doc__": cls.__doc__})


def _checkpoint_dir(output_dir: str, global_step: int) -> str:
    """The Trainer's own folder for the checkpoint of ``global_step`` (``Trainer._save_checkpoint``)."""
    return os.path.join(output_dir, f"{_transformers().trainer_utils.PREFIX_CHECKPOINT_DIR}-{global_step}")


def _read_state(path: str, global_step: int) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"ShmloadCheckpoint: the run resumes from step {global_step}, but {path} does not exist, so the "
            "loader's position is not known. Resume from a checkpoint saved with ShmloadCheckpoint in this run's "
            "output_dir (resume_from_checkpoint=True picks the last one; a checkpoint copied elsewhere needs "
            "output_dir to be the folder it is in)") from None


# NOTE [ Skipping the batches of a resumed epoch ]
# On a resume in the middle of an epoch, Trainer._run_epoch (transformers 5.23) calls
# skip_first_batches(train_dataloader, n), with n = the epoch's batches trained, for that
# epoch only, and counts the epoch's steps from n: that count decides where the
# accumulation steps end, and that the epoch's last, partial step is stepped. With
# ignore_data_skip=True it does not skip but counts from 0, which is right only if the loader
# starts the epoch again; a loader that continues where it stopped gets its epoch's last
# partial step (remainder) never stepped. So the Trainer keeps skipping, and its
# skip_first_batches (accelerate's, imported into transformers.trainer), which would rebuild
# the loader as a torch DataLoader, is wrapped: given a shmload loader that ShmloadCheckpoint
# has resumed, it checks that n is the number of batches the loaded state has handed out,
# and returns the loader itself. Any other loader goes to accelerate's function; a shmload
# loader that was not resumed by ShmloadCheckpoint is refused, since accelerate's rebuild
# would be wrong for it. The wrapper is installed once per process, when a run resumes.
_ARMED: weakref.WeakSet = weakref.WeakSet()  # the loaders whose resumed epoch the Trainer may skip into


def _arm_skip(loader: DataLoader) -> None:
    module = _transformers().trainer
    original = getattr(module, "skip_first_batches", None)
    if original is None:
        raise RuntimeError("ShmloadCheckpoint: transformers.trainer has no skip_first_batches: this transformers "
                           "version resumes differently from 5.23.0, the version ShmloadCheckpoint is made for")
    if not getattr(original, "shmload_wrapped", False):
        module.skip_first_batches = _wrap_skip(original)
    _ARMED.add(loader)


def _wrap_skip(original: Any) -> Any:
    @functools.wraps(original)
    def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
        if not isinstance(dataloader, DataLoader):
            return original(dataloader, num_batches)
        if dataloader not in _ARMED:
            raise RuntimeError(
                "the Trainer is resuming a shmload.DataLoader by skipping its first batches, which would replace it "
                "with a torch DataLoader (other batches, silently): add callbacks=[ShmloadCheckpoint()] to the "
                "Trainer, from shmload.integrations, and resume from a checkpoint saved with it")
        _ARMED.discard(dataloader)
        check_skip(dataloader.state_dict(), num_batches)
        return dataloader

    setattr(skip_first_batches, "shmload_wrapped", True)  # (the mark read above; no type has it)
    return skip_first_batches


def check_skip(state: dict, num_batches: int) -> None:
    """The Trainer resumes its epoch after ``num_batches`` batches: the loaded state must
    have handed out as many."""
    delivered = delivered_batches(state)
    if delivered is not None and delivered != num_batches:
        raise ValueError(
            f"ShmloadCheckpoint: the checkpoint's loader state is after batch {delivered} of epoch {state['epoch']}, "
            f"but the Trainer resumes the epoch after {num_batches} batches. Were gradient_accumulation_steps, the "
            "batch size or the dataset changed since the checkpoint? Resume with the settings it was saved with")
