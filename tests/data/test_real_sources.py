"""Real datasets from small files written in their standard formats; downloads from a local HTTP server."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import pickle
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.data.files import download, read_idx
from fedhet.data.real import (
    CIFAR10,
    EMNIST,
    FEMNIST,
    MNIST,
    MNIST_FILES,
    SHAKESPEARE_LETTERS,
    Adult,
    FashionMNIST,
    Sent140,
    Shakespeare,
)
from fedhet.errors import DataError


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_mnist(folder: Path, n_train: int = 5, n_test: int = 3, compress: bool = False, prefix: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = (
        MNIST_FILES
        if not prefix
        else [f"{prefix}-{p}-{k}-ubyte" for p in ("train", "test") for k in ("images-idx3", "labels-idx1")]
    )
    write_idx(folder / names[0], rng.integers(0, 256, (n_train, 28, 28)), compress)
    write_idx(folder / names[1], np.arange(n_train) % 10, compress)
    write_idx(folder / names[2], rng.integers(0, 256, (n_test, 28, 28)), compress)
    write_idx(folder / names[3], (np.arange(n_test) + 1) % 10, compress)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_and_fashion_from_idx(tmp_path: Path, compress: bool) -> None:
    write_mnist(tmp_path / "mnist", compress=compress)
    ds = MNIST().load(tmp_path)
    assert ds.x.shape == (8, 1, 28, 28) and ds.x.dtype == torch.float32 and ds.num_classes == 10
    assert ds.y.tolist() == [0, 1, 2, 3, 4, 1, 2, 3]
    assert MNIST(flatten=True).load(tmp_path).x.shape == (8, 784)
    write_mnist(tmp_path / "fashion_mnist", compress=compress)
    assert len(FashionMNIST().load(tmp_path)) == 8


def test_emnist_is_transposed_and_letters_shift(tmp_path: Path) -> None:
    folder = tmp_path / "emnist"
    write_mnist(folder, prefix="emnist-letters")
    raw = read_idx(folder / "emnist-letters-train-images-idx3-ubyte")
    ds = EMNIST(split="letters").load(tmp_path)
    first = torch.tensor(raw[0].T.astype(np.float32)) / 255
    torch.testing.assert_close((ds.x[0, 0] * 0.3317 + 0.1736), first, atol=1e-5, rtol=0)
    assert ds.y[:5].tolist() == [-1, 0, 1, 2, 3] and ds.num_classes == 26


def test_missing_and_corrupt_idx(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing dataset file 'train-images-idx3-ubyte' in .*--download"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04garbage")
    with pytest.raises(DataError, match="bad magic number"):
        MNIST().load(tmp_path)
    write_mnist(tmp_path / "mnist")
    path = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError, match="truncated"):
        MNIST().load(tmp_path)


def test_cifar10_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": np.full((2, 3072), 128, dtype=np.uint8), b"labels": [3, 7]}
        (folder / name).write_bytes(pickle.dumps(batch))
    ds = CIFAR10().load(tmp_path)
    assert ds.x.shape == (12, 3, 32, 32) and ds.y.tolist()[:2] == [3, 7]
    expected = (128 / 255 - 0.4914) / 0.2470
    assert abs(float(ds.x[0, 0, 0, 0]) - expected) < 1e-5
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch"):
        CIFAR10().load(tmp_path)


def leaf(folder: Path, users: dict[str, tuple[list[object], list[object]]], part: str = "train") -> None:
    (folder / part).mkdir(parents=True, exist_ok=True)
    payload = {
        "users": list(users),
        "num_samples": [len(v[1]) for v in users.values()],
        "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
    }
    (folder / part / "data.json").write_text(json.dumps(payload))


def test_leaf_femnist_and_shakespeare(tmp_path: Path) -> None:
    leaf(tmp_path / "femnist", {"b": ([[0.5] * 784], [3]), "a": ([[0.1] * 784, [0.2] * 784], [1, 2])})
    leaf(tmp_path / "femnist", {"a": ([[0.3] * 784], [4])}, part="test")
    ds = FEMNIST().load(tmp_path)
    assert ds.x.shape == (4, 1, 28, 28) and ds.users is not None
    assert ds.users.tolist() == [0, 0, 0, 1] and sorted(ds.y[:3].tolist()) == [1, 2, 4] and int(ds.y[3]) == 3
    assert len(SHAKESPEARE_LETTERS) == 80
    leaf(tmp_path / "shakespeare", {"ROMEO": (["a" * 79 + "b"], ["c"])})
    sh = Shakespeare().load(tmp_path)
    assert sh.x.shape == (1, 80) and sh.num_classes == 80
    assert sh.y.tolist() == [SHAKESPEARE_LETTERS.index("c")]
    (tmp_path / "shakespeare" / "train" / "data.json").write_text("{broken")
    with pytest.raises(DataError, match="not valid JSON"):
        Shakespeare().load(tmp_path)
    with pytest.raises(DataError, match="no LEAF JSON"):
        FEMNIST().load(tmp_path / "elsewhere")


def test_sent140_with_glove(tmp_path: Path) -> None:
    leaf(
        tmp_path / "sent140",
        {"u1": ([["id", "date", "q", "user", "Good day"], ["i", "d", "q", "u", "zzz"]], ["1", "0"])},
    )
    with pytest.raises(DataError, match="GloVe"):
        Sent140().load(tmp_path)
    (tmp_path / "sent140" / "glove.txt").write_text("good 1.0 0.0\nday 0.0 1.0\n")
    ds = Sent140().load(tmp_path)
    torch.testing.assert_close(ds.x, torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    assert ds.y.tolist() == [1, 0]


def test_adult_csv(tmp_path: Path) -> None:
    folder = tmp_path / "adult"
    folder.mkdir()
    row = (
        "39, State-gov, 77516, {edu}, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, "
        "United-States, {label}"
    )
    (folder / "adult.data").write_text(
        "\n".join(
            [
                row.format(edu="Bachelors", label="<=50K"),
                row.format(edu="Doctorate", label=">50K"),
                row.replace("State-gov", "?").format(edu="Masters", label="<=50K"),
            ]
        )
    )
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + row.format(edu="Doctorate", label=">50K."))
    ds = Adult().load(tmp_path)
    assert len(ds) == 3 and ds.y.tolist() == [0, 1, 1]
    assert ds.users is not None and ds.users.tolist() == [0, 1, 1]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


def test_download_from_a_local_mirror_and_checksum(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, root = server
    write_mnist(root, compress=True)
    monkeypatch.setenv("FEDHET_MIRROR", base)
    md5 = {f: hashlib.md5((root / f"{f}.gz").read_bytes()).hexdigest() for f in MNIST_FILES}
    monkeypatch.setattr(MNIST, "md5", md5)
    ds = MNIST().load(tmp_path / "data", download=True)
    assert len(ds) == 8 and (tmp_path / "data" / "mnist" / "train-images-idx3-ubyte.gz").is_file()
    dest = tmp_path / "bad" / "x.gz"
    with pytest.raises(DataError, match="md5 check"):
        download(f"{base}/train-images-idx3-ubyte.gz", dest, md5="0" * 32)
    assert not dest.exists() and not list(dest.parent.glob("*.part"))
    with pytest.raises(DataError, match="cannot download"):
        download(f"{base}/missing.gz", tmp_path / "m" / "missing.gz")
