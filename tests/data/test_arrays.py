"""Your arrays as a Dataset: the checks shared by every user-data format, and the `arrays` source (.npz/.npy)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.catalog import DATASETS
from fedhet.data.arrays import check_labels, standardise, standardise_targets, to_dataset
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.in_memory import InMemory, hold
from fedhet.datasets import from_arrays, load
from fedhet.errors import DataError

ONE_LINE = "^[^\n]+$"


def test_from_arrays_keeps_values_and_numbers_names() -> None:
    x = np.arange(12, dtype=np.int32).reshape(6, 2)
    data = from_arrays(x, ["cat", "dog", "cat", "ant", "dog", "cat"], users=[10, 10, 7, 7, "x", "x"])
    assert data.x.dtype == torch.float32 and torch.equal(data.x, torch.tensor(x, dtype=torch.float32))
    assert data.y.tolist() == [1, 2, 1, 0, 2, 1] and data.num_classes == 3  # ant < cat < dog
    assert data.users is not None and data.users.tolist() == [0, 0, 1, 1, 2, 2]  # "10" < "7" < "x"


def test_integer_labels_are_class_ids_and_torch_tensors_work() -> None:
    data = from_arrays(torch.randn(5, 3, 4), torch.tensor([0, 4, 4, 2, 0]))
    assert data.num_classes == 5 and data.input_shape == (3, 4)
    assert from_arrays(np.zeros((3, 1)), [0.0, 1.0, 2.0]).y.tolist() == [0, 1, 2]  # whole floats are ids
    assert from_arrays(np.zeros((3, 1)), [0, 1, 1], num_classes=4).num_classes == 4
    assert from_arrays(np.zeros(4), [True, False, True, True]).x.shape == (4, 1)


def test_tokens_stay_integers() -> None:
    data = from_arrays(np.array([[1, 2, 3], [4, 5, 6]]), [0, 1], tokens=True)
    assert data.x.dtype == torch.int64


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        ([[1.0, 2.0], [3.0]], [0, 1], "samples have mixed shapes"),
        (np.array([[1.0], ["a"]], dtype=object), [0, 1], "features are not one numeric array"),
        (np.array([["a"], ["b"]]), [0, 1], "features are not numeric (dtype <U1)"),
        ([[1.0], [np.nan]], [0, 1], "row 1 holds a missing or infinite value"),
        ([[1.0], [2.0]], [0.5, 1.0], "label 0.5 (row 0) is not a class"),
        ([[1.0], [2.0]], [0, -1], "label -1 (row 1) is negative"),
        ([[1.0], [2.0]], [0, 0], "every label is the same class"),
        ([[1.0], [2.0]], [0, 1, 1], "3 labels for 2 samples"),
        ([[1.0], [2.0]], [[0, 1], [1, 0]], "labels must be one class per sample"),
        ([[1.0], [2.0]], [0, np.nan], "label nan (row 1) is not a class"),
        (np.zeros((0, 3)), [], "no samples"),
    ],
)
def test_bad_arrays_are_one_line_errors(x: object, y: object, message: str) -> None:
    with pytest.raises(DataError, match=ONE_LINE) as err:
        from_arrays(x, y)
    assert message in str(err.value)


def test_more_classes_than_num_classes_is_an_error() -> None:
    with pytest.raises(DataError, match="labels need 5 classes but num_classes is 3"):
        check_labels([0, 4], 2, "test", num_classes=3)


def test_bad_users_and_tokens() -> None:
    with pytest.raises(DataError, match=r"users must give one id per sample, shape \(2,\)"):
        to_dataset("t", [[1.0], [2.0]], [0, 1], users=[1])
    with pytest.raises(DataError, match="user id of row 0 is missing"):
        to_dataset("t", [[1.0], [2.0]], [0, 1], users=[np.nan, 1.0])
    with pytest.raises(DataError, match="token features must be integers"):
        to_dataset("t", [[1.5], [2.0]], [0, 1], tokens=True)
    with pytest.raises(DataError, match="token ids must be non-negative"):
        to_dataset("t", [[1], [-2]], [0, 1], tokens=True)


def test_standardise_by_hand() -> None:
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    assert torch.allclose(standardise(x), torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_npz_with_users_gives_natural_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 2, 3)).astype(np.float32)
    y = rng.integers(0, 3, 60)
    users = np.repeat(np.array(["u0", "u1", "u2", "u3"]), 15)
    write_npz(tmp_path / "data.npz", feats=x, labels=y, who=users)
    monkeypatch.chdir(tmp_path)  # relative paths start at the current directory
    data = load({"name": "arrays", "path": "data.npz", "x": "feats", "y": "labels", "users": "who"})
    assert data.name == "data" and data.input_shape == (2, 3) and data.num_classes == 3
    assert torch.allclose(data.x, torch.from_numpy(x)) and data.y.tolist() == y.tolist()
    assert data.users is not None and torch.bincount(data.users).tolist() == [15, 15, 15, 15]


def test_npy_files(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(8).reshape(4, 2))
    np.save(tmp_path / "y.npy", np.array([1, 0, 1, 0]))
    data = load({"name": "arrays", "x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")})
    assert data.x.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] and data.y.tolist() == [1, 0, 1, 0]


def test_bad_array_files(tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "d.npz", x=np.zeros((3, 2)), y=np.array([0, 1, 1]))

    def fails(message: str, **spec: object) -> None:
        with pytest.raises(DataError, match=ONE_LINE) as err:
            load({"name": "arrays", **spec})
        assert message in str(err.value), str(err.value)

    fails("has no array 'labels' (for y); it holds: x, y", path=str(npz), y="labels")
    fails("no such file or folder 'missing.npz'", path="missing.npz")
    fails("x 'x' is not a .npy file", x="x")
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    fails("is not a NumPy .npz file", path=str(tmp_path / "junk.npz"))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    fails(
        "holds Python objects, which fedhet does not unpickle", x=str(tmp_path / "obj.npy"), y=str(tmp_path / "y.npy")
    )
    write_npz(tmp_path / "ragged.npz", x=np.array([[1.0, 2.0], [3.0, 4.0]]), y=np.array([0, 1, 2]))
    fails("3 labels for 2 samples", path=str(tmp_path / "ragged.npz"))
    np.save(tmp_path / "one.npy", np.zeros(3))
    fails("is one array (.npy); give x and y as .npy files", path=str(tmp_path / "one.npy"))


def test_in_memory_data_is_held_by_content() -> None:
    data = from_arrays(np.eye(4), [0, 1, 0, 1], name="mine")
    ref = hold(data)
    assert ref.startswith("mine@") and ref == hold(from_arrays(np.eye(4), [0, 1, 0, 1], name="mine"))
    assert ref != hold(from_arrays(np.eye(4), [0, 1, 1, 1], name="mine"))
    assert InMemory(ref=ref).load(Path()) is data
    with pytest.raises(DataError, match="that this process does not hold; pass the arrays again"):
        DATASETS.build({"name": "in_memory", "ref": "gone@0"}).load(Path())


def _federation(train: list[list[float]], test: list[list[float]], seen: list[bool]) -> FederatedData:
    def part(ys: list[list[float]]) -> ClientData:
        return ClientData.from_parts([torch.zeros(len(y), 1) for y in ys], [torch.tensor(y) for y in ys])

    return FederatedData("t", part(train), part(test), 1, torch.tensor(seen), task="regression")


def test_targets_are_standardised_by_the_training_clients_samples_only() -> None:
    # seen clients' training targets 1, 3 and 2 (mean 2, variance 2/3); the unseen client's 100 and every test
    # target are left out of the statistics
    data = standardise_targets(_federation([[1.0, 3.0], [2.0], [100.0]], [[5.0], [2.0], [0.0]], [True, True, False]))
    s = (2 / 3) ** 0.5
    assert data.target_scale is not None and data.target_scale.scale == pytest.approx(s)
    assert data.target_scale.mean.tolist() == pytest.approx([2.0])
    assert data.train.y.tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 98 / s], rel=1e-6)
    assert data.test.y.tolist() == pytest.approx([3 / s, 0.0, -2 / s], rel=1e-6)
    back = data.target_scale.original(data.test.y)
    assert back.tolist() == pytest.approx([5.0, 2.0, 0.0], abs=1e-5)


def test_two_target_columns_are_centred_each_and_share_one_scale() -> None:
    part = ClientData.from_parts([torch.zeros(2, 1)], [torch.tensor([[0.0, 10.0], [2.0, 16.0]])])
    data = standardise_targets(FederatedData("t", part, part, 2, torch.ones(1, dtype=torch.bool), task="regression"))
    # variances 1 and 9: one scale sqrt((1 + 9) / 2) = sqrt(5) keeps the squared error's weighting of the columns
    assert data.target_scale is not None and data.target_scale.scale == pytest.approx(5**0.5)
    assert data.target_scale.mean.tolist() == pytest.approx([1.0, 13.0])
    expected = torch.tensor([[-1.0, -3.0], [1.0, 3.0]]) / 5**0.5
    torch.testing.assert_close(data.train.y, expected)


def test_constant_targets_are_only_centred() -> None:
    data = standardise_targets(_federation([[7.0, 7.0]], [[9.0]], [True]))
    assert data.target_scale is not None and data.target_scale.scale == 1.0 and data.test.y.tolist() == [2.0]


TARGET_LIKE = np.arange(25, 346, 3)  # 107 whole numbers from 25: a numeric target, not class ids


def test_whole_numbers_that_look_like_a_target_are_refused_unless_a_task_says_so() -> None:
    x = np.zeros((len(TARGET_LIKE), 2))
    with pytest.raises(DataError, match=ONE_LINE) as err:
        from_arrays(x, TARGET_LIKE)
    said = str(err.value)
    assert "107 different whole numbers from 25 to 343" in said and "task: regression" in said
    assert "task: classification" in said
    assert from_arrays(x, TARGET_LIKE, task="classification").num_classes == 344  # ids as given (0..343)
    regression = from_arrays(x, TARGET_LIKE, task="regression")
    assert regression.task == "regression" and regression.y.dtype == torch.float32
    assert check_labels(TARGET_LIKE, len(TARGET_LIKE), "y", num_classes=400, guessed=True)[1] == 400  # named: kept
    # class ids 0..C-1 (or 1..C), however many, and up to 50 values of any kind stay classes
    assert from_arrays(np.zeros((200, 1)), np.arange(200) % 100).num_classes == 100
    assert from_arrays(np.zeros((100, 1)), np.arange(100) + 1).num_classes == 101
    assert from_arrays(np.zeros((50, 1)), np.arange(50) * 7).num_classes == 344


def test_the_arrays_source_refuses_target_like_labels_only_at_task_auto(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((len(TARGET_LIKE), 2)), y=TARGET_LIKE)
    with pytest.raises(DataError, match=r"^dataset 'arrays' .*task: regression"):
        load({"name": "arrays", "path": str(path)})
    assert load({"name": "arrays", "path": str(path), "task": "classification"}).num_classes == 344
    assert load({"name": "arrays", "path": str(path), "task": "regression"}).task == "regression"


def _npy_bytes(header: str, data: bytes, pad: int = 0) -> bytes:
    """A version-2 .npy file: magic, header length, the header dict (padded with `pad` spaces), the data."""
    text = (header + " " * pad + "\n").encode()
    return b"\x93NUMPY\x02\x00" + len(text).to_bytes(4, "little") + text + data


def test_hostile_npy_files_are_refused_before_they_are_read(tmp_path: Path) -> None:
    """A zip under a .npy name, a header beyond NumPy's limit and a shape claiming more than the file holds: each a
    one-line error (the last before anything of that size is allocated)."""
    np.save(tmp_path / "y.npy", np.array([0, 1]))
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"
    files = {
        "zip.npy": (np.savez, "is a .npz archive: give it as 'path'"),
        "header.npy": (_npy_bytes(header, bytes(48), pad=20_000), "its header is longer than a NumPy file's"),
        "shape.npy": (
            _npy_bytes(header.replace("(2, 3)", "(1000000000000000, 3)"), bytes(48)),
            "its header claims shape (1000000000000000, 3) (24,000,000,000,000,000 bytes), it holds 48",
        ),
    }
    for name, (content, message) in files.items():
        if callable(content):
            content(tmp_path / name, x=np.zeros((2, 3)))
            (tmp_path / f"{name}.npz").rename(tmp_path / name)
        else:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=ONE_LINE) as err:
            load({"name": "arrays", "x": str(tmp_path / name), "y": str(tmp_path / "y.npy")})
        assert message in str(err.value) and name in str(err.value), str(err.value)
    (tmp_path / "ok.npy").write_bytes(_npy_bytes(header, np.arange(6.0).tobytes()))  # a padded header is fine
    data = load({"name": "arrays", "x": str(tmp_path / "ok.npy"), "y": str(tmp_path / "y.npy")})
    assert data.x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_an_npz_member_with_a_huge_header_is_named(tmp_path: Path) -> None:
    import zipfile

    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"
    with zipfile.ZipFile(tmp_path / "d.npz", "w") as archive:
        archive.writestr("x.npy", _npy_bytes(header, bytes(48), pad=20_000))
        buffer_y = tmp_path / "y.npy"
        np.save(buffer_y, np.array([0, 1]))
        archive.write(buffer_y, "y.npy")
    with pytest.raises(DataError, match=ONE_LINE) as err:
        load({"name": "arrays", "path": str(tmp_path / "d.npz")})
    assert "array 'x' of" in str(err.value) and "its header is longer than a NumPy file's" in str(err.value)


def test_float32_features_are_shared_not_copied_and_read_only_ones_are_copied() -> None:
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    data = from_arrays(x, [0, 1, 0, 1])
    assert np.shares_memory(data.x.numpy(), x)  # a million clients' features are not held twice
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about a non-writable array: none is handed over
        frozen = from_arrays(x, [0, 1, 0, 1])
    assert not np.shares_memory(frozen.x.numpy(), x) and torch.equal(frozen.x, data.x)
    with pytest.raises(DataError, match="row 2 holds a missing or infinite value"):
        from_arrays(np.array([[0.0, 1.0], [2.0, 3.0], [np.inf, 0.0]], dtype=np.float32), [0, 1, 0])
