"""Files already on disk are checked against their published digests once, and the result is remembered."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from fedhet.data import checksums
from fedhet.data.checksums import RECORD, SKIP_ENV, KnownFile, digests, remember, verify, verify_known
from fedhet.data.files import RemoteFile, extract_tar, fetch
from fedhet.errors import DataError

CONTENT = b"published dataset bytes\n" * 100
MD5 = hashlib.md5(CONTENT).hexdigest()
SHA = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture(autouse=True)
def checks_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SKIP_ENV, raising=False)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files hashed (through `checksums.digests`) during the test."""
    calls: list[str] = []

    def counting(path: Path, algorithms: object = checksums.ALGORITHMS) -> dict[str, str]:
        calls.append(path.name)
        return digests(path, algorithms)  # type: ignore[arg-type]

    monkeypatch.setattr(checksums, "digests", counting)
    return calls


def record(folder: Path) -> dict[str, dict[str, object]]:
    files: dict[str, dict[str, object]] = json.loads((folder / RECORD).read_text())["files"]
    return files


def test_digests_in_one_pass(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(CONTENT)
    assert digests(tmp_path / "f") == {"md5": MD5, "sha256": SHA}
    assert digests(tmp_path / "f", ["sha256"]) == {"sha256": SHA}


def test_verified_once_then_remembered(tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "adult.data"
    path.write_bytes(CONTENT)
    verify(path, md5=MD5.upper(), sha256=SHA)  # published digests may be upper case
    assert counted == ["adult.data"]
    stat = path.stat()
    assert record(tmp_path) == {
        "adult.data": {"size": len(CONTENT), "mtime_ns": stat.st_mtime_ns, "md5": MD5, "sha256": SHA}
    }
    verify(path, md5=MD5, sha256=SHA)
    verify(path, md5=MD5)
    assert counted == ["adult.data"]  # remembered: not hashed again
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_a_changed_file_is_checked_again(tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(CONTENT)
    verify(path, md5=MD5)
    swapped = CONTENT.replace(b"published", b"tampered!")  # same size, new content, new mtime
    assert len(swapped) == len(CONTENT)
    path.write_bytes(swapped)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(DataError) as err:
        verify(path, md5=MD5)
    message = str(err.value)
    assert str(path) in message and "md5" in message and "\n" not in message
    assert f"expected {MD5[:12]}..." in message and f"found {hashlib.md5(swapped).hexdigest()[:12]}..." in message
    assert "delete it and rerun with --download" in message and SKIP_ENV in message
    assert counted == ["data_batch_1", "data_batch_1"]
    with pytest.raises(DataError):  # the bad digest is remembered too, and still refused
        verify(path, md5=MD5)
    assert counted == ["data_batch_1", "data_batch_1"]
    path.write_bytes(CONTENT + b"more")  # another size
    with pytest.raises(DataError):
        verify(path, md5=MD5)
    assert len(counted) == 3


def test_a_new_algorithm_is_computed_and_added(tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "f"
    path.write_bytes(CONTENT)
    verify(path, md5=MD5)
    verify(path, md5=MD5, sha256=SHA)
    assert record(tmp_path)["f"]["sha256"] == SHA and record(tmp_path)["f"]["md5"] == MD5
    with pytest.raises(DataError, match="sha256"):
        verify(path, sha256="0" * 64)
    assert len(counted) == 2


def test_nothing_to_check_without_known_digests(tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "users_own.csv"
    path.write_bytes(b"anything")
    verify(path)
    verify_known(path, [KnownFile("other", md5=MD5), RemoteFile("x", "https://x/x", md5=MD5)])
    assert counted == [] and not (tmp_path / RECORD).exists()
    with pytest.raises(DataError):
        verify_known(path, [KnownFile("users_own.csv", md5=MD5)])


@pytest.mark.parametrize(
    "garbage",
    [b"", b"not json", b"[1, 2]", b'{"version": 2, "files": {}}', b'{"version": 1, "files": []}', b"[" * 100_000],
)
def test_an_unusable_record_is_ignored_and_replaced(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "f"
    path.write_bytes(CONTENT)
    (tmp_path / RECORD).write_bytes(garbage)
    verify(path, md5=MD5)
    assert record(tmp_path)["f"]["md5"] == MD5


def test_a_forged_entry_for_other_bytes_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"other bytes")
    stat = path.stat()
    entry = {"size": stat.st_size + 1, "mtime_ns": stat.st_mtime_ns, "md5": MD5}  # an older file's entry
    (tmp_path / RECORD).write_text(json.dumps({"version": 1, "files": {"f": entry}}))
    with pytest.raises(DataError, match="md5"):
        verify(path, md5=MD5)


def test_a_folder_that_cannot_hold_the_record(tmp_path: Path, counted: list[str]) -> None:
    path = tmp_path / "f"
    path.write_bytes(CONTENT)
    (tmp_path / RECORD).mkdir()  # neither readable nor replaceable: verified each time, no error
    verify(path, md5=MD5)
    verify(path, md5=MD5)
    assert counted == ["f", "f"] and (tmp_path / RECORD).is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD, "f"]
    remember(tmp_path / "missing", {"md5": MD5})  # nothing to stat: silently nothing


def test_skip_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a fixture under an official name")
    monkeypatch.setenv(SKIP_ENV, "1")
    verify(path, md5=MD5)
    monkeypatch.setenv(SKIP_ENV, "0")
    with pytest.raises(DataError):
        verify(path, md5=MD5)


def test_fetch_checks_a_file_already_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHET_MIRROR", "http://127.0.0.1:9/nothing")  # any download attempt would fail
    remote = RemoteFile("cifar-10-python.tar.gz", "https://example.invalid/cifar-10-python.tar.gz", md5=MD5)
    (tmp_path / remote.filename).write_bytes(CONTENT)
    assert fetch(remote, tmp_path) == tmp_path / remote.filename
    (tmp_path / remote.filename).write_bytes(b"a pre-placed archive that is not the official one")
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz' failed its md5 check"):
        fetch(remote, tmp_path)
    assert (tmp_path / remote.filename).exists()  # the user's file is left alone
    (tmp_path / remote.filename).unlink()
    (tmp_path / remote.filename).mkdir()
    with pytest.raises(DataError, match="is a folder"):
        fetch(remote, tmp_path)


def test_an_archive_cannot_bring_its_own_record(tmp_path: Path) -> None:
    forged = json.dumps({"version": 1, "files": {"data_batch_1": {"size": 3, "mtime_ns": 0, "md5": MD5}}}).encode()
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as tar:
        for name, data in (("cifar-10-batches-py/data_batch_1", b"bad"), (f"cifar-10-batches-py/{RECORD}", forged)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    extract_tar(tmp_path / "a.tar.gz", tmp_path / "out")
    folder = tmp_path / "out" / "cifar-10-batches-py"
    assert sorted(p.name for p in folder.iterdir()) == ["data_batch_1"]
    with pytest.raises(DataError, match="md5"):
        verify(folder / "data_batch_1", md5=MD5)
