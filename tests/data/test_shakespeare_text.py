"""Shakespeare by speaking role from the plain-text Complete Works (both Gutenberg layouts)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedhet.data.federate import federate
from fedhet.data.partition import PARTITIONERS
from fedhet.data.real import ALL_LETTERS
from fedhet.data.shakespeare_text import ShakespeareText, _drop_brackets, parse_roles, role_windows
from fedhet.errors import DataError

OLD = """The Project Gutenberg EBook of The Complete Works of William Shakespeare
*** START OF THIS PROJECT GUTENBERG EBOOK COMPLETE WORKS ***
THE SONNETS
  From fairest creatures we desire increase,

ACT I. SCENE I.
Verona. A public place.

  Enter Sampson and Gregory, with swords and bucklers.

  SAMPSON. Gregory, on my word, we'll not carry coals.
  GREGORY. No, for then we should be colliers.
  SAMPSON. I mean, an we be in choler, we'll draw.
    Draw thy tool! [Draws] Here comes two of the house of Montagues.
                                                      Exit.

  First Citizen. Before we proceed any further, hear me speak.

THE END

  SAMPSON. A dog of that house shall move me to stand, and I will take the wall of any man.
THE END
*** END OF THIS PROJECT GUTENBERG EBOOK COMPLETE WORKS ***
License text that is not a play.
"""

NEW = """ACT II

SCENE II. Capulet's orchard.

ROMEO.
But soft, what light through yonder window breaks?
It is the east, and Juliet is the sun.

Enter Juliet above.

JULIET.
O Romeo, Romeo, wherefore art thou Romeo? [_Aside._]
Deny thy father and refuse thy name.

LADY CAPULET.
What, ho! Nurse!
"""


def test_old_layout_roles_per_play() -> None:
    roles = parse_roles(OLD)
    assert set(roles) == {(0, "SAMPSON"), (0, "GREGORY"), (0, "FIRST CITIZEN"), (1, "SAMPSON")}
    assert roles[(0, "SAMPSON")] == (
        "Gregory, on my word, we'll not carry coals. I mean, an we be in choler, we'll draw. "
        "Draw thy tool! Here comes two of the house of Montagues."
    )
    assert roles[(0, "GREGORY")] == "No, for then we should be colliers."
    merged = parse_roles(OLD, by_play=False)
    assert set(merged) == {(0, "SAMPSON"), (0, "GREGORY"), (0, "FIRST CITIZEN")}
    assert merged[(0, "SAMPSON")].endswith("take the wall of any man.")


def test_new_layout_and_typographic_quotes() -> None:
    roles = parse_roles(NEW.replace("Capulet's", "Capulet\u2019s"))
    assert set(roles) == {(0, "ROMEO"), (0, "JULIET"), (0, "LADY CAPULET")}
    assert (
        roles[(0, "ROMEO")]
        == "But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
    )
    assert roles[(0, "JULIET")] == "O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name."


def test_windows_stride_and_cap() -> None:
    tokens = np.arange(10)
    x, y = role_windows(tokens, 4, 1, None)
    assert x.shape == (6, 4) and x[0].tolist() == [0, 1, 2, 3] and y.tolist() == [4, 5, 6, 7, 8, 9]
    x, y = role_windows(tokens, 4, 2, None)
    assert y.tolist() == [4, 6, 8]
    x, y = role_windows(tokens, 4, 1, 3)
    assert y.tolist() == [4, 6, 9]  # evenly spaced, first and last kept
    assert role_windows(tokens, 10, 1, None)[0].shape == (0, 10)


def decode(row: np.ndarray) -> str:
    return "".join(ALL_LETTERS[i] for i in row)


def test_load_builds_next_character_samples_by_role(tmp_path: Path) -> None:
    folder = tmp_path / "shakespeare_text"
    folder.mkdir()
    (folder / "pg100.txt").write_text(OLD + "\n" + NEW)
    data = ShakespeareText(seq_len=20).load(tmp_path)
    roles = parse_roles(OLD + "\n" + NEW)
    kept = sorted(r for r, text in roles.items() if len(text) > 20)
    assert data.users is not None and int(data.users.max()) + 1 == len(kept)
    assert data.num_classes == 80 and data.x.shape[1] == 20
    first = roles[kept[0]]
    rows = data.x[data.users == 0].numpy()
    assert decode(rows[0]) == first[:20] and ALL_LETTERS[int(data.y[0])] == first[20]
    assert len(rows) == len(first) - 20
    part = PARTITIONERS.build({"name": "natural"})
    fed = federate(data, part, len(kept), test_fraction=0.2, seed=0)
    assert fed.num_clients == len(kept) and int(fed.train.sizes.sum() + fed.test.sizes.sum()) == len(data)
    capped = ShakespeareText(seq_len=20, max_samples_per_role=5, min_chars=60).load(tmp_path)
    assert int(capped.users.max()) + 1 == sum(len(t) >= 60 for t in roles.values())  # type: ignore[union-attr]
    assert int((capped.users == 0).sum()) == 5  # type: ignore[union-attr]


def test_missing_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="Gutenberg eBook #100"):
        ShakespeareText().load(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        ShakespeareText(file=str(tmp_path / "nope.txt")).load(tmp_path)
    other = tmp_path / "shakespeare_text"
    other.mkdir()
    (other / "notes.txt").write_text("nothing here\n")
    with pytest.raises(DataError, match="no speaking role"):
        ShakespeareText().load(tmp_path)


def test_brackets_are_dropped_like_the_regular_expression_in_linear_time() -> None:
    pattern = re.compile(r"\[[^\]]*\]")
    rng = np.random.default_rng(0)
    for _ in range(500):
        line = "".join(rng.choice(list("ab []"), int(rng.integers(0, 30))))
        assert _drop_brackets(line) == pattern.sub(" ", line), line
    assert _drop_brackets("[" * 300_000) == "[" * 300_000  # the regular expression needs minutes for this line
    assert parse_roles("ROMEO.\n" + "[" * 300_000 + "\n") == {(0, "ROMEO"): "[" * 300_000}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "  ROMEO. Caf\xe9 au lait, good sir, and more words to make the line long enough.\n".encode("latin1"),
            "not UTF-8",
        ),
        (bytes(range(256)) * 16, "not UTF-8"),
        (b"", "no speaking role"),
        (b"\x00" * 4096, "no speaking role"),
        ("ROMEO.\nshort\n".encode("utf-16"), "not UTF-8"),
    ],
)
def test_bad_text_files_are_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    folder = tmp_path / "shakespeare_text"
    folder.mkdir()
    (folder / "pg100.txt").write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        ShakespeareText().load(tmp_path)
    assert str(folder / "pg100.txt") in str(err.value) and "\n" not in str(err.value)


def test_a_folder_given_as_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is a folder"):
        ShakespeareText(file=str(tmp_path)).load(tmp_path)
    (tmp_path / "shakespeare_text" / "pg100.txt").mkdir(parents=True)
    with pytest.raises(DataError, match=r"pg100\.txt' is a folder"):
        ShakespeareText().load(tmp_path)
