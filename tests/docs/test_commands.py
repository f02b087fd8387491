"""Every shell command in README.md and docs/ is run by a test (issue 42: "a README whose commands work").

`commands()` collects each line of every ``bash``/``shell`` block (continuations joined, comments dropped). A
command is either run here, in order, in a folder per page that holds the files the page tells its reader to make
(`page_files`), or it is in `ELSEWHERE` with the test stage that runs it and why not here: a command that is in
neither fails `test_every_command_is_run_somewhere`, so a new command in the docs cannot go unrun.

Run here as written, in-process (`fedhet` is the CLI's typer app), with two changes: a paper recipe (`fedhet
reproduce`) whose quick version tests/recipes does not run runs here with ``--quick --seeds 1`` (a full recipe takes
minutes to an hour), and a
command that logs to a tracker whose library is not installed must refuse in one line naming the extra to install
(the trackers' CI stage has them). What a command claims to write is checked: the run folder's summary
(``--out``), the figure (``--plot``, ``-o``) and the JSON (``--json``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r'^```(\w*)(?: title="([^"]+)")?\n(.*?)^```', flags=re.S | re.M)
ENV_PREFIX = re.compile(r"^(?:[A-Z_]+=\S+\s+)+")

# Commands run by another stage of .ci/run (or not runnable on one machine), each with where and why.
ELSEWHERE: dict[str, str] = {
    r"^make (install|test|test-slow|docs|test-ray|test-trackers|test-flower|flower-venv)$": ".ci/run's stages",
    r"^source \.venv/bin/activate$": "a shell's venv activation (every test runs in the venv `make install` made)",
    r"^pip install ": "the install (.ci/run installs every extra through `make`)",
    r"^make bench$": "the full benchmark, 7+ minutes (tests/bench runs each of its workloads small)",
    r"^make flower-demo$|^scripts/flower_local\.sh ": "the Flower stage (tests/flower/test_deployment.py)",
    r"^\.venv-flower/bin/fedhet run .*--engine flower": "the Flower stage (tests/flower/test_simulation.py)",
    r"^\.venv-flower/bin/python benchmarks/flower_deployment\.py": "a Flower benchmark (minutes; the Flower stage "
    "runs the deployment it times)",
    r"^(python -m fedhet\.flower\.(supernode|worker)|flower-superlink|flower-supernode|flwr supernode|ssh-keygen) ": (
        "a template for machines of your own (superlink.example, <pids>, certificates); the Flower stage runs "
        "the same SuperNodes on loopback"
    ),
    r"^ray (start|stop)|--ray 127\.0\.0\.1|sweep-fedprox-ray": "the Ray stage (tests/experiments/test_executor_ray.py, "
    "test_actors_ray.py)",
    r"^wandb ": "the trackers' stage (tests/experiments/test_tracking.py reads the offline W&B run back)",
    r"tv_nets\.py:resnet18": "torchvision's ResNet-18, not installable beside the pinned CPU torch here "
    "(tests/models/test_torchvision_shaped.py trains a ResNet built as torchvision builds it, each policy)",
    r"^python benchmarks/|^fedhet bench |^python -m fedhet\.bench\.": "a benchmark (minutes of timing; the code it "
    "times is tested small in tests/bench and the tests of its modules)",
}


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    refusal: str | None = None  # the start of the one-line error the page says it gives ("# error: ..." below it)

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def blocks(page: Path) -> list[tuple[str, str | None, str, int]]:
    """(language, title, code, line of the code's first line) of every fenced block of a page."""
    text = page.read_text()
    return [(m[1], m[2], m[3], text[: m.start()].count("\n") + 2) for m in FENCE.finditer(text)]


def commands(page: Path) -> list[Command]:
    found = []
    for language, title, code, first in blocks(page):
        if language not in ("bash", "shell", "") or title is not None:
            continue
        lines = code.replace("\\\n", " ").splitlines()
        for offset, line in enumerate(lines):
            if language == "":  # a transcript: "$ command" lines among the output
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            text = re.sub(r"\s+", " ", re.sub(r"(^|\s)#.*$", "", line)).strip()  # a comment after a space
            said = lines[offset + 1] if offset + 1 < len(lines) else ""
            refusal = said[2:].split("(")[0].strip() if said.startswith("# error: ") else None
            if text:
                found.append(Command(page, first + offset, text, refusal))
    return found


# Pages whose every command a test of their own runs as written.
PAGES_ELSEWHERE = {"getting-started.md": "tests/docs/test_getting_started.py (the whole page, in a shell)"}


RECIPE_TESTS = ROOT / "tests" / "recipes"


def recipe_tested(command: Command) -> str | None:
    """A paper recipe whose quick version tests/recipes runs (and checks its claims): it is not run again here."""
    found = re.search(r"fedhet reproduce ([a-z0-9-]+)", command.text)
    if found is None or "--quick" in command.text:  # a quick version the page itself runs: run here as written
        return None
    quoted = re.compile(rf"[\"']{re.escape(found[1])}[\"']")
    tests = [p.name for p in sorted(RECIPE_TESTS.glob("test_*.py")) if quoted.search(p.read_text())]
    return f"tests/recipes/{tests[0]} (the recipe's quick version and its claims)" if tests else None


def elsewhere(command: Command) -> str | None:
    if command.page.name in PAGES_ELSEWHERE:
        return PAGES_ELSEWHERE[command.page.name]
    pattern = next((why for pattern, why in ELSEWHERE.items() if re.search(pattern, command.text)), None)
    return pattern or recipe_tested(command)


def argv(command: Command) -> list[str]:
    """The `fedhet` arguments of a command run here (an environment prefix such as OMP_NUM_THREADS=1 dropped)."""
    words = shlex.split(ENV_PREFIX.sub("", command.text), comments=True)
    if words[:1] == ["make"]:  # make demo: the Makefile's recipe
        words = makefile_recipe(words[1])
    assert words[0] == "fedhet", command
    words = words[1:]
    if words[0] == "reproduce":  # a recipe no test of tests/recipes runs: its quick version, one seed
        words += [flag for flag in ("--quick",) if flag not in words] + (
            ["--seeds", "1"] if "--seeds" not in words else []
        )
    return words


def makefile_recipe(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text()
    (recipe,) = re.findall(rf"^{re.escape(target)}:.*\n\t(.*)$", text, flags=re.M)
    return ["fedhet", *shlex.split(recipe)[1:]]


def page_files(page: Path, folder: Path) -> None:
    """The files a reader of the page has made when they reach its commands: titled blocks, the README's and the
    pages' own examples (patients.csv, my_model.py, ...), a copy of examples/."""
    from helpers.tables import write_patients

    shutil.copytree(ROOT / "examples", folder / "examples")
    write_patients(folder / "patients.csv")
    for _, title, code, _ in blocks(page):
        if title is not None:
            (folder / title).write_text(code)
    python = [code for language, title, code, _ in blocks(page) if language == "python" and title is None]
    if page.name == "README.md":
        (folder / "my_trimmed_avg.py").write_text(python[-1])  # "## Writing an algorithm"
        (folder / "my_strategy.py").write_text(MY_STRATEGY)
    if page.name == "extending.md":
        (folder / "my_components.py").write_text("\n\n".join(python))
    if page.name == "your-data-and-model.md":  # its patients.csv is the getting-started page's (hospitals)
        (make,) = [s for s in snippets(ROOT / "docs" / "getting-started.md") if "patients.csv" in s.code]
        subprocess.run([sys.executable, "-c", make.code], cwd=folder, check=True)
    if not (folder / "my_model.py").exists():
        (folder / "my_model.py").write_text(MY_MODEL)


MY_STRATEGY = '''"""A strategy of one's own: FedAvg under another name."""
from typing import ClassVar

from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@STRATEGIES.register
class MyStrategy(FedAvg):
    name: ClassVar[str] = "my_strategy"
    description: ClassVar[str] = "FedAvg, registered as a plugin"
'''

MY_MODEL = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, input_shape, num_classes, width=32, hidden=32):
        super().__init__()
        size = 1
        for d in input_shape:
            size *= d
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(size, width), nn.GELU(), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
"""

TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def missing_trackers(words: list[str]) -> list[str]:
    named = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--track"]
    return [t for t in named if importlib.util.find_spec(TRACKERS.get(t, t)) is None]


def check_outputs(command: Command, words: list[str], folder: Path) -> None:
    """What the command says it writes is there: a finished run folder, a figure, a JSON file."""
    for flag in ("--plot", "-o", "--json"):
        if flag in words:
            written = folder / words[words.index(flag) + 1]
            assert written.is_file() and written.stat().st_size > 0, f"{command}: no {written.name}"
    if "--out" in words and words[0] == "run":
        summary = json.loads((folder / words[words.index("--out") + 1] / "summary.json").read_text())
        assert summary["status"] in ("finished", "stopped early"), f"{command}: {summary['status']}"


SHELL_TOOLS = ("cmp ", "diff ")  # commands the docs use to compare what fedhet wrote: run by bash


def run_here(command: Command, folder: Path) -> None:
    if command.text.startswith(SHELL_TOOLS):
        done = subprocess.run(["bash", "-c", command.text], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        return
    words = argv(command)
    missing = missing_trackers(words)
    result = CliRunner().invoke(app, words, env={"COLUMNS": "200"})
    if command.refusal is not None:  # the page shows the one-line error it gives
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, f"{command}\n{result.output}"
        assert lines[0].startswith(command.refusal), f"{command}: the page says {command.refusal!r}\n{lines[0]}"
        return
    if missing:  # the trackers' stage runs it with the libraries; here it must say what to install
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, f"{command}\n{result.output}"
        assert missing[0] in lines[0] and "pip install" in lines[0], f"{command}\n{result.output}"
        return
    assert result.exit_code == 0, f"{command}\nexit {result.exit_code}\n{result.output[-3000:]}\n{result.exception!r}"
    check_outputs(command, words, folder)


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.code.splitlines()[0]}"


def snippets(page: Path) -> list[Snippet]:
    """The page's Python blocks that are not files (a titled block is a file the reader saves)."""
    return [
        Snippet(page, line, code)
        for language, title, code, line in blocks(page)
        if language == "python" and title is None
    ]


# Python blocks not run here as written, each with why (by a line of the block).
PYTHON_ELSEWHERE: dict[str, str] = {
    "table1_study(": "a study of dozens of FedGSNR runs (an hour on 2 cores): its code is tests/recipes' quick table",
    'get_recipe("maxfl-byzantine")': "12 runs of the MaxFL recipe (~20 minutes): tests/recipes runs the recipe quick",
    "EventAccumulator": "reads TensorBoard and MLflow records: the trackers' stage (tests/experiments/test_tracking.py"
    " reads them back with the same readers)",
    "inversion.true_gradient(model, params": "an outline of the attacks' Python calls (model, params and the data come "
    "from the text around it): tests/attacks/test_inversion.py and test_membership.py make them",
    "prepare_tracking(config, root=sweep_folder": "an outline of the calls a sweep executor makes (its names come "
    "from the text around it): tests/experiments/test_tracking.py makes them",
}
# Pages whose Python a test of their own runs (the blocks are one plugin file, or the page is run whole).
PYTHON_PAGES_ELSEWHERE = {
    "extending.md": "tests/docs/test_extending.py (every block, in one plugin file, used by the page's commands)",
    "getting-started.md": "tests/docs/test_getting_started.py (the whole page, in order)",
}
# What a page's Python takes from the text around it (arrays "x, y" of one's own, a model "Net").
PRELUDE = """
import numpy as np
from sklearn.datasets import load_digits
from my_model import Net
x, y = load_digits(return_X_y=True)
x, y = x.astype(np.float32) / 16, y
owner = np.arange(len(y)) % 10
pretrained_net = Net((64,), 10)
import fedhet
"""


def python_elsewhere(snippet: Snippet) -> str | None:
    if snippet.page.name in PYTHON_PAGES_ELSEWHERE:
        return PYTHON_PAGES_ELSEWHERE[snippet.page.name]
    return next((why for key, why in PYTHON_ELSEWHERE.items() if key in snippet.code), None)


def run_snippet(snippet: Snippet, folder: Path) -> None:
    """As a script in the page's folder (its own process: a plugin registers its names once)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(folder)]), "OMP_NUM_THREADS": "1"}
    names = ("x", "y", "Net", "owner", "pretrained_net", "fedhet")
    prelude = PRELUDE if re.search(rf"\b({'|'.join(names)})\b", snippet.code) else ""
    done = subprocess.run(
        [sys.executable, "-c", prelude + snippet.code], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{snippet}\n{done.stderr[-3000:]}"


ALL = [c for page in PAGES for c in commands(page)]
SNIPPETS = [s for page in PAGES for s in snippets(page)]
HERE = [
    page
    for page in PAGES
    if any(elsewhere(c) is None for c in commands(page)) or any(python_elsewhere(s) is None for s in snippets(page))
]


def test_every_command_is_run_somewhere() -> None:
    """Each command is run here (a `fedhet` command, or `make demo`) or named in `ELSEWHERE` with its stage."""
    runnable = re.compile(r"^((\S+=\S+ )*fedhet |make demo$|cmp |diff )")
    unrun = [str(c) for c in ALL if elsewhere(c) is None and not runnable.match(c.text)]
    assert not unrun, "commands no test runs:\n" + "\n".join(unrun)
    assert len(ALL) >= 100  # the docs' commands (README and docs/): fewer means the collection broke


def test_no_command_elides_its_arguments() -> None:
    """A command written with `...` or `<placeholder>` cannot be run as written: only templates may have them."""
    elided = [str(c) for c in ALL if ("..." in c.text or "<" in c.text) and elsewhere(c) is None]
    assert not elided, "\n".join(elided)


@pytest.mark.slow
@pytest.mark.parametrize("page", HERE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_commands_run_as_written(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's commands, in the page's order, in one folder (later commands read earlier runs)."""
    page_files(page, tmp_path)
    monkeypatch.chdir(tmp_path)
    steps: list[Command | Snippet] = sorted([*commands(page), *snippets(page)], key=lambda step: step.line)
    for step in steps:
        started = time.perf_counter()
        if isinstance(step, Command) and elsewhere(step) is None:
            run_here(step, tmp_path)
        elif isinstance(step, Snippet) and python_elsewhere(step) is None:
            run_snippet(step, tmp_path)
        else:
            continue
        print(f"{time.perf_counter() - started:7.1f} s  {step}")  # shown with -s: the docs' durations come from it


def test_every_snippet_compiles_and_imports_what_exists() -> None:
    """Every Python block parses, and each name it imports from fedhet exists (also those run elsewhere)."""
    for snippet in SNIPPETS:
        tree = ast.parse(snippet.code)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedhet"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    if not hasattr(module, alias.name):  # a submodule: `from fedhet.attacks import inversion`
                        assert importlib.util.find_spec(f"{node.module}.{alias.name}"), f"{snippet}: no {alias.name}"
