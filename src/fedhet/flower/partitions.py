"""Write one partition file per node for a deployment: ``python -m fedhet.flower.partitions CONFIG NODES DIR``.

Node p gets ``DIR/node-p.pt`` with the samples of its block of clients only (`fedhet.flower.node.save_partition`);
start its SuperNode with ``--node-config "data-file='DIR/node-p.pt'"``. In a real deployment each node writes or
receives its own file from its own data; this tool cuts a dataset this machine holds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.experiments.build import components, federated_data
from fedhet.experiments.config import load_yaml, parse_config
from fedhet.experiments.runfolder import RUN_FILES, FolderLock
from fedhet.flower.node import node_clients, save_partition


def write_partitions(config_path: Path, nodes: int, folder: Path) -> list[Path]:
    config = parse_config(load_yaml(config_path))
    data = federated_data(config, components(config))
    paths = []
    for p in range(nodes):
        path = folder / f"node-{p}.pt"
        save_partition(path, data, node_clients(data.num_clients, p, nodes))
        paths.append(path)
    return paths


def main(argv: list[str]) -> int:
    """``CONFIG NODES DIR [--run-folder OUT]``: with ``--run-folder``, first claim OUT as the deployment's run folder
    (fedhet's marker: new or empty, or a run folder of fedhet's), so that its ``deploy/`` files may go inside."""
    run_folder = None
    if len(argv) == 5 and argv[3] == "--run-folder":
        argv, run_folder = argv[:3], Path(argv[4])
    if len(argv) != 3:
        print("usage: python -m fedhet.flower.partitions CONFIG.yaml NODES OUT_DIR [--run-folder RUN]", file=sys.stderr)
        return 2
    try:
        if run_folder is not None:  # a run of fedhet's there stays (the server resumes it)
            FolderLock.claim(run_folder, "run", RUN_FILES).close()
        paths = write_partitions(Path(argv[0]), int(argv[1]), Path(argv[2]))
    except FedhetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
