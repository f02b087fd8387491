"""The restricted unpickler: CIFAR batches as every Python/NumPy writes them load; nothing else is called."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import pickle
import pickletools
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from fedhet.data.files import read_pickle
from fedhet.data.real import CIFAR10, CIFAR10_BATCHES
from fedhet.data.safe_pickle import ALLOWED_GLOBALS, RefusedGlobal, load_data_pickle
from fedhet.errors import DataError


def cifar_batch(n: int = 3) -> dict[bytes, Any]:
    """A batch laid out as the originals: uint8 (N, 3072) data, a list of int labels, bytes label and names."""
    data = np.arange(n * 3072, dtype=np.int64).reshape(n, 3072).astype(np.uint8)
    return {
        b"batch_label": b"training batch 1 of 5",
        b"labels": [6, 9, 9][:n],
        b"data": data,
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


class Recorder(pickle.Unpickler):
    """Plain unpickling (of pickles these tests made) that notes every module.name the pickle refers to."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(io.BytesIO(raw), encoding="bytes")
        self.names: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add(f"{module}.{name}")
        return super().find_class(module, name)


def globals_named(raw: bytes) -> set[str]:
    """The module.name pairs a pickle refers to."""
    recorder = Recorder(raw)
    recorder.load()
    return recorder.names


def assert_same_batch(out: dict[bytes, Any], batch: dict[bytes, Any]) -> None:
    assert set(out) == set(batch)
    np.testing.assert_array_equal(out[b"data"], batch[b"data"])
    assert out[b"data"].dtype == np.uint8 and out[b"labels"] == batch[b"labels"]
    assert out[b"batch_label"] == batch[b"batch_label"] and out[b"filenames"] == batch[b"filenames"]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_python3_batches_load_at_every_protocol(protocol: int) -> None:
    batch = cifar_batch()
    batch[b"scalar"] = np.int64(7)  # a NumPy scalar, as a re-saved batch might hold
    raw = pickle.dumps(batch, protocol=protocol)
    out = load_data_pickle(raw)
    assert out[b"scalar"] == 7
    del out[b"scalar"], batch[b"scalar"]
    assert_same_batch(out, batch)
    assert globals_named(raw) <= {f"{m}.{n}" for m, n in ALLOWED_GLOBALS}


class Py2Pickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """Writes as Python 2's cPickle did for CIFAR: every str and bytes as a py2 ``str`` (SHORT_BINSTRING /
    BINSTRING), NumPy's array rebuilder under its NumPy 1 name ``numpy.core.multiarray._reconstruct``."""

    dispatch: ClassVar[dict[type, Any]] = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_py2_str(self, obj: str | bytes) -> None:
        data = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + len(data).to_bytes(4, "little") + data)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if getattr(obj, "__name__", "") == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def py2_pickle(obj: object) -> bytes:
    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def test_python2_batch_loads_with_bytes_keys() -> None:
    batch = cifar_batch()
    raw = py2_pickle(batch)
    opcodes = {op.name for op, _, _ in pickletools.genops(raw)}
    assert {"SHORT_BINSTRING", "BINSTRING"} <= opcodes and "BINUNICODE" not in opcodes  # no py3 strings
    assert globals_named(raw) == {"numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"}
    assert_same_batch(load_data_pickle(raw), batch)
    assert load_data_pickle(raw, encoding="latin1")["data"].shape == (3, 3072)  # py2 str → str, as latin-1


def test_python2_batches_load_through_the_cifar10_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHET_SKIP_CHECKSUMS", "1")  # these stand-ins are not the published batches
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate(CIFAR10_BATCHES):
        batch = cifar_batch(2)
        batch[b"labels"] = [i, 9 - i]
        (folder / name).write_bytes(py2_pickle(batch))
    ds = CIFAR10().load(tmp_path)
    assert ds.x.shape == (12, 3, 32, 32) and ds.y.tolist()[:4] == [0, 9, 1, 8]
    pixel = cifar_batch(2)[b"data"][1, 1024 + 5]  # green plane, pixel 5 of the second image
    expected = (pixel / 255 - CIFAR10.mean[1]) / CIFAR10.std[1]
    assert abs(float(ds.x[1, 1, 0, 5]) - expected) < 1e-5


class Payload:
    """An object whose unpickling calls `function(*args)` (what a crafted data_batch_1 would hold)."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.function, self.args


def crafted(marker: Path) -> dict[str, bytes]:
    """Pickles that create `marker` when loaded with plain pickle."""
    shell = Payload(os.system, f"touch '{marker}'")
    evaluated = Payload(builtins.eval, f"open({str(marker)!r}, 'w').close()")
    spawned = Payload(subprocess.check_call, ["touch", str(marker)])
    return {
        "os.system": pickle.dumps({b"data": shell, b"labels": []}, protocol=2),
        "builtins.eval": pickle.dumps({b"data": evaluated, b"labels": []}, protocol=4),
        "subprocess.check_call": pickle.dumps({b"data": spawned, b"labels": []}, protocol=5),
    }


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "subprocess.check_call"])
def test_crafted_pickles_run_nothing(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "marker"
    raw = crafted(marker)[name]
    pickle.loads(raw)  # the payload is live: plain pickle runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(RefusedGlobal):
        load_data_pickle(raw)
    path = tmp_path / "data_batch_1"
    path.write_bytes(raw)
    with pytest.raises(DataError) as err:
        read_pickle(path)
    message = str(err.value)
    assert str(path) in message and "refuses to load" in message and "\n" not in message
    assert ("posix.system" if name == "os.system" else name) in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x02cnumpy\nload\nq\x00X\x05\x00\x00\x00x.npyq\x01\x85q\x02Rq\x03.",  # numpy.load('x.npy')
        b"\x80\x02cnumpy\ntesting\nq\x00.",  # a numpy submodule
        b"\x80\x02cnumpy.testing._private.utils\nrunstring\nq\x00.",
        b"\x80\x02cbuiltins\ngetattr\nq\x00.",
        b"\x80\x02c__builtin__\neval\nq\x00.",  # Python 2 spelling
        b"\x80\x02ccopyreg\n_reconstructor\nq\x00.",
        b"\x80\x02cnumpy.lib.npyio\nload\nq\x00.",
    ],
)
def test_other_globals_are_refused(raw: bytes) -> None:
    with pytest.raises(RefusedGlobal):
        load_data_pickle(raw)


def test_allowed_functions_only_take_their_pickled_arguments() -> None:
    # _reconstruct of a huge array (memory), of a subclass, and _codecs.encode with a codec other than latin-1
    big = b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ\x00\xca\x9a;\x85C\x01b\x87R."
    wrong_class = b"\x80\x02cnumpy.core.multiarray\n_reconstruct\n}K\x00\x85C\x01b\x87R."
    codec = b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x05\x00\x00\x00rot13\x86R."
    ndarray_called = b"\x80\x02cnumpy\nndarray\nJ\x00\xca\x9a;\x85R."  # numpy.ndarray((10**9,))
    for raw in (big, wrong_class, codec, ndarray_called):
        with pytest.raises((pickle.UnpicklingError, TypeError)):
            load_data_pickle(raw)
    assert load_data_pickle(b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00\xc3\xa9X\x06\x00\x00\x00latin1\x86R.") == (
        b"\xe9"
    )


def test_build_cannot_change_the_allowed_functions() -> None:
    before = {key: getattr(target, "__defaults__", None) for key, target in ALLOWED_GLOBALS.items()}
    for module, name in ALLOWED_GLOBALS:
        # BUILD with state (None, {"__defaults__": ("hex",)}) sets that attribute on the object it is handed
        head = f"c{module}\n{name}\n".encode()
        raw = b"\x80\x02" + head + b"N}X\x0c\x00\x00\x00__defaults__X\x03\x00\x00\x00hex\x85s\x86b."
        with contextlib.suppress(AttributeError, TypeError, pickle.UnpicklingError):
            load_data_pickle(raw)  # refused outright (a class, or the ndarray placeholder) is fine too
    assert {key: getattr(target, "__defaults__", None) for key, target in ALLOWED_GLOBALS.items()} == before
    assert load_data_pickle(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00latin1\x86R.") == b"a"
