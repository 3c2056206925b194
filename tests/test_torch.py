"""torch interop: output='torch', tensors in samples. Skipped without torch."""

import numpy as np
import pytest

from shmload import DataLoader

from .helpers import ImageDataset, RangeDataset

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


class TensorDataset(RangeDataset):
    def __getitem__(self, i):
        return torch.full((2, 3), float(i)), torch.tensor(i)


def test_output_torch_yields_zero_copy_tensors():
    loader = DataLoader(ImageDataset(8), batch_size=4, num_workers=2, output="torch")
    batches = list(loader)
    assert isinstance(batches[0]["image"], torch.Tensor) and batches[0]["image"].dtype == torch.uint8
    assert batches[0]["label"].dtype == torch.int64 and batches[1]["label"].tolist() == [4, 5, 6, 7]
    assert batches[0]["name"] == ["sample-0", "sample-1", "sample-2", "sample-3"]
    assert batches[1]["image"][2, 0, 0, 0].item() == 6


def test_tensor_leaves_in_samples_are_arrays_not_pickles():
    batches = list(DataLoader(TensorDataset(6), batch_size=3, num_workers=1))
    x, y = batches[1]
    assert isinstance(x, np.ndarray) and x.shape == (3, 2, 3) and x.dtype == np.float32
    assert y.tolist() == [3, 4, 5]


def test_a_tensor_made_from_a_view_keeps_the_slot_alive():
    loader = DataLoader(ImageDataset(40, shape=(256,)), batch_size=1, num_workers=1, prefetch_factor=1)
    first = torch.from_numpy(next(iter(loader))["image"])
    rest = [int(b["image"][0, 0]) for b in loader]
    assert rest == list(range(40)) and int(first[0, 0]) == 0


def test_torch_rng_is_seeded_per_batch_for_any_num_workers():
    class TorchRandom(RangeDataset):
        def __getitem__(self, i):
            return torch.rand(3)

    runs = [[b.copy() for b in DataLoader(TorchRandom(12), batch_size=4, seed=9, num_workers=w)] for w in (0, 2)]
    assert [len(r) for r in runs] == [3, 3]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    # seeded per batch: different batches see different random numbers
    assert len({r.tobytes() for r in runs[0]}) == 3


def test_torch_generator_chooses_the_seed():
    g = torch.Generator().manual_seed(123)
    a = DataLoader(RangeDataset(50), batch_size=50, shuffle=True, generator=g)
    g = torch.Generator().manual_seed(123)
    b = DataLoader(RangeDataset(50), batch_size=50, shuffle=True, generator=g)
    assert a.seed == b.seed and [x.tolist() for x in a] == [x.tolist() for x in b]


def test_torch_default_collate_as_collate_fn_still_works():
    from torch.utils.data import default_collate

    batches = list(DataLoader(ImageDataset(4), batch_size=2, num_workers=1, collate_fn=default_collate))
    assert isinstance(batches[0]["image"], np.ndarray) and batches[0]["label"].tolist() == [0, 1]


def test_tensors_numpy_cannot_hold_are_named():
    class BFloat(RangeDataset):
        def __getitem__(self, i):
            return {"x": torch.zeros(2, dtype=torch.bfloat16)}

    from shmload import CollateError

    with pytest.raises(CollateError, match=r"field sample\['x'\].*bfloat16.*tensor.float\(\)"):
        list(DataLoader(BFloat(4), batch_size=2, num_workers=1))


def test_output_torch_refuses_string_arrays_clearly():
    class Strings(RangeDataset):
        def __getitem__(self, i):
            return np.array(["a", "b"])

    from shmload import CollateError

    with pytest.raises(CollateError, match=r"output='torch' cannot hold an array of dtype <U1"):
        list(DataLoader(Strings(4), batch_size=2, num_workers=1, output="torch"))
