"""The low-level file readers and the checksummed downloader (a local HTTP server stands in for the internet)."""

from __future__ import annotations

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

from fedhet.data.checksums import RECORD
from fedhet.data.files import (
    RemoteFile,
    download,
    extract_tar,
    extract_zip,
    fetch,
    find,
    mirror_url,
    read_idx,
    read_json,
    read_pickle,
    read_text,
)
from fedhet.errors import DataError


def idx_bytes(array: np.ndarray, type_byte: int = 0x08, dtype: str = "u1") -> bytes:
    header = bytes([0, 0, type_byte, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(dtype).tobytes()


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path: Path, compress: bool) -> None:
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28)).astype(np.uint8)
    payload = idx_bytes(images)
    path = tmp_path / ("images.gz" if compress else "images")
    path.write_bytes(gzip.compress(payload) if compress else payload)
    out = read_idx(path)
    assert out.shape == (5, 28, 28) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, images)


def test_read_idx_big_endian_ints(tmp_path: Path) -> None:
    values = np.array([1, -2, 300000], dtype=np.int32)
    (tmp_path / "ints").write_bytes(idx_bytes(values, 0x0C, ">i4"))
    np.testing.assert_array_equal(read_idx(tmp_path / "ints"), values)


def test_read_idx_corrupt_files(tmp_path: Path) -> None:
    good = idx_bytes(np.zeros((3, 4, 4), dtype=np.uint8))
    cases = {
        "magic": (b"\x01\x02\x03\x04" + good[4:], "bad magic number"),
        "empty": (b"", "bad magic number"),
        "header": (good[:9], "incomplete IDX header"),
        "short": (good[:-5], "truncated"),
        "long": (good + b"xx", "trailing bytes"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=message) as err:
            read_idx(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)
    (tmp_path / "fake.gz").write_bytes(good)  # not gzip data despite its name
    with pytest.raises(DataError, match=r"cannot read .*fake\.gz"):
        read_idx(tmp_path / "fake.gz")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(good)[:-12])  # gzip stream cut short
    with pytest.raises(DataError, match=r"cut\.gz"):
        read_idx(tmp_path / "cut.gz")


def test_find_prefers_plain_then_gz_and_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "b.gz").write_bytes(b"")
    assert find(tmp_path, "b", "hint") == tmp_path / "b.gz"
    (tmp_path / "b").write_bytes(b"")
    assert find(tmp_path, "b", "hint") == tmp_path / "b"
    with pytest.raises(DataError) as err:
        find(tmp_path / "sub", "train-x", "download it from the page")
    message = str(err.value)
    assert "'train-x'" in message and str(tmp_path / "sub") in message and "download it from the page" in message
    assert "train-x.gz" in message
    (tmp_path / "c.gz").write_bytes(b"")  # gz=False: only the exact name will do
    with pytest.raises(DataError, match="missing dataset file 'c' in"):
        find(tmp_path, "c", "hint", gz=False)


def test_read_pickle_and_json_errors(tmp_path: Path) -> None:
    (tmp_path / "batch").write_bytes(pickle.dumps({b"data": [1], b"labels": [0]}))
    assert read_pickle(tmp_path / "batch")[b"labels"] == [0]
    (tmp_path / "garbage").write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(DataError, match=r"garbage.*not a readable pickle"):
        read_pickle(tmp_path / "garbage")
    (tmp_path / "list").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(DataError, match="not a batch dictionary"):
        read_pickle(tmp_path / "list")
    (tmp_path / "a.json").write_text('{"users": []}')
    assert read_json(tmp_path / "a.json") == {"users": []}
    (tmp_path / "b.json").write_text("{broken")
    with pytest.raises(DataError, match=r"b\.json.*not valid JSON"):
        read_json(tmp_path / "b.json")
    (tmp_path / "c.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="JSON object"):
        read_json(tmp_path / "c.json")
    (tmp_path / "t.gz").write_bytes(gzip.compress("héllo".encode()))
    assert read_text(tmp_path / "t.gz") == "héllo"


def test_mirror_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDHET_MIRROR", raising=False)
    url = "https://example.org/a/b/file.tar.gz"
    assert mirror_url(url) == url
    monkeypatch.setenv("FEDHET_MIRROR", "http://127.0.0.1:9/m/")
    assert mirror_url(url) == "http://127.0.0.1:9/m/file.tar.gz"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 serving a temporary folder: (base URL, folder)."""
    root = tmp_path / "served"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_download_verifies_checksums(server: tuple[str, Path], tmp_path: Path) -> None:
    base, root = server
    content = b"fedhet test payload " * 1000
    (root / "file.bin").write_bytes(content)
    sha = hashlib.sha256(content).hexdigest()
    md5 = hashlib.md5(content).hexdigest()
    dest = tmp_path / "out" / "file.bin"
    assert download(f"{base}/file.bin", dest, sha, md5=md5) == dest
    assert dest.read_bytes() == content
    # no temporary file left; the digests checked are remembered, so the first use does not hash the file again
    assert sorted(p.name for p in dest.parent.iterdir()) == [RECORD, "file.bin"]
    entry = json.loads((dest.parent / RECORD).read_text())["files"]["file.bin"]
    assert entry["md5"] == md5 and entry["sha256"] == sha and entry["size"] == len(content)
    assert download(f"{base}/file.bin", tmp_path / "plain" / "file.bin", None).read_bytes() == content


@pytest.mark.parametrize("kind", ["sha256", "md5"])
def test_download_checksum_mismatch_leaves_nothing(server: tuple[str, Path], tmp_path: Path, kind: str) -> None:
    base, root = server
    (root / "file.bin").write_bytes(b"abc")
    dest = tmp_path / "out" / "file.bin"
    digests = {"sha256": "0" * 64} if kind == "sha256" else {"md5": "0" * 32}
    with pytest.raises(DataError, match=f"{kind} check") as err:
        download(f"{base}/file.bin", dest, digests.get("sha256"), md5=digests.get("md5"))
    assert "\n" not in str(err.value)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_download_network_errors(server: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = server
    with pytest.raises(DataError, match=r"cannot download .*missing\.gz.*404"):
        download(f"{base}/missing.gz", tmp_path / "m" / "missing.gz", None, timeout=5)
    assert list((tmp_path / "m").iterdir()) == []
    with pytest.raises(DataError, match="cannot download 'not-a-url'"):
        download("not-a-url", tmp_path / "m" / "x", None)


def test_fetch_uses_the_mirror_and_skips_present_files(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, root = server
    (root / "data.csv").write_bytes(b"1,2\n")
    remote = RemoteFile(
        "data.csv", "https://unreachable.invalid/x/data.csv", sha256=hashlib.sha256(b"1,2\n").hexdigest()
    )
    monkeypatch.setenv("FEDHET_MIRROR", base)
    assert fetch(remote, tmp_path / "d").read_bytes() == b"1,2\n"
    monkeypatch.setenv("FEDHET_MIRROR", "http://127.0.0.1:9/nothing")  # no request is made for a present file
    assert fetch(remote, tmp_path / "d").read_bytes() == b"1,2\n"


def test_extract_archives(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("gzip/wanted.gz", b"w")
        z.writestr("gzip/other.gz", b"o")
    (tmp_path / "a.zip").write_bytes(buffer.getvalue())
    out = tmp_path / "zip_out"
    out.mkdir()
    assert extract_zip(tmp_path / "a.zip", out, ["wanted.gz"]) == [out / "wanted.gz"]
    assert sorted(p.name for p in out.iterdir()) == ["wanted.gz"]
    (tmp_path / "bad.zip").write_bytes(b"PK not really")
    with pytest.raises(DataError, match=r"cannot unpack .*bad\.zip"):
        extract_zip(tmp_path / "bad.zip", out, ["wanted.gz"])

    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("folder/file.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    extract_tar(tmp_path / "a.tar.gz", tmp_path / "tar_out")
    assert (tmp_path / "tar_out" / "folder" / "file.txt").read_bytes() == b"hi"
    (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b broken")
    with pytest.raises(DataError, match=r"cannot unpack .*bad\.tar\.gz"):
        extract_tar(tmp_path / "bad.tar.gz", tmp_path / "tar_out")


# ---------------------------------------------------------------------------------------------- bad inputs


def test_json_that_python_cannot_parse_is_one_line(tmp_path: Path) -> None:
    cases = {
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # json raises RecursionError
        "deep_object.json": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
        "digits.json": (b'{"x": ' + b"7" * 5000 + b"}", "not valid JSON"),  # int over 4300 digits: ValueError
        "cut.json": (b'{"users": ["a", "b"], "user_data": {"a": {"x": [[0.1, 0', "not valid JSON"),
        "empty.json": (b"", "not valid JSON"),
        "latin1.json": ('{"users": ["Andr\xe9"]}'.encode("latin1"), "not valid JSON"),
        "binary.json": (bytes(range(256)) * 4, "not valid JSON"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=message) as err:
            read_json(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)


def test_text_must_be_utf8(tmp_path: Path) -> None:
    (tmp_path / "bom.txt").write_bytes("\ufeffROMEO.\n".encode())
    assert read_text(tmp_path / "bom.txt") == "ROMEO.\n"  # the byte-order mark of Gutenberg's UTF-8 files
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin1"))
    with pytest.raises(DataError) as err:
        read_text(tmp_path / "latin1.txt")
    message = str(err.value)
    assert "latin1.txt' is not UTF-8 text (byte 0xe9 at offset 3)" in message and "iconv" in message
    assert "\n" not in message
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"ok\xff"))
    with pytest.raises(DataError, match=r"bad\.gz' is not UTF-8 text \(byte 0xff at offset 2\)"):
        read_text(tmp_path / "bad.gz")


def test_a_folder_where_a_file_is_expected(tmp_path: Path) -> None:
    (tmp_path / "train-images-idx3-ubyte").mkdir()
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte' is a folder, where a dataset file is expected"):
        find(tmp_path, "train-images-idx3-ubyte", "hint")
    (tmp_path / "t.gz").mkdir()
    with pytest.raises(DataError, match=r"t\.gz' is a folder"):
        find(tmp_path, "t", "hint")
    for reader in (read_idx, read_json, read_pickle, read_text):
        with pytest.raises(DataError, match="is a folder") as err:
            reader(tmp_path / "train-images-idx3-ubyte")
        assert "\n" not in str(err.value)


def test_empty_and_truncated_files(tmp_path: Path) -> None:
    (tmp_path / "empty.gz").write_bytes(b"")
    with pytest.raises(DataError, match="bad magic number none"):
        read_idx(tmp_path / "empty.gz")
    batch = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}, protocol=2)
    for name, content in (("empty", b""), ("cut", batch[: len(batch) // 2]), ("noise", bytes(range(256)))):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match="not a readable pickle batch") as err:
            read_pickle(tmp_path / name)
        assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)


def tar_with(archive: Path, name: str, link: str | None = None) -> Path:
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(name)
        if link is None:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        else:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return archive


def test_tar_members_outside_the_destination_are_refused(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    for archive in (
        tar_with(tmp_path / "up.tar", "../evil.txt"),
        tar_with(tmp_path / "link.tar", "link", link="../../etc/passwd"),
        tar_with(tmp_path / "abslink.tar", "link", link="/etc/passwd"),
    ):
        with pytest.raises(DataError, match=rf"cannot unpack .*{archive.name}") as err:
            extract_tar(archive, dest)
        assert "\n" not in str(err.value)
        assert not (tmp_path / "evil.txt").exists() and not (dest / "link").is_symlink()
    outside = tmp_path / "abs" / "evil.txt"
    extract_tar(tar_with(tmp_path / "abs.tar", str(outside)), dest)  # an absolute name is made relative
    assert not outside.exists() and (dest / str(outside).lstrip("/")).read_bytes() == b"evil"


def test_zip_members_are_written_flat_inside_the_destination(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("../../wanted.gz", b"w")
        z.writestr("/abs/other.gz", b"o")
    (tmp_path / "a.zip").write_bytes(buffer.getvalue())
    dest = tmp_path / "deep" / "dest"
    dest.mkdir(parents=True)
    assert extract_zip(tmp_path / "a.zip", dest, ["wanted.gz", "other.gz"]) == [dest / "wanted.gz", dest / "other.gz"]
    assert sorted(p.name for p in dest.iterdir()) == ["other.gz", "wanted.gz"]
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["dest"]
    assert not (tmp_path / "wanted.gz").exists()
