"""HF accelerate: let gradient accumulation see the end of a shmload loader.

``accelerator.prepare()`` returns a loader that is not torch's unchanged (it cannot
rebuild it as its ``DataLoaderShard``), so accelerate never learns where the epoch ends:
``accelerator.gradient_state.end_of_dataloader`` stays False, and inside
``accelerator.accumulate(model)`` the last, partial window of an epoch is never
stepped (its gradients are carried into the next epoch). accelerate has no public API
for a loader of another kind to report its end; what its own loaders use is
``accelerate.data_loader.DataLoaderStateMixin``, a class made for inheriting (its
docstring tells inheriters what to provide). :func:`for_accelerate` wraps a shmload loader
in a small subclass of it:

- iterating registers it with accelerate's ``GradientState`` (``begin()``), and sets
  ``end_of_dataloader`` just before the epoch's last batch is handed out, as
  accelerate's own loaders do; leaving the loop unregisters it (``end()``);
- the end is known without reading ahead (``Epoch.at_end()``: no batch is
  held back, so ``state_dict()`` at any step is exact); for an iterable source the
  end is known only when read, so ``end_of_dataloader`` is not set on its last batch;
- everything else (``state_dict``, ``load_state_dict``, ``set_epoch``, ``len``,
  ``sampler``, ``close`` ...) is the wrapped loader's, so
  ``accelerator.register_for_checkpointing(loader)`` saves and restores its exact
  position with ``save_state()``/``load_state()``.

``gradient_state.remainder`` stays -1 (unknown), so ``gather_for_metrics`` does not drop
the samples that a sharded epoch repeats to give every rank equal counts (as with
torch's ``DistributedSampler`` under plain DDP).
"""

from __future__ import annotations

import functools
from typing import Any, Iterator

from ..errors import OptionalDependencyError


def for_accelerate(loader: Any) -> Any:
    """``loader`` (a ``shmload.DataLoader``), seen by accelerate's gradient accumulation."""
    return _adapter()(loader)


@functools.lru_cache(maxsize=None)
def _adapter() -> type:
    try:
        from accelerate.data_loader import DataLoaderStateMixin
        from accelerate.state import GradientState
    except ImportError as exc:
        raise OptionalDependencyError(
            f"for_accelerate() needs accelerate ({exc}): pip install 'shmload[accelerate]' (accelerate==1.15.0 "
            "and torch==2.13.0, the versions shmload is tested with)") from exc

    class AcceleratedLoader(DataLoaderStateMixin):
        """A shmload loader that tells accelerate's ``GradientState`` where its epochs end."""

        def __init__(self, loader: Any) -> None:
            self.loader = loader
            self.gradient_state = GradientState()

        @property
        def _drop_last(self) -> bool:  # read by DataLoaderStateMixin.begin()
            return self.loader.drop_last

        def __iter__(self) -> Iterator[Any]:
            self.begin()
            try:
                epoch = iter(self.loader)
                for batch in epoch:
                    if epoch.at_end():
                        self.end_of_dataloader = True
                    yield batch
            finally:
                self.end()

        def __len__(self) -> int:
            return len(self.loader)

        def __getattr__(self, name: str) -> Any:
            if name == "loader":  # not set yet (unpickling): no recursion
                raise AttributeError(name)
            return getattr(self.loader, name)

        def __reduce__(self) -> tuple:  # the class is made at run time: pickle as the call that makes it
            return for_accelerate, (self.loader,)

        def __repr__(self) -> str:
            return f"for_accelerate({self.loader!r})"

    return AcceleratedLoader
