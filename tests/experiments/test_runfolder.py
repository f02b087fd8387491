"""Run folders: one writer at a time, only fedhet's files touched, metrics.csv appended and restorable."""

from __future__ import annotations

import csv
import hashlib
import io
import os
from pathlib import Path

import pytest

from fedhet.atomic import LinkError
from fedhet.experiments.metrics_log import MetricsLog, write_csv
from fedhet.experiments.runfolder import (
    LOCK,
    RUN_FILES,
    FolderLock,
    RunFolder,
    RunFolderError,
    check_new,
    clean_leftovers,
    prepare_new,
    read_marker,
    remove_own_files,
)


def test_a_second_writer_is_refused_until_the_first_ends(tmp_path: Path) -> None:
    first = RunFolder.create(tmp_path / "r", "rounds: 1\n")
    with pytest.raises(RunFolderError, match=rf"in use by another fedhet process \(pid {os.getpid()}\)"):
        RunFolder.open(tmp_path / "r")
    with pytest.raises(RunFolderError, match="in use"):
        prepare_new(tmp_path / "r", overwrite=True)
    first.close()
    with RunFolder.open(tmp_path / "r") as again:
        assert again.read_config() == {"rounds": 1}


def test_new_runs_go_only_into_new_empty_or_fedhet_folders(tmp_path: Path) -> None:
    check_new(tmp_path / "new" / "deeper", overwrite=False)
    (tmp_path / "empty").mkdir()
    check_new(tmp_path / "empty", overwrite=False)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match="not empty and is not a fedhet run folder"):
            check_new(tmp_path / "user", overwrite)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="is a file, not a folder"):
        check_new(tmp_path / "file", overwrite=False)
    with pytest.raises(RunFolderError, match="is a file"):
        check_new(tmp_path / "file" / "run", overwrite=False)
    assert sorted(os.listdir(tmp_path)) == ["empty", "file", "user"]  # the checks wrote nothing


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root may write anywhere")
def test_unwritable_parent_is_refused(tmp_path: Path) -> None:  # pragma: no cover - depends on the user
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(RunFolderError, match="not writable"):
        check_new(locked / "run", overwrite=False)


def test_overwrite_removes_fedhets_files_only(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with RunFolder.create(out, "rounds: 1\n") as folder:
        folder.write_summary({"status": "finished"})
        folder.plugin_files.append("contribution.csv")
        folder.write_summary({"status": "finished"})
    for name in ("checkpoint.pt", "clients.csv", "availability.npz", "contribution.csv", ".checkpoint.pt.1.tmp"):
        (out / name).write_text("fedhet's")
    (out / "notes.txt").write_text("mine")
    (out / "figures").mkdir()
    (out / "figures" / "mine.png").write_text("mine")
    (out / "node-state").mkdir()
    (out / "node-state" / "abc-1.pt").write_text("node")
    with pytest.raises(RunFolderError, match="already holds a run"):
        RunFolder.create(out, "rounds: 2\n")
    with RunFolder.create(out, "rounds: 2\n", overwrite=True) as folder:
        assert sorted(os.listdir(out)) == [LOCK, "config.yaml", "figures", "metrics.csv", "notes.txt"]
        assert folder.read_config() == {"rounds": 2}
    assert (out / "figures" / "mine.png").read_text() == "mine"


def test_summary_cannot_make_overwrite_delete_folders_or_paths_outside(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.yaml").write_text("rounds: 1\n")
    (out / "data").mkdir()
    (out / "data" / "x").write_text("mine")
    (tmp_path / "outside.txt").write_text("mine")
    (out / "summary.json").write_text('{"files": ["data", "../outside.txt", ".fedhet.lock", "/etc/passwd"]}')
    remove_own_files(out)
    assert (out / "data" / "x").is_file() and (tmp_path / "outside.txt").is_file()


def test_leftovers_of_a_killed_process_are_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".checkpoint.pt.ab12.tmp").write_text("half")
    (tmp_path / ".fedhet-staging-x").mkdir()
    (tmp_path / ".fedhet-staging-x" / "contribution.csv").write_text("half")
    (tmp_path / "keep.tmp").write_text("user's")
    clean_leftovers(tmp_path)
    assert os.listdir(tmp_path) == ["keep.tmp"]


def test_a_folder_is_fedhets_by_its_marker_never_by_file_names(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    for name in ("config.yaml", "metrics.csv", "summary.json", "checkpoint.pt"):  # the names of a run's files
        (user / name).write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(RunFolderError, match="not empty and is not a fedhet run folder"):
            check_new(user, overwrite)
    with pytest.raises(RunFolderError, match="not a run folder of fedhet's"):
        RunFolder.open(user)
    remove_own_files(user)  # without a marker: nothing is fedhet's
    assert sorted(os.listdir(user)) == ["checkpoint.pt", "config.yaml", "metrics.csv", "summary.json"]
    with RunFolder.create(tmp_path / "run", "rounds: 1\n"):
        marker = read_marker(tmp_path / "run")
        assert marker is not None and marker.kind == "run" and marker.files == RUN_FILES and marker.pid == os.getpid()
    with pytest.raises(RunFolderError, match="is a fedhet run folder, not a sweep folder"):
        FolderLock.claim(tmp_path / "run", "sweep")


def test_overwrite_removes_only_what_the_marker_lists(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with RunFolder.create(out, "rounds: 1\n") as folder:
        folder.record(["extra.csv", "../outside.txt", "/etc/hostname", ".hidden", LOCK, "sub/file.txt"])
    for name in ("extra.csv", "mine.csv", ".hidden"):
        (out / name).write_text("x")
    (out / "sub").mkdir()
    (out / "sub" / "file.txt").write_text("mine")
    (tmp_path / "outside.txt").write_text("mine")
    with RunFolder.create(out, "rounds: 2\n", overwrite=True):
        pass
    assert sorted(os.listdir(out)) == sorted([".hidden", LOCK, "config.yaml", "metrics.csv", "mine.csv", "sub"])
    assert (out / "sub" / "file.txt").is_file() and (tmp_path / "outside.txt").is_file()


def test_overwrite_with_a_marker_that_lists_nothing_removes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with RunFolder.create(out, "rounds: 1\n"):
        pass
    (out / LOCK).write_text('{"fedhet": "run", "pid": null, "files": []}\n')
    for name in ("best.pt", "availability.npz", "summary.json", "clients.csv"):
        (out / name).write_text("mine")
    with RunFolder.create(out, "rounds: 2\n", overwrite=True) as folder:
        assert folder.read_config() == {"rounds": 2}
    for name in ("best.pt", "availability.npz", "summary.json", "clients.csv"):
        assert (out / name).read_text() == "mine", name


@pytest.mark.parametrize("name", ["metrics.csv", "checkpoint.pt", "config.yaml", "plugin.csv", LOCK])
def test_a_run_folder_whose_files_are_links_is_not_opened(tmp_path: Path, name: str) -> None:
    out = tmp_path / "r"
    with RunFolder.create(out, "rounds: 1\n") as folder:
        folder.record(["plugin.csv"])
        folder.write_checkpoint({"round": 1})
    (out / "plugin.csv").write_text("x")
    os.link(out / name, tmp_path / "elsewhere")  # a hard link: the same file under a name outside the folder
    before = (tmp_path / "elsewhere").read_bytes()
    with pytest.raises(LinkError, match=f"'{out / name}' is a hard link"):
        RunFolder.open(out)
    (out / name).unlink()
    (out / name).symlink_to(tmp_path / "elsewhere")
    if name == LOCK:  # a marker that is a symbolic link is no marker
        with pytest.raises(RunFolderError, match="not a run folder of fedhet's"):
            RunFolder.open(out)
    else:
        with pytest.raises(LinkError, match=f"'{out / name}' is a symbolic link"):
            RunFolder.open(out)
    assert (tmp_path / "elsewhere").read_bytes() == before


def test_a_hard_linked_marker_is_not_claimed(tmp_path: Path) -> None:
    with RunFolder.create(tmp_path / "r", "rounds: 1\n"):
        pass
    os.link(tmp_path / "r" / LOCK, tmp_path / "other.lock")
    before = (tmp_path / "other.lock").read_bytes()
    with pytest.raises(LinkError, match="is a hard link"):
        FolderLock.claim(tmp_path / "r", "run", ["more.csv"])
    assert (tmp_path / "other.lock").read_bytes() == before


def test_a_marker_that_is_a_link_is_neither_trusted_nor_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    with RunFolder.create(elsewhere, "rounds: 1\n"):
        pass
    before = (elsewhere / LOCK).read_bytes()
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "config.yaml").write_text("rounds: 1\n")
    (tmp_path / "u" / LOCK).symlink_to(elsewhere / LOCK)
    assert read_marker(tmp_path / "u") is None
    with pytest.raises(RunFolderError, match="not a run folder of fedhet's"):
        RunFolder.open(tmp_path / "u")
    with pytest.raises(RunFolderError, match="not a fedhet run folder"):
        RunFolder.create(tmp_path / "u", "rounds: 2\n", overwrite=True)
    assert (elsewhere / LOCK).read_bytes() == before and (tmp_path / "u" / "config.yaml").read_text() == "rounds: 1\n"


def test_a_claim_cut_short_leaves_a_folder_that_counts_as_empty(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / LOCK).write_bytes(b"")  # killed between creating the lock file and writing the marker
    with RunFolder.create(tmp_path / "r", "rounds: 1\n"):
        pass
    assert read_marker(tmp_path / "r") is not None


def test_a_marker_written_over_a_longer_one_is_still_read(tmp_path: Path) -> None:
    with RunFolder.create(tmp_path / "r", "rounds: 1\n") as folder:
        folder.record([f"plugin-{i}.csv" for i in range(20)])
    data = (tmp_path / "r" / LOCK).read_bytes()
    short = b'{"fedhet": "run", "pid": 1, "files": []}\n'
    (tmp_path / "r" / LOCK).write_bytes(short + data[len(short) :])  # killed between the write and the truncation
    marker = read_marker(tmp_path / "r")
    assert marker is not None and marker.kind == "run" and marker.files == () and marker.pid == 1


def test_a_plugin_file_is_listed_in_the_marker_before_it_appears(tmp_path: Path) -> None:
    class Plugin:
        def save(self, out: Path) -> None:
            (out / "contribution.csv").write_text("1\n")

    class Folders:
        def save(self, out: Path) -> None:
            (out / "figures").mkdir()

    with RunFolder.create(tmp_path / "r", "rounds: 1\n") as folder:
        folder.save_plugin_files([Plugin()])
        marker = read_marker(tmp_path / "r")
        assert marker is not None and "contribution.csv" in marker.files
        with pytest.raises(RunFolderError, match="wrote 'figures', which is not a plain file"):
            folder.save_plugin_files([Folders()])
    assert not (tmp_path / "r" / "figures").exists()


ROWS = [
    {"round": 1.0, "acc": 0.5, "loss": float("nan")},
    {"round": 2.0, "acc": -0.0, "loss": 1e-300},
    {"round": 3.0, "acc": 0.25, "loss": 2.0, "extra": 1e20},  # a new column: the file is rewritten
    {"round": 4.0, "loss": 3.0},  # a missing column: left empty
]


def _mark(log: MetricsLog) -> tuple[list[str], int, str]:
    return list(log.columns), len(log.rows), log.sha256()


def test_metrics_log_equals_a_whole_write_and_restores_exactly(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.csv")
    log.start()
    marks = [_mark(log)]
    for row in ROWS:
        log.append(row)
        marks.append(_mark(log))
        data = (tmp_path / "metrics.csv").read_bytes()
        assert log.size == len(data) and log.sha256() == hashlib.sha256(data).hexdigest()
    write_csv(tmp_path / "whole.csv", ROWS)
    whole = (tmp_path / "whole.csv").read_bytes()
    assert (tmp_path / "metrics.csv").read_bytes() == whole
    assert "-0.0" in whole.decode()  # the sign of zero survives a resume
    table = list(csv.DictReader(io.StringIO(whole.decode())))
    assert table[3]["acc"] == "" and table[2]["extra"] == "1e+20"

    (tmp_path / "metrics.csv").open("ab").write(b"5,0.9,half a ro")  # a killed append
    for done, mark in enumerate(marks):  # a checkpoint after any round; the header was widened after round 2
        again = MetricsLog(tmp_path / "metrics.csv")
        rows = again.restore(*mark)
        assert [r["round"] for r in rows] == [r["round"] for r in ROWS[:done]]
        if done >= 2:
            assert str(rows[1]["acc"]) == "-0.0" and rows[1]["loss"] == 1e-300 and rows[0]["loss"] != rows[0]["loss"]
        write_csv(tmp_path / "prefix.csv", ROWS[:done])
        expected = (tmp_path / "prefix.csv").read_bytes() if done else b""
        assert (tmp_path / "metrics.csv").read_bytes() == expected
        for row in ROWS[done:]:
            again.append(row)
        assert (tmp_path / "metrics.csv").read_bytes() == whole


def test_metrics_log_refuses_an_edited_file(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.csv")
    log.start()
    log.append(ROWS[0])
    mark = _mark(log)
    data = (tmp_path / "metrics.csv").read_bytes()
    (tmp_path / "metrics.csv").write_bytes(data.replace(b"0.5", b"0.9"))
    with pytest.raises(ValueError, match="changed"):
        MetricsLog(tmp_path / "metrics.csv").restore(*mark)
    (tmp_path / "metrics.csv").write_text("")
    with pytest.raises(ValueError, match="fewer rows than the checkpoint's 1"):
        MetricsLog(tmp_path / "metrics.csv").restore(*mark)
    (tmp_path / "metrics.csv").write_bytes(b"\xff\xfe\r\n\x00\r\n")
    with pytest.raises(ValueError, match="changed"):
        MetricsLog(tmp_path / "metrics.csv").restore(*mark)
