"""Unpickling the CIFAR python batches without letting the file run code.

A pickle names the functions its loader must call (``GLOBAL`` opcodes); ``pickle.load`` imports and calls any of
them, so a crafted ``data_batch_1`` could run ``os.system``. `load_data_pickle` only resolves the few NumPy
constructors that CIFAR's batches need and refuses every other name before anything is called:

- ``numpy.core.multiarray._reconstruct`` (spelled ``numpy._core.multiarray`` by NumPy 2), ``numpy.ndarray`` and
  ``numpy.dtype``: how NumPy pickles an array (the original batches, written by Python 2, use exactly these);
- ``numpy[._]core.multiarray.scalar`` and ``numpy[._]core.numeric._frombuffer``: a NumPy scalar, and an array
  pickled with protocol 5 (files re-saved by a newer NumPy);
- ``_codecs.encode`` with the latin-1 codec only: how Python 3 writes a ``bytes`` object at protocols 0 to 2.

Everything else the files hold (dicts, lists, tuples, strings, bytes, numbers, booleans, None) needs no global.
"""

from __future__ import annotations

import importlib
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ALLOWED_GLOBALS", "RefusedGlobal", "load_data_pickle"]


def _numpy_function(module: str, name: str) -> Callable[..., Any]:
    """``numpy._core.<module>.<name>`` (NumPy 2), or ``numpy.core.<module>.<name>`` (NumPy 1)."""
    try:
        found: Callable[..., Any] = getattr(importlib.import_module(f"numpy._core.{module}"), name)
    except (ImportError, AttributeError):  # pragma: no cover - NumPy 1.x without the numpy._core alias
        found = getattr(importlib.import_module(f"numpy.core.{module}"), name)
    return found


_RECONSTRUCT = _numpy_function("multiarray", "_reconstruct")
_SCALAR = _numpy_function("multiarray", "scalar")
_FROMBUFFER = _numpy_function("numeric", "_frombuffer")


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a function or class that `load_data_pickle` does not allow."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.qualified = f"{module}.{name}"


_NDARRAY = object()  # stands for numpy.ndarray, which a pickle only passes to _reconstruct (never calls)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """NumPy's ``_reconstruct`` as NumPy pickles calls it: an empty plain ndarray whose data ``__setstate__``
    fills in afterwards (anything else, such as a subclass or a shape that would allocate memory, is refused)."""
    if subtype is not _NDARRAY or not isinstance(shape, tuple) or shape != (0,):
        raise pickle.UnpicklingError("unexpected arguments to numpy's _reconstruct")
    out: np.ndarray = _RECONSTRUCT(np.ndarray, shape, dtype)
    return out


def _latin1(text: Any, encoding: Any) -> bytes:
    """``_codecs.encode(text, "latin1")``: how Python 3 pickles ``bytes`` at protocols 0 to 2."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"unexpected _codecs.encode call with encoding {encoding!r}")
    return text.encode("latin1")


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.multiarray", "scalar"): _SCALAR for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): _FROMBUFFER for core in ("core", "_core")},
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}
"""(module, name) a data pickle may refer to → what stands for it (see the module doc)."""


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        target = ALLOWED_GLOBALS.get((module, name))
        if target is None:
            raise RefusedGlobal(module, name)
        if target is _NDARRAY:
            return target
        # A fresh function each time: a pickle's BUILD opcode can set attributes on what it is handed, and must not
        # be able to change NumPy's or this module's functions for the rest of the process.
        return lambda *args: target(*args)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def load_data_pickle(raw: bytes, encoding: str = "bytes") -> Any:
    """The object pickled in `raw`, built only from plain data and NumPy arrays.

    Python 2 strings come back as ``bytes`` with the default `encoding` (as CIFAR's keys are). Raises
    `RefusedGlobal` when the pickle names anything outside `ALLOWED_GLOBALS` (nothing it names is called), and
    whatever exception a malformed pickle causes otherwise.
    """
    return _DataUnpickler(io.BytesIO(raw), encoding=encoding).load()
