"""Importing user code by module name or file path, with one-line errors."""

from __future__ import annotations

import pickle
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhet.errors import ConfigError
from fedhet.imports import (
    ImportPolicy,
    file_module_name,
    import_module_or_file,
    import_policy,
    load_object,
    object_path,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def clean_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo sys.path and sys.modules changes made by a test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_dotted_module_is_imported() -> None:
    module = import_module_or_file("fedhet.errors")
    assert module.ConfigError is ConfigError


def test_a_file_is_imported_once_under_a_stable_name(tmp_path: Path, clean_path: None) -> None:
    file = write(tmp_path / "nets.py", "COUNT = [0]\nCOUNT[0] += 1\nclass Net:\n    pass\n")
    first = import_module_or_file(str(file))
    again = import_module_or_file(str(file))
    assert first is again and first.COUNT == [1]
    assert first.__name__ == file_module_name(file) == file_module_name(tmp_path / "." / "nets.py")
    assert first.__name__.startswith("fedhet_user_nets_")
    # the module name is stable, so its classes pickle by reference
    assert pickle.loads(pickle.dumps(first.Net)) is first.Net


def test_two_files_with_the_same_name_do_not_clash(tmp_path: Path, clean_path: None) -> None:
    a = import_module_or_file(str(write(tmp_path / "a" / "nets.py", "WHO = 'a'\n")))
    b = import_module_or_file(str(write(tmp_path / "b" / "nets.py", "WHO = 'b'\n")))
    assert (a.WHO, b.WHO) == ("a", "b") and a.__name__ != b.__name__


def test_relative_paths_start_at_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_path: None
) -> None:
    write(tmp_path / "pkg" / "models.py", "VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    assert load_object("pkg/models.py:VALUE") == 7


def test_a_module_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_path: None
) -> None:
    write(tmp_path / "fedhet_test_local_nets.py", "class Net:\n    class Inner:\n        X = 3\n")
    monkeypatch.chdir(tmp_path)
    assert load_object("fedhet_test_local_nets:Net.Inner.X") == 3


def test_object_path_round_trips(tmp_path: Path, clean_path: None) -> None:
    assert object_path(ConfigError) == "fedhet.errors:ConfigError"
    module = import_module_or_file(str(write(tmp_path / "nets.py", "class Net:\n    pass\n")))
    spec = object_path(module.Net)
    assert spec == f"{(tmp_path / 'nets.py').resolve()}:Net"
    assert load_object(spec) is module.Net

    def local() -> None: ...

    assert object_path(local) is None
    assert object_path(3) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fedhet.errors", "must look like 'package.module:Name'"),
        ("fedhet.errors:ConfigEror", "'fedhet.errors' has no attribute 'ConfigEror' (did you mean 'ConfigError'?)"),
        ("no_such_module_xyz:Net", "no module named 'no_such_module_xyz' on the Python path"),
        ("fedhet.no_such_module:Net", "cannot import module 'fedhet.no_such_module'"),
        ("not a module:Net", "not a module name"),
        ("missing/file.py:Net", "cannot import 'missing/file.py': no such file"),
        ("notes.txt/x:Net", "must end in .py"),
        (":Net", "must look like"),
    ],
)
def test_bad_specs_are_one_line_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]+$") as err:
        load_object(spec)
    assert message in str(err.value)


def test_errors_while_importing_a_file_are_reported_and_not_cached(tmp_path: Path, clean_path: None) -> None:
    broken = write(tmp_path / "broken.py", "raise ValueError('bad\\nthings')\n")
    with pytest.raises(ConfigError, match=r"^importing '.*broken.py' failed: ValueError: bad$"):
        import_module_or_file(str(broken))
    assert file_module_name(broken) not in sys.modules
    needs = write(tmp_path / "needs.py", "import fedhet_surely_missing_dependency\n")
    with pytest.raises(ConfigError, match="No module named 'fedhet_surely_missing_dependency'"):
        import_module_or_file(str(needs))


def test_a_module_that_needs_a_missing_package_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_path: None
) -> None:
    write(tmp_path / "fedhet_test_needy.py", "import fedhet_surely_missing_dependency\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="needs module 'fedhet_surely_missing_dependency', which is not installed"):
        import_module_or_file("fedhet_test_needy")


def test_sys_exit_in_an_imported_file_is_an_error_not_an_exit(tmp_path: Path, clean_path: None) -> None:
    bye = write(tmp_path / "bye.py", "import sys\nsys.exit(0)\n")
    with pytest.raises(ConfigError, match=r"^importing '.*bye.py' failed: SystemExit"):
        import_module_or_file(str(bye))
    assert file_module_name(bye) not in sys.modules


def test_an_import_policy_refuses_what_it_does_not_list_before_importing(tmp_path: Path, clean_path: None) -> None:
    evil = write(tmp_path / "evil.py", "import pathlib\npathlib.Path(__file__).with_name('pwned').write_text('x')\n")
    nothing = ImportPolicy((), "trust it with --trust-imports")
    with import_policy(nothing), pytest.raises(ConfigError, match=r"refused to import .*allowed here: nothing.*trust"):
        import_module_or_file(str(evil))
    with import_policy(nothing), pytest.raises(ConfigError, match="refused to import 'subprocess'"):
        load_object("subprocess:getoutput")  # a module imported already is refused too: nothing is resolved
    assert not (tmp_path / "pwned").exists()
    listed = ImportPolicy(("fedhet.errors", str(tmp_path / "allowed")), "")
    allowed = write(tmp_path / "allowed" / "nets.py", "WHO = 'allowed'\n")
    with import_policy(listed):
        assert import_module_or_file("fedhet.errors").__name__ == "fedhet.errors"
        assert import_module_or_file(str(allowed)).WHO == "allowed"  # a file under a listed folder
        for refused in ("fedhet", "fedhet.errors_x", str(evil)):  # a parent, a name that only starts alike
            with pytest.raises(ConfigError, match="refused to import"):
                import_module_or_file(refused)
    assert not (tmp_path / "pwned").exists()
    assert import_module_or_file("fedhet.errors").__name__ == "fedhet.errors"  # outside: anything, as before
