"""Atomic writes: the target holds its old or its new content, and no temporary file is left on failure."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from fedhet import atomic


def test_write_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    atomic.write_text(target, "old")
    atomic.write_text(target, "néw\n")
    assert target.read_bytes() == "néw\n".encode()
    assert os.listdir(tmp_path) == ["a.txt"]


def test_new_files_follow_the_umask_like_open(tmp_path: Path) -> None:
    atomic.write_text(tmp_path / "a", "x")
    (tmp_path / "b").write_text("x")
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == stat.S_IMODE((tmp_path / "b").stat().st_mode)


def test_full_disk_keeps_the_old_content_and_removes_the_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.txt"
    atomic.write_text(target, "old")
    real = atomic._write_file

    def full(path: Path, data: bytes | bytearray | memoryview) -> None:
        real(path, bytes(data)[:1])  # a part is written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "_write_file", full)
    with pytest.raises(OSError, match="No space left") as info:
        atomic.write_text(target, "new content")
    assert info.value.filename == str(target)  # names the user's file, not the temporary one
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_interrupt_between_write_and_rename_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.txt"
    atomic.write_text(target, "old")

    def interrupted(source: Path, destination: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "_replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_text(target, "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_temporary_names_are_recognised() -> None:
    name = atomic.temp_path(Path("/x/checkpoint.pt")).name
    assert atomic.is_temp_of(name, "checkpoint.pt") and not atomic.is_temp_of(name, "config.yaml")
    assert not atomic.is_temp_of("checkpoint.pt", "checkpoint.pt")


def test_append(tmp_path: Path) -> None:
    atomic.append_bytes(tmp_path / "log", b"a")
    atomic.append_bytes(tmp_path / "log", b"b")
    assert (tmp_path / "log").read_bytes() == b"ab"


def test_a_failed_write_that_names_no_file_is_given_the_targets_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk shows in write() itself, whose OSError names no file; the error then names the user's file."""

    def nameless(path: Path, data: bytes | bytearray | memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "_write_file", nameless)
    monkeypatch.setattr(atomic, "_append", nameless)
    for write in (atomic.write_text, atomic.append_bytes):
        with pytest.raises(OSError, match="No space left") as info:
            write(tmp_path / "m.csv", b"x" if write is atomic.append_bytes else "x")  # type: ignore[operator]
        assert info.value.filename == str(tmp_path / "m.csv")


@pytest.mark.parametrize("hard", [False, True])
def test_what_changes_a_file_in_place_refuses_a_link(tmp_path: Path, hard: bool) -> None:
    """Appending, cutting and reading in place would reach the file a symbolic or hard link leads to (outside the
    run folder): refused in one line, the file untouched. A rename replaces the link itself."""
    outside = tmp_path / "outside.csv"
    outside.write_bytes(b"yours\n")
    folder = tmp_path / "run"
    folder.mkdir()
    link = folder / "metrics.csv"
    os.link(outside, link) if hard else link.symlink_to(outside)
    kind = "hard" if hard else "symbolic"
    for change in (
        lambda: atomic.append_bytes(link, b"row\n"),
        lambda: atomic.truncate(link, 0),
        lambda: atomic.read_plain(link),
        lambda: atomic.refuse_link(link),
    ):
        with pytest.raises(atomic.LinkError, match=f"metrics.csv' is a {kind} link.*never reads or writes") as info:
            change()
        assert "\n" not in str(info.value)
    assert outside.read_bytes() == b"yours\n"
    atomic.write_text(link, "new\n")
    assert outside.read_bytes() == b"yours\n" and link.read_bytes() == b"new\n" and not link.is_symlink()


def test_plain_files_and_missing_ones_pass(tmp_path: Path) -> None:
    atomic.refuse_link(tmp_path / "missing")
    atomic.refuse_link(tmp_path)  # a folder has several names ('.', its entry): not a hard link
    atomic.append_bytes(tmp_path / "log", b"abc")
    atomic.truncate(tmp_path / "log", 1)
    assert atomic.read_plain(tmp_path / "log") == b"a"
