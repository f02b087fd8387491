"""`fedhet describe`: the clients a config makes (dataset, partition, shift, label noise), described without
training: sizes, label distributions and their distance to the global one, the shift's groups and levels, a CSV
and a figure (`fedhet.report.heterogeneity`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedhet.atomic import refuse_link, write_bytes, write_text
from fedhet.errors import ConfigError, FedhetNote

CSV_NAME = "clients.csv"
FIGURE_NAME = "heterogeneity.png"


def check_out(out: Path) -> None:
    """Refuse an output folder that is a file, a link or a run folder, or whose files would be links (before anything
    is read)."""
    from fedhet.experiments.runfolder import LOCK

    refuse_link(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{out}' is a file, not a folder; choose a folder")
    if (out / LOCK).exists():
        raise ConfigError(f"--out '{out}' is a folder of fedhet's runs (its clients.csv is the run's): choose another")
    for name in (CSV_NAME, FIGURE_NAME):
        refuse_link(out / name)
        if (out / name).is_dir():
            raise ConfigError(f"'{out / name}' is a folder; fedhet describe writes a file there: choose another --out")


def describe_data(console: Console, raw: dict[str, Any], out: Path) -> None:
    """Federate the data of the raw config `raw` as a run would, print what the clients hold, and write
    ``clients.csv`` and ``heterogeneity.png`` into `out` (everything checked and computed before anything is
    written)."""
    from fedhet.experiments.config import parse_config

    parsed = parse_config(raw)  # a config error is said before torch is imported
    check_out(out)
    from fedhet.experiments.build import federate_dataset, prepared
    from fedhet.report.heterogeneity import heterogeneity_figure

    config, parts, dataset, notes = prepared(parsed)
    for note in notes:
        warnings.warn(note, FedhetNote, stacklevel=2)
    data = federate_dataset(config, parts, dataset)
    shift = parts.shift.for_dataset(dataset)
    report = heterogeneity_of(data, shift.level_name)
    if shift.name == "domain":
        report.group_names = dataset.user_names
    spec = config.spec("partition")
    params = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    title = f"{dataset.name}: partition {spec['name']}{f' ({params})' if params else ''}, {data.num_clients} clients"
    if shift.active:
        level = f" (level: {shift.level_name})" if shift.level_name else ""
        title += f", shift {shift.name}{level}"
    figure = heterogeneity_figure(report, title)
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for what, value in report.summary():
        table.add_row(what, value)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / CSV_NAME, report.csv_text())
    write_bytes(out / FIGURE_NAME, figure)
    console.print(table)
    console.print(f"wrote {out / CSV_NAME} (a row per client) and {out / FIGURE_NAME}", highlight=False)


def heterogeneity_of(data: Any, level_name: str = "") -> Any:
    """The `fedhet.report.heterogeneity.Heterogeneity` of a `FederatedData`: its training labels per client, and,
    for images with groups, the first training image of each group (named by `level_name` and its level)."""
    import numpy as np
    import torch

    from fedhet.data.shift_transforms import as_images
    from fedhet.errors import DataError
    from fedhet.report.heterogeneity import Heterogeneity

    train = data.train
    counts = None
    if not torch.is_floating_point(train.y):
        flat = train.owner * data.num_classes + train.y
        found = torch.bincount(flat, minlength=data.num_clients * data.num_classes)
        counts = found.view(data.num_clients, data.num_classes).numpy()
    levels = data.info.get("shift_level")
    groups = data.info.get("group")
    examples = None
    if groups is not None:
        try:
            images = as_images(train.x, "describe")
        except DataError:  # not images: nothing to show
            images = None
        if images is not None:
            examples = []
            for g in torch.unique(groups).tolist():
                k = next((k for k in range(data.num_clients) if groups[k] == g and train.sizes[k] > 0), None)
                if k is None:
                    continue
                level = f", {level_name} {float(levels[k]):g}" if levels is not None and level_name else ""
                examples.append((f"group {g}{level}", images[int(train.offsets[k])].numpy()))
    return Heterogeneity(
        train_sizes=train.sizes.numpy(),
        test_sizes=data.test.sizes.numpy(),
        seen=data.seen.numpy().astype(bool),
        counts=counts,
        groups=groups.numpy() if groups is not None else None,
        levels=np.asarray(levels, dtype=np.float64) if levels is not None else None,
        examples=examples,
    )
