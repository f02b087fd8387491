"""Real datasets from tiny files written in their standard formats; downloads from a local HTTP server."""

from __future__ import annotations

import builtins
import gzip
import hashlib
import http.server
import io
import json
import pickle
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.data.checksums import RECORD, SKIP_ENV
from fedhet.data.files import RemoteFile, read_idx
from fedhet.data.real import (
    ALL_LETTERS,
    CIFAR10,
    CIFAR10_BATCHES,
    CIFAR100,
    CIFAR100_FILES,
    EMNIST,
    FEMNIST,
    MNIST,
    MNIST_FILES,
    Adult,
    FashionMNIST,
    LeafSyntheticFiles,
    Sent140,
    Shakespeare,
)
from fedhet.data.sources import DATASETS
from fedhet.errors import DataError

# ---------------------------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def fixtures_stand_in_for_official_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny files these tests write under the official names cannot match the published checksums: use them
    unchecked, as FEDHET_SKIP_CHECKSUMS=1 allows (downloads are verified all the same). Checksum tests undo it."""
    monkeypatch.setenv(SKIP_ENV, "1")


def listing(folder: Path) -> list[str]:
    """The files in `folder`, without fedhet's checksum record."""
    return sorted(p.name for p in folder.iterdir() if p.name != RECORD)


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def idx_names(prefix: str = "") -> list[str]:
    if not prefix:
        return list(MNIST_FILES)
    return [f"{prefix}-{p}-{k}-ubyte" for p in ("train", "test") for k in ("images-idx3", "labels-idx1")]


def write_mnist(
    folder: Path, n_train: int = 5, n_test: int = 3, compress: bool = False, prefix: str = "", first_label: int = 0
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = idx_names(prefix)
    write_idx(folder / names[0], rng.integers(0, 256, (n_train, 28, 28)), compress)
    write_idx(folder / names[1], first_label + np.arange(n_train) % 10, compress)
    write_idx(folder / names[2], rng.integers(0, 256, (n_test, 28, 28)), compress)
    write_idx(folder / names[3], first_label + (np.arange(n_test) + 1) % 10, compress)


def write_cifar(folder: Path, per_batch: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(CIFAR10_BATCHES):
        data = np.zeros((per_batch, 3072), dtype=np.uint8)
        data[:, :1024], data[:, 1024:2048], data[:, 2048:] = 0, 128, 255  # R, G, B planes
        batch = {b"data": data, b"labels": [i % 10, 9 - i % 10][:per_batch], b"batch_label": name.encode()}
        (folder / name).write_bytes(pickle.dumps(batch))


def leaf(folder: Path, users: dict[str, tuple[list[object], list[object]]], part: str = "train") -> None:
    (folder / part).mkdir(parents=True, exist_ok=True)
    payload = {
        "users": list(users),
        "num_samples": [len(v[1]) for v in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    (folder / part / f"{part}_data.json").write_text(json.dumps(payload))


ADULT_ROW = (
    "{age}, State-gov, 77516, {edu}, 13, Never-married, Adm-clerical, Not-in-family, White, {sex}, 2174, 0, 40, "
    "United-States, {label}"
)


def adult_row(age: int | str = 39, edu: str = "Bachelors", sex: str = "Male", label: str = "<=50K") -> str:
    return ADULT_ROW.format(age=age, edu=edu, sex=sex, label=label)


def write_adult(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = [
        adult_row(30, "Bachelors", "Male", "<=50K"),
        adult_row(50, "Doctorate", "Female", ">50K"),
        adult_row(40, "Masters", "Male", "<=50K").replace("State-gov", "?"),
    ]
    (folder / "adult.data").write_text("\n".join(data) + "\n\n")
    test = [
        "|1x3 Cross validator",
        adult_row(60, "Doctorate", "Male", ">50K."),
        adult_row(20, "HS-grad", label="<=50K."),
    ]
    (folder / "adult.test").write_text("\n".join(test) + "\n")


# ---------------------------------------------------------------------------------------------- registry


def test_sources_are_registered_with_one_line_descriptions() -> None:
    names = {
        "mnist",
        "fashion_mnist",
        "emnist",
        "cifar10",
        "cifar100",
        "femnist",
        "shakespeare",
        "sent140",
        "leaf_synthetic",
    }
    assert names | {"adult"} <= set(DATASETS.names())
    for name in [*names, "adult"]:
        cls = DATASETS.get(name)
        assert cls.description and "\n" not in cls.description
        assert DATASETS.build(name).name == name
    assert DATASETS.build({"name": "emnist", "split": "letters"}) == EMNIST(split="letters")


# ---------------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_and_fashion_from_idx(tmp_path: Path, compress: bool) -> None:
    write_mnist(tmp_path / "mnist", compress=compress)
    ds = MNIST().load(tmp_path)
    assert ds.x.shape == (8, 1, 28, 28) and ds.x.dtype == torch.float32 and ds.num_classes == 10
    assert ds.y.dtype == torch.int64 and ds.y.tolist() == [0, 1, 2, 3, 4, 1, 2, 3]
    raw = read_idx(tmp_path / "mnist" / ("train-images-idx3-ubyte" + (".gz" if compress else "")))
    torch.testing.assert_close(ds.x[:5, 0] * 0.3081 + 0.1307, torch.tensor(raw / 255, dtype=torch.float32))
    flat = MNIST(flatten=True).load(tmp_path)
    assert flat.x.shape == (8, 784) and torch.equal(flat.x, ds.x.reshape(8, -1))
    write_mnist(tmp_path / "fashion_mnist", compress=compress)
    fashion = FashionMNIST().load(tmp_path)
    torch.testing.assert_close(fashion.x * 0.3530 + 0.2860, ds.x * 0.3081 + 0.1307)


def test_emnist_is_transposed_and_letters_shift(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    write_mnist(folder, prefix="emnist-letters", first_label=1)
    raw = read_idx(folder / "emnist-letters-train-images-idx3-ubyte")
    ds = EMNIST(split="letters").load(tmp_path)
    upright = torch.tensor(raw[0].T / 255, dtype=torch.float32)
    torch.testing.assert_close(ds.x[0, 0] * 0.3317 + 0.1736, upright)
    assert not torch.allclose(ds.x[0, 0] * 0.3317 + 0.1736, upright.T)
    assert ds.y.tolist() == [0, 1, 2, 3, 4, 1, 2, 3] and ds.num_classes == 26
    write_mnist(folder, prefix="emnist-byclass", compress=True)
    byclass = EMNIST().load(tmp_path)
    assert byclass.num_classes == 62 and byclass.x.shape == (8, 1, 28, 28)
    with pytest.raises(DataError, match="emnist-balanced-train-images-idx3-ubyte"):
        EMNIST(split="balanced").load(tmp_path)


def test_emnist_letters_label_zero_is_rejected(tmp_path: Path) -> None:
    write_mnist(tmp_path / "emnist", prefix="emnist-letters", first_label=0)  # 0 is not a letter label
    with pytest.raises(DataError, match=r"emnist-letters-train-labels-idx1-ubyte.*labels -1\.\.3, expected 0\.\.25"):
        EMNIST(split="letters").load(tmp_path)


def test_missing_and_corrupt_idx(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        MNIST().load(tmp_path)
    message = str(err.value)
    assert "'train-images-idx3-ubyte'" in message and str(tmp_path / "mnist") in message
    assert "MNIST" in message and "--download" in message and "\n" not in message
    write_mnist(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte.*bad magic number"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "mnist")
    path = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte' is truncated"):
        MNIST().load(tmp_path)


def test_idx_shape_mismatches(tmp_path: Path) -> None:
    write_mnist(tmp_path / "mnist")
    write_idx(tmp_path / "mnist" / "t10k-labels-idx1-ubyte", np.zeros(2))  # 3 images, 2 labels
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.*do not belong together"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "mnist")
    write_idx(tmp_path / "mnist" / "train-images-idx3-ubyte", np.zeros((5, 32, 32)))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.*expected \(N, 28, 28\)"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "mnist")
    write_idx(tmp_path / "mnist" / "train-labels-idx1-ubyte", np.full(5, 12))
    with pytest.raises(DataError, match=r"expected 0\.\.9"):
        MNIST().load(tmp_path)


# ---------------------------------------------------------------------------------------------- CIFAR-10


@pytest.mark.parametrize("nested", [True, False])
def test_cifar10_pickles(tmp_path: Path, nested: bool) -> None:
    write_cifar(tmp_path / "cifar10" / "cifar-10-batches-py" if nested else tmp_path / "cifar10")
    ds = CIFAR10().load(tmp_path)
    assert ds.x.shape == (12, 3, 32, 32) and ds.x.dtype == torch.float32 and ds.num_classes == 10
    assert ds.y.dtype == torch.int64 and ds.y.tolist()[:4] == [0, 9, 1, 8]
    for channel, pixel in enumerate((0, 128, 255)):
        expected = (pixel / 255 - CIFAR10.mean[channel]) / CIFAR10.std[channel]
        assert torch.allclose(ds.x[:, channel], torch.tensor(expected, dtype=torch.float32))


def test_cifar10_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"'data_batch_1'.*cifar10.*cifar-10-python\.tar\.gz"):
        CIFAR10().load(tmp_path)
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    write_cifar(folder)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch"):
        CIFAR10().load(tmp_path)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match=r"test_batch.*expected \(N, 3072\)"):
        CIFAR10().load(tmp_path)
    (folder / "test_batch").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}))
    with pytest.raises(DataError, match="1 labels for 2 images"):
        CIFAR10().load(tmp_path)


# ---------------------------------------------------------------------------------------------- CIFAR-100


def write_cifar100(folder: Path, per_file: int = 3) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(CIFAR100_FILES):
        data = np.zeros((per_file, 3072), dtype=np.uint8)
        data[:, :1024], data[:, 1024:2048], data[:, 2048:] = 255, 0, 128  # R, G, B planes
        fine = [(i * 50 + j * 33) % 100 for j in range(per_file)]
        batch = {b"data": data, b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine]}
        (folder / name).write_bytes(pickle.dumps(batch))


@pytest.mark.parametrize("nested", [True, False])
def test_cifar100_pickles(tmp_path: Path, nested: bool) -> None:
    write_cifar100(tmp_path / "cifar100" / "cifar-100-python" if nested else tmp_path / "cifar100")
    ds = CIFAR100().load(tmp_path)
    assert ds.x.shape == (6, 3, 32, 32) and ds.num_classes == 100
    assert ds.y.tolist() == [0, 33, 66, 50, 83, 16]  # fine labels, train then test
    for channel, pixel in enumerate((255, 0, 128)):
        expected = (pixel / 255 - CIFAR100.mean[channel]) / CIFAR100.std[channel]
        assert torch.allclose(ds.x[:, channel], torch.tensor(expected, dtype=torch.float32))


def test_cifar100_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"'train'.*cifar100.*cifar-100-python\.tar\.gz"):
        CIFAR100().load(tmp_path)
    folder = tmp_path / "cifar100" / "cifar-100-python"
    write_cifar100(folder)
    (folder / "test").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match="not a CIFAR-100 file"):
        CIFAR100().load(tmp_path)
    (folder / "test").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [0, 100]}))
    with pytest.raises(DataError, match=r"expected 0\.\.99"):
        CIFAR100().load(tmp_path)


# ---------------------------------------------------------------------------------------------- LEAF


def test_leaf_femnist_merges_train_and_test_by_user(tmp_path: Path) -> None:
    folder = tmp_path / "femnist"
    leaf(folder, {"f_b": ([[0.5] * 784], [3]), "f_a": ([[0.1] * 784, [0.2] * 784], [1, 2])})
    leaf(folder, {"f_a": ([[0.3] * 784], [4]), "f_c": ([[0.9] * 784], [61])}, part="test")
    leaf(folder, {"f_a": ([[0.0] * 784] * 9, [0] * 9)}, part="all_data")  # repeats the samples: ignored
    ds = FEMNIST().load(tmp_path)
    assert ds.x.shape == (5, 1, 28, 28) and ds.x.dtype == torch.float32 and ds.num_classes == 62
    assert ds.users is not None and ds.users.dtype == torch.int64
    assert ds.users.tolist() == [0, 0, 0, 1, 2]  # f_a, f_b, f_c
    assert ds.y.tolist() == [1, 2, 4, 3, 61]
    torch.testing.assert_close(ds.x[:, 0, 0, 0], torch.tensor([0.1, 0.2, 0.3, 0.5, 0.9]))
    leaf(folder, {"f_d": ([[0.5] * 100], [3])}, part="test")
    with pytest.raises(DataError, match=r"test_data\.json.*expected \(N, 784\)"):
        FEMNIST().load(tmp_path)


def test_leaf_without_train_test_folders_reads_every_json(tmp_path: Path) -> None:
    leaf(tmp_path / "leaf_synthetic", {"u1": ([[1.0, 2.0]], [0])}, part="one")
    leaf(tmp_path / "leaf_synthetic", {"u0": ([[3.0, 4.0], [5.0, 6.0]], [4, 1])}, part="two")
    ds = LeafSyntheticFiles().load(tmp_path)
    assert ds.x.dtype == torch.float32 and ds.x.tolist() == [[3.0, 4.0], [5.0, 6.0], [1.0, 2.0]]
    assert ds.num_classes == 5 and ds.y.tolist() == [4, 1, 0]
    assert ds.users is not None and ds.users.tolist() == [0, 0, 1]
    assert LeafSyntheticFiles(num_classes=10).load(tmp_path).num_classes == 10
    with pytest.raises(DataError, match=r"expected 0\.\.2"):
        LeafSyntheticFiles(num_classes=3).load(tmp_path)


def test_shakespeare_characters(tmp_path: Path) -> None:
    assert len(ALL_LETTERS) == 80 and len(set(ALL_LETTERS)) == 80
    line = "To be, or not to be: that is the question.\n" + "é" + "x" * 36
    assert len(line) == 80
    leaf(tmp_path / "shakespeare", {"HAMLET": ([line, "a" * 80], ["W", "\n"]), "ROMEO": (["b" * 80], ["~"])})
    ds = Shakespeare().load(tmp_path)
    assert ds.x.shape == (3, 80) and ds.x.dtype == torch.int64 and ds.num_classes == 80
    assert ds.x[0, :2].tolist() == [ALL_LETTERS.index("T"), ALL_LETTERS.index("o")]
    assert int(ds.x[0, 42]) == ALL_LETTERS.index("\n") and int(ds.x[0, 43]) == ALL_LETTERS.index(" ")  # é → space
    assert ds.y.tolist() == [ALL_LETTERS.index("W"), ALL_LETTERS.index("\n"), ALL_LETTERS.index(" ")]
    assert ds.users is not None and ds.users.tolist() == [0, 0, 1]
    leaf(tmp_path / "shakespeare", {"X": (["short"], ["a"])}, part="test")
    with pytest.raises(DataError, match="80-character"):
        Shakespeare().load(tmp_path)
    (tmp_path / "shakespeare" / "test" / "test_data.json").unlink()
    (tmp_path / "shakespeare" / "train" / "train_data.json").write_text("{broken")
    with pytest.raises(DataError, match="not valid JSON"):
        Shakespeare().load(tmp_path)


def test_leaf_missing_files_explain_how_to_generate_them(tmp_path: Path) -> None:
    for source, script in ((FEMNIST(), "data/femnist/preprocess.sh"), (LeafSyntheticFiles(), "data/synthetic/")):
        with pytest.raises(DataError) as err:
            source.load(tmp_path, download=True)
        message = str(err.value)
        assert script in message and str(tmp_path / source.name) in message and "TalwalkarLab/leaf" in message
    (tmp_path / "femnist").mkdir()
    (tmp_path / "femnist" / "x.json").write_text('{"users": []}')
    with pytest.raises(DataError, match="no 'user_data'"):
        FEMNIST().load(tmp_path)


def test_sent140_with_glove(tmp_path: Path) -> None:
    tweets: list[object] = [["1", "date", "NO_QUERY", "u1", "Good day!"], ["2", "d", "q", "u1", "zzz qqq"], "GOOD good"]
    leaf(tmp_path / "sent140", {"u1": (tweets[:2], [1, 0]), "u0": ([tweets[2]], ["1"])})
    with pytest.raises(DataError) as err:
        Sent140().load(tmp_path)
    assert str(tmp_path / "sent140" / "glove.txt") in str(err.value) and "GloVe" in str(err.value)
    (tmp_path / "sent140" / "glove.txt").write_text("3 2\ngood 1.0 0.0\nday 0.0 1.0\n! 0.5 0.5\nunused 9 9\n")
    ds = Sent140().load(tmp_path)
    # users sorted: u0 first; "good good" → good; "good day !" → mean of three; unknown words → zeros
    torch.testing.assert_close(ds.x, torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]]))
    assert ds.x.dtype == torch.float32 and ds.y.tolist() == [1, 1, 0] and ds.num_classes == 2
    assert ds.users is not None and ds.users.tolist() == [0, 1, 1]
    other = tmp_path / "vectors.txt"
    other.write_text("good 2.0 0.0 0.0\n")
    assert Sent140(glove_file=str(other)).load(tmp_path).x.shape == (3, 3)
    other.write_text("good 2.0 0.0 0.0\nday 1.0\n")
    with pytest.raises(DataError, match=r"vectors\.txt' line 2"):
        Sent140(glove_file=str(other)).load(tmp_path)


# ---------------------------------------------------------------------------------------------- Adult


def test_adult_csv(tmp_path: Path) -> None:
    write_adult(tmp_path / "adult")
    ds = Adult().load(tmp_path)
    assert len(ds) == 4 and ds.num_classes == 2 and ds.x.dtype == torch.float32
    assert ds.y.tolist() == [0, 1, 1, 0]
    assert ds.users is not None and ds.users.tolist() == [0, 1, 1, 0]
    # 6 numeric columns + one-hot: workclass 1, education 3, marital 1, occupation 1, relationship 1, race 1,
    # sex 2, country 1
    assert ds.x.shape == (4, 6 + 11)
    torch.testing.assert_close(ds.x[:, 0].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    ages = torch.tensor([30.0, 50.0, 60.0, 20.0])
    torch.testing.assert_close(ds.x[:, 0], (ages - ages.mean()) / ages.std(unbiased=False))
    assert set(ds.x[:, 6:].unique().tolist()) == {0.0, 1.0} and torch.all(ds.x[:, 6:].sum(1) == 8)


def test_adult_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"'adult\.data'.*UCI"):
        Adult().load(tmp_path)
    write_adult(tmp_path / "adult")
    (tmp_path / "adult" / "adult.test").write_text("1, 2, 3\n")
    with pytest.raises(DataError, match=r"adult\.test' line 1 has 3 fields"):
        Adult().load(tmp_path)
    (tmp_path / "adult" / "adult.test").write_text(adult_row(age="old") + "\n")
    with pytest.raises(DataError, match="'age'"):
        Adult().load(tmp_path)


# ---------------------------------------------------------------------------------------------- downloads


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A local HTTP server serving the returned folder, with FEDHET_MIRROR pointing at it."""
    root = tmp_path / "served"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("FEDHET_MIRROR", f"http://127.0.0.1:{httpd.server_address[1]}/")
    yield root
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def with_digests(table: tuple[RemoteFile, ...], root: Path) -> tuple[RemoteFile, ...]:
    """`table` with the digests of the fixture files in `root` (the real table keeps the official digests)."""
    return tuple(
        r._replace(
            md5=hashlib.md5((root / r.filename).read_bytes()).hexdigest(),
            sha256=hashlib.sha256((root / r.filename).read_bytes()).hexdigest() if r.sha256 else None,
        )
        for r in table
    )


def test_official_tables_are_intact() -> None:
    assert [r.filename for r in MNIST.files] == [f"{f}.gz" for f in MNIST_FILES]
    assert all(r.url.startswith("https://ossci-datasets.s3.amazonaws.com/mnist/") and r.md5 for r in MNIST.files)
    assert all(
        r.url.startswith("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/") for r in FashionMNIST.files
    )
    assert CIFAR10.files[0].md5 == "c58f30108f718f92721af3b95e74349a"
    assert CIFAR100.files[0].md5 == "eb9058c3a382ffc7106e4002c42a8d85"
    assert EMNIST.files[0].url == "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"


def test_mnist_download(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist(mirror, compress=True)
    monkeypatch.setattr(MNIST, "files", with_digests(MNIST.files, mirror))
    ds = MNIST().load(tmp_path / "data", download=True)
    assert len(ds) == 8 and ds.y.tolist() == [0, 1, 2, 3, 4, 1, 2, 3]
    assert listing(tmp_path / "data" / "mnist") == sorted(f"{f}.gz" for f in MNIST_FILES)


def test_download_checksum_mismatch_leaves_nothing(mirror: Path, tmp_path: Path) -> None:
    write_mnist(mirror, compress=True)  # the official md5s do not match these fixture files
    with pytest.raises(DataError, match="md5 check"):
        MNIST().load(tmp_path / "data", download=True)
    assert list((tmp_path / "data" / "mnist").iterdir()) == []


def test_cifar10_download_unpacks_the_tar(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cifar(tmp_path / "src" / "cifar-10-batches-py")
    with tarfile.open(mirror / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(CIFAR10, "files", with_digests(CIFAR10.files, mirror))
    ds = CIFAR10().load(tmp_path / "data", download=True)
    assert ds.x.shape == (12, 3, 32, 32)
    assert (tmp_path / "data" / "cifar10" / "cifar-10-batches-py" / "test_batch").is_file()


def test_emnist_download_unpacks_the_split(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist(tmp_path / "src", prefix="emnist-digits", compress=True)
    write_mnist(tmp_path / "src", prefix="emnist-mnist", compress=True)
    with zipfile.ZipFile(mirror / "gzip.zip", "w") as z:
        for path in sorted((tmp_path / "src").iterdir()):
            z.write(path, f"gzip/{path.name}")
    monkeypatch.setattr(EMNIST, "files", with_digests(EMNIST.files, mirror))
    ds = EMNIST(split="digits").load(tmp_path / "data", download=True)
    assert len(ds) == 8 and ds.num_classes == 10
    folder = tmp_path / "data" / "emnist"
    assert listing(folder) == sorted([f"{n}.gz" for n in idx_names("emnist-digits")] + ["gzip.zip"])
    (mirror / "gzip.zip").unlink()  # a second split comes from the archive already downloaded
    assert len(EMNIST(split="mnist").load(tmp_path / "data", download=True)) == 8


def test_adult_download(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_adult(mirror)
    monkeypatch.setattr(Adult, "files", with_digests(Adult.files, mirror))
    ds = Adult().load(tmp_path / "data", download=True)
    assert len(ds) == 4 and (tmp_path / "data" / "adult" / "adult.test").is_file()


def test_download_error_is_one_line(mirror: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:  # the mirror serves nothing
        Adult().load(tmp_path / "data", download=True)
    assert "adult.data" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------------------------- checksums on disk


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files on disk are checked against the (patched) published digests, as for a user."""
    monkeypatch.delenv(SKIP_ENV)


def test_published_digests_of_files_on_disk() -> None:
    assert [(r.filename, r.md5, r.sha256) for r in Adult.files] == [
        (
            "adult.data",
            "5d7c39d7b8804f071cdd1f2a7c460872",
            "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        ),
        (
            "adult.test",
            "35238206dfdf7f1fe215bbb874adecdc",
            "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
        ),
    ]
    assert [m.filename for m in CIFAR10.members] == list(CIFAR10_BATCHES)
    assert [m.filename for m in CIFAR100.members] == list(CIFAR100_FILES)
    assert all(len(m.md5 or "") == 32 for m in CIFAR10.members + CIFAR100.members)


@pytest.mark.usefixtures("checked")
def test_adult_files_on_disk_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_adult(tmp_path / "adult")
    with pytest.raises(DataError) as err:  # the fixture is not the official adult.data
        Adult().load(tmp_path)
    message = str(err.value)
    assert "adult.data' failed its md5 check (expected 5d7c39d7b880..." in message and "--download" in message
    monkeypatch.setattr(Adult, "files", with_digests(Adult.files, tmp_path / "adult"))
    assert len(Adult().load(tmp_path)) == 4
    record = json.loads((tmp_path / "adult" / RECORD).read_text())["files"]
    assert set(record) == {"adult.data", "adult.test"} and all("sha256" in e for e in record.values())
    with (tmp_path / "adult" / "adult.test").open("a") as f:
        f.write(adult_row(33) + "\n")  # edited after it was checked
    with pytest.raises(DataError, match=r"adult\.test' failed its md5 check"):
        Adult().load(tmp_path)


@pytest.mark.usefixtures("checked")
def test_cifar_batches_on_disk_are_checked_before_unpickling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    write_cifar(folder)
    members = tuple(
        m._replace(md5=hashlib.md5((folder / m.filename).read_bytes()).hexdigest()) for m in CIFAR10.members
    )
    monkeypatch.setattr(CIFAR10, "members", members)
    assert len(CIFAR10().load(tmp_path)) == 12
    marker = tmp_path / "marker"
    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Payload(marker)}))
    with pytest.raises(DataError, match=r"data_batch_3' failed its md5 check"):
        CIFAR10().load(tmp_path)
    assert not marker.exists()


@pytest.mark.usefixtures("checked")
def test_a_pre_placed_archive_is_checked_before_it_is_unpacked(tmp_path: Path) -> None:
    root = tmp_path / "cifar10"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:  # not the official archive
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz' failed its md5 check"):
        CIFAR10().load(tmp_path, download=True)
    assert listing(root) == ["cifar-10-python.tar.gz"]  # nothing unpacked


@pytest.mark.usefixtures("checked")
def test_mnist_gz_files_are_checked_plain_ones_cannot_be(tmp_path: Path) -> None:
    write_mnist(tmp_path / "mnist", compress=True)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz' failed its md5 check"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "plain" / "mnist")  # published digests are of the .gz files only
    assert len(MNIST().load(tmp_path / "plain")) == 8


# ---------------------------------------------------------------------------------------------- bad inputs


class Payload:
    """Unpickling this creates `marker` (with plain pickle)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


def assert_one_line(err: pytest.ExceptionInfo[DataError], *parts: str) -> None:
    message = str(err.value)
    assert "\n" not in message and all(p in message for p in parts), message


def test_crafted_cifar_batch_runs_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "cifar100" / "cifar-100-python"
    write_cifar100(folder)
    marker = tmp_path / "marker"
    (folder / "test").write_bytes(pickle.dumps({b"data": Payload(marker), b"fine_labels": [0]}, protocol=2))
    with pytest.raises(DataError) as err:
        CIFAR100().load(tmp_path)
    assert_one_line(err, str(folder / "test"), "builtin__.exec'", "refuses to load")  # Python 2 spelling at protocol 2
    assert not marker.exists()


def test_bad_cifar_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar10"
    good = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})
    deep = b"\x80\x02}(C\x04data" + b"]" * 100_000 + b"a" * 99_999 + b"C\x06labels]K\x00au."  # 100k nested lists
    cases = {
        "empty": (b"", "not a readable pickle batch"),
        "truncated": (good[:-40], "not a readable pickle batch"),
        "garbage": (bytes(range(256)) * 3, "not a readable pickle batch"),
        "nested": (deep, "not arrays of numbers"),
        "text labels": (
            pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": ["cat"]}),
            "expected integers",
        ),
        "float data": (pickle.dumps({b"data": np.zeros((1, 3072)), b"labels": [0]}), "expected (N, 3072) uint8"),
        "no dict": (pickle.dumps([1, 2]), "not a batch dictionary"),
    }
    for content, message in cases.values():
        write_cifar(folder)
        (folder / "test_batch").write_bytes(content)
        with pytest.raises(DataError) as err:
            CIFAR10().load(tmp_path)
        assert_one_line(err, str(folder / "test_batch"), message)
    write_cifar(folder)
    (folder / "test_batch").unlink()
    (folder / "test_batch").mkdir()
    with pytest.raises(DataError) as err:
        CIFAR10().load(tmp_path)
    assert_one_line(err, "test_batch' is a folder")


def test_bad_idx_files(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    write_mnist(folder)
    header = bytes([0, 0, 0x0D, 3]) + b"".join(int(d).to_bytes(4, "big") for d in (5, 28, 28))
    (folder / "train-images-idx3-ubyte").write_bytes(header + np.full((5, 28, 28), np.nan, ">f4").tobytes())
    with pytest.raises(DataError) as err:
        MNIST().load(tmp_path)
    assert_one_line(err, "train-images-idx3-ubyte' holds float32 pixels", "unsigned bytes")
    write_mnist(folder)
    labels = bytes([0, 0, 0x0D, 1]) + (5).to_bytes(4, "big") + np.full(5, 0.5, ">f4").tobytes()
    (folder / "train-labels-idx1-ubyte").write_bytes(labels)
    with pytest.raises(DataError) as err:
        MNIST().load(tmp_path)
    assert_one_line(err, "train-labels-idx1-ubyte' holds float32 labels, expected integers")
    write_mnist(folder)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    (folder / "t10k-labels-idx1-ubyte").mkdir()
    with pytest.raises(DataError) as err:
        MNIST().load(tmp_path)
    assert_one_line(err, "t10k-labels-idx1-ubyte' is a folder")
    (folder / "t10k-labels-idx1-ubyte").rmdir()
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")  # an empty .gz
    with pytest.raises(DataError) as err:
        MNIST().load(tmp_path)
    assert_one_line(err, "t10k-labels-idx1-ubyte.gz' is not an IDX file")


def test_bad_leaf_files(tmp_path: Path) -> None:
    folder = tmp_path / "leaf_synthetic"
    path = folder / "train" / "train_data.json"
    deep_x = "[" * 100_000 + "]" * 100_000
    cases = {
        "deep": ('{"user_data": {"u": {"x": ' + deep_x + ', "y": [0]}}}', "nested too deeply"),
        "deep inputs": ('{"user_data": {"u": {"x": [' + "[" * 500 + "]" * 500 + '], "y": [0]}}}', "not equal-length"),
        "huge int": ('{"user_data": {"u": {"x": [[1]], "y": [' + "9" * 5000 + "]}}}", "not valid JSON"),
        "huge label": ('{"user_data": {"u": {"x": [[1]], "y": [1e400]}}}', "not integers"),
        "big label": ('{"user_data": {"u": {"x": [[1]], "y": [' + "9" * 40 + "]}}}", "not integers"),
        "overflow": ('{"user_data": {"u": {"x": [[' + "9" * 400 + '.0]], "y": [0]}}}', "NaN or infinite"),
        "nan": ('{"user_data": {"u": {"x": [[NaN, 1]], "y": [0]}}}', "NaN or infinite"),
        "inf": ('{"user_data": {"u": {"x": [[1e39, 1]], "y": [0]}}}', "NaN or infinite"),
        "truncated": ('{"user_data": {"u": {"x": [[1, 2]], "y": [0', "not valid JSON"),
        "empty": ("", "not valid JSON"),
        "no users": ("{}", "no 'user_data'"),
        "label count": ('{"user_data": {"u": {"x": [[1]], "y": [5000000]}}}', "dataset.num_classes"),
    }
    for name, (content, message) in cases.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        with pytest.raises(DataError) as err:
            LeafSyntheticFiles().load(tmp_path)
        assert_one_line(err, message)
        assert name == "label count" or str(path) in str(err.value)
    path.write_bytes('{"user_data": {"Andr\xe9": {"x": [[1]], "y": [0]}}}'.encode("latin1"))
    with pytest.raises(DataError) as err:
        LeafSyntheticFiles().load(tmp_path)
    assert_one_line(err, str(path), "not valid JSON")
    path.unlink()
    (folder / "train" / "folder.json").mkdir()  # a folder named like a JSON file and fedhet's record are skipped
    (folder / "train" / RECORD).write_text('{"version": 1, "files": {}}')
    leaf(folder, {"u": ([[1.0]], [0])}, part="test")
    assert len(LeafSyntheticFiles().load(tmp_path)) == 1


def test_bad_adult_files(tmp_path: Path) -> None:
    folder = tmp_path / "adult"
    good = adult_row() + "\n"
    cases = {
        "latin1": ((good.replace("State-gov", "\xc9tat")).encode("latin1"), "not UTF-8 text (byte 0xc9 at offset 4)"),
        "binary": (bytes(range(256)) * 8, "not UTF-8 text"),
        "truncated": (good.encode() + good[:30].encode(), "line 2 has 4 fields"),
        "nan": (adult_row(age="nan").encode(), "'age'"),
        "inf": (adult_row(age="1e400").encode(), "NaN or infinite"),
        "categories": (
            "\n".join(adult_row(edu=f"E{i}") for i in range(1001)).encode(),
            "1003 different values",  # with adult.data's two
        ),
    }
    for content, message in cases.values():
        write_adult(folder)
        (folder / "adult.test").write_bytes(content)
        with pytest.raises(DataError) as err:
            Adult().load(tmp_path)
        assert_one_line(err, message)
    write_adult(folder)
    (folder / "adult.data").write_bytes(b"")  # an empty file: its rows are missing, the other file's are used
    assert len(Adult().load(tmp_path)) == 2
    (folder / "adult.test").write_bytes(b"")
    with pytest.raises(DataError) as err:
        Adult().load(tmp_path)
    assert_one_line(err, "hold no complete rows")
    (folder / "adult.test").unlink()
    (folder / "adult.test").mkdir()
    with pytest.raises(DataError) as err:
        Adult().load(tmp_path)
    assert_one_line(err, "adult.test' is a folder")


def test_glove_folder(tmp_path: Path) -> None:
    leaf(tmp_path / "sent140", {"u": (["good"], [1])})
    (tmp_path / "sent140" / "glove.txt").mkdir()
    with pytest.raises(DataError) as err:
        Sent140().load(tmp_path)
    assert_one_line(err, "glove.txt' is a folder")
