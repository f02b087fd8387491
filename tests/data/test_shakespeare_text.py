"""Shakespeare by speaking role from the plain-text Complete Works (both Gutenberg layouts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedhet.data.federate import federate
from fedhet.data.partition import PARTITIONERS
from fedhet.data.real import ALL_LETTERS
from fedhet.data.shakespeare_text import ShakespeareText, parse_roles, role_windows
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
