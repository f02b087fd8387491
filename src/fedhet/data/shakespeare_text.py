"""Shakespeare by speaking role, built from a plain-text copy of the Complete Works (Project Gutenberg eBook #100).

The LEAF ``shakespeare`` source needs LEAF's preprocessed JSON; this one reads the text itself, as LEAF's
preprocessing does (Caldas et al. 2018; used by q-FFL and FedMGDA+ §6.1.3 with 31 roles): each speaking role of
each play is one user, and a user's samples are the 80-character windows of its concatenated lines, labelled
with the next character, in LEAF's 80-symbol vocabulary (`fedhet.data.real.ALL_LETTERS`; other characters map
to the space, typographic quotes to ASCII ones).

Both layouts of the Gutenberg file are understood:

- the older one (the file LEAF used): a speech opens with the role name, indented by two spaces, then a full
  stop and the first line (``  ROMEO. But soft! ...``); later lines are indented further;
- the current one: the role name in capitals alone on a line (``ROMEO.``), then the speech lines.

A speech ends at a blank line. Stage directions are dropped (``[...]`` spans, and lines that open with Enter,
Exit, Exeunt, Re-enter or Manet); ``ACT``/``SCENE`` headings are not roles. Plays end at a line ``THE END``
(with ``by_play``, roles are per play, as in LEAF; a file without such lines is one play). Only the text between
Gutenberg's ``*** START`` and ``*** END`` markers is read when they are present. The file must be UTF-8 (plain
ASCII is UTF-8; a byte-order mark is dropped): a latin-1 copy gets a DataError saying how to convert it.

Choices of ours: a role's lines are joined with single spaces; windows start every ``stride`` characters
(LEAF: 1); a role with more than ``max_samples_per_role`` windows keeps that many, evenly spaced (bounds memory:
each window is 80 int64 tokens); roles with fewer than ``min_chars`` characters are dropped. Roles are numbered in
(play, name) order; ``Dataset.users`` holds each window's role, for the ``natural`` partitioner.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.files import not_a_file, read_text
from fedhet.data.real import ALL_LETTERS, encode_chars
from fedhet.data.sources import DATASETS, DatasetSource, random_dataset
from fedhet.errors import DataError

__all__ = ["ShakespeareText", "parse_roles", "role_windows"]

CANDIDATES = ("pg100.txt", "100.txt", "100-0.txt", "shakespeare.txt", "complete_works.txt", "t8.shakespeare.txt")
_WORD = r"(?:[A-Z][A-Za-z'\-]*|of|de|du|le|la|and)"
_INLINE = re.compile(rf"^  ({_WORD}(?: {_WORD}){{0,3}})\. +(\S.*)$")  # old layout: "  ROMEO. text"
_ALONE = re.compile(r"^([A-Z][A-Z'\-]*(?: [A-Z'\-]+){0,3})\.$")  # current layout: "ROMEO."
_STAGE = ("Enter", "Exit", "Exeunt", "Re-enter", "Manet", "ENTER", "EXIT", "EXEUNT")
_NOT_ROLES = ("ACT", "SCENE", "Act", "Scene", "THE", "The")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-"})


def _drop_brackets(line: str) -> str:
    """`line` with every ``[...]`` span replaced by a space: ``re.sub(r"\\[[^\\]]*\\]", " ", line)`` in linear
    time (that regular expression takes quadratic time on a line of many unclosed ``[``)."""
    parts, i = [], 0
    while (start := line.find("[", i)) >= 0 and (end := line.find("]", start)) >= 0:
        parts += [line[i:start], " "]
        i = end + 1
    parts.append(line[i:])
    return "".join(parts)


def _is_stage(line: str) -> bool:
    """A stage direction such as "Enter Romeo." or "Exeunt." (first word Enter, Exit, ...)."""
    return line.split(" ")[0].rstrip(".,;") in _STAGE


def _body(text: str) -> str:
    """The text between Gutenberg's ``*** START OF`` and ``*** END OF`` lines (all of it without them)."""
    start = re.search(r"^\*\*\* ?START OF.*$", text, flags=re.MULTILINE)
    end = re.search(r"^\*\*\* ?END OF.*$", text, flags=re.MULTILINE)
    lo = start.end() if start else 0
    hi = end.start() if end and end.start() > lo else len(text)
    return text[lo:hi]


def parse_roles(text: str, by_play: bool = True) -> dict[tuple[int, str], str]:
    """Every role's lines joined by spaces, keyed by (play number, ROLE NAME in capitals)."""
    lines: dict[tuple[int, str], list[str]] = {}
    play, speaker = 0, None
    for raw in _body(text.translate(_QUOTES)).splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            speaker = None
            continue
        if stripped == "THE END":
            play, speaker = (play + 1 if by_play else play), None
            continue
        inline, alone = _INLINE.match(line), _ALONE.match(line)
        name, first = None, ""
        if inline and inline.group(1).split(" ")[0] not in _STAGE + _NOT_ROLES:
            name, first = inline.group(1), inline.group(2)
        elif alone and alone.group(1).split(" ")[0] not in _NOT_ROLES:
            name = alone.group(1)
        if name is not None:
            speaker = (play, name.upper())
            stripped = first.strip()
        if speaker is None or not stripped:
            continue
        spoken = _drop_brackets(stripped).strip()
        if spoken and not _is_stage(spoken):
            lines.setdefault(speaker, []).append(spoken)
    return {role: re.sub(r"\s+", " ", " ".join(parts)).strip() for role, parts in lines.items()}


def role_windows(
    tokens: np.ndarray, seq_len: int, stride: int, max_samples: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(windows (N, seq_len), next token (N,)) of one role's token sequence."""
    count = max(0, (len(tokens) - seq_len - 1) // stride + 1) if len(tokens) > seq_len else 0
    starts = np.arange(count) * stride
    if max_samples is not None and count > max_samples:
        starts = starts[np.unique(np.linspace(0, count - 1, max_samples).round().astype(np.int64))]
    index = starts[:, None] + np.arange(seq_len)[None, :]
    return tokens[index], tokens[starts + seq_len]


@DATASETS.register
class ShakespeareText(DatasetSource):
    """Next-character prediction by speaking role, from the plain-text Complete Works (see the module doc)."""

    name: ClassVar[str] = "shakespeare_text"
    description: ClassVar[str] = (
        "Shakespeare next character by speaking role, from the Gutenberg plain text (80 symbols)"
    )
    file: str | None = Field(None, description="the text file (default: pg100.txt or 100.txt in data_dir/<name>/)")
    seq_len: int = Field(80, ge=1, description="characters per input window")
    stride: int = Field(1, ge=1, description="characters between two window starts")
    max_samples_per_role: int | None = Field(4000, ge=1, description="keep at most this many windows per role")
    min_chars: int = Field(0, ge=0, description="drop roles with fewer characters")
    by_play: bool = Field(True, description="one user per (play, role) rather than per role name")

    def _path(self, data_dir: Path) -> Path:
        if self.file is not None:
            path = Path(self.file)
            if path.exists() and not path.is_file():
                raise not_a_file(path)
            if not path.is_file():
                raise DataError(f"shakespeare_text: file '{path}' does not exist")
            return path
        folder = data_dir / self.name
        for name in CANDIDATES:
            if (folder / name).is_file():
                return folder / name
        found = sorted(folder.glob("*.txt")) if folder.is_dir() else []
        if len(found) == 1:
            return found[0]
        raise DataError(
            f"missing dataset file: no Complete Works text in '{folder}'; save Project Gutenberg eBook #100 "
            f"(plain text UTF-8) there as pg100.txt, or pass --set dataset.file=PATH"
        )

    def stand_in(self, scale: float = 1.0) -> Dataset:
        """Random windows for ``--estimate``: about 1,000 roles (by play) of at most `max_samples_per_role` each
        (4,000 without a cap; most roles speak fewer characters, so this errs on the large side)."""
        per_role = min(self.max_samples_per_role or 4000, 4000)
        return random_dataset(
            self.name,
            1000 * per_role,
            (self.seq_len,),
            len(ALL_LETTERS),
            scale,
            users=1000,
            vocabulary=len(ALL_LETTERS),
        )

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        path = self._path(data_dir)
        roles = parse_roles(read_text(path), self.by_play)
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        for role in sorted(roles):
            text = roles[role]
            if len(text) < max(self.min_chars, self.seq_len + 1):
                continue
            x, y = role_windows(encode_chars([text]), self.seq_len, self.stride, self.max_samples_per_role)
            xs.append(x)
            ys.append(y)
            owners.append(np.full(len(y), len(owners), dtype=np.int64))
        if not xs:
            raise DataError(
                f"'{path}' yields no speaking role with more than {max(self.min_chars, self.seq_len)} characters; "
                "is it the Complete Works of Shakespeare?"
            )
        return Dataset(
            self.name,
            torch.from_numpy(np.concatenate(xs).astype(np.int64)),
            torch.from_numpy(np.concatenate(ys).astype(np.int64)),
            len(ALL_LETTERS),
            torch.from_numpy(np.concatenate(owners)),
        )
