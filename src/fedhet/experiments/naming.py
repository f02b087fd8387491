"""Shell-safe folder names for the labels of runs ("FedProx (μ=0.01)" → "FedProx-mu-0.01").

A run folder's name is typed in shells and scripts; the human label stays in the files the runs are listed in.
"""

from __future__ import annotations

import re
import unicodedata

MAX_LENGTH = 100


def safe_name(label: str) -> str:
    """`label` as a folder name of ASCII letters, digits, ``.``, ``_`` and ``-``: Greek letters spelled out
    (α → alpha, Σ → Sigma), accents dropped, ``×`` → x, every other run of characters → ``-``; at most
    `MAX_LENGTH` characters, never empty and never starting with a dot."""
    words = []
    for char in unicodedata.normalize("NFKD", label):
        name = unicodedata.name(char, "")
        if name.startswith("GREEK SMALL LETTER "):
            char = name.removeprefix("GREEK SMALL LETTER ").split()[0].lower()
        elif name.startswith("GREEK CAPITAL LETTER "):
            char = name.removeprefix("GREEK CAPITAL LETTER ").split()[0].capitalize()
        elif char == "×":
            char = "x"
        words.append(char)
    text = "".join(words).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9._]+", "-", text)
    text = re.sub(r"-{2,}", "-", text).strip("-.")[:MAX_LENGTH].strip("-.")
    return text or "unnamed"
