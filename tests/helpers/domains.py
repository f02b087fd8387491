"""A tiny multi-domain image tree (root/<domain>/<class>/*.png) for the ``image_domains`` tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

DOMAINS = {"photo": 200, "sketch": 40, "cartoon": 120}  # each domain's grey level: its images are told apart by it


def write_domains(root: Path, per_class: int = 6) -> Path:
    """Three domains of 4×4 PNGs, classes cat and dog (the sketches have a bird too)."""
    for domain, grey in DOMAINS.items():
        classes = ["cat", "dog", "bird"] if domain == "sketch" else ["cat", "dog"]
        for c, name in enumerate(classes):
            folder = root / domain / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = np.full((4, 4), grey, dtype=np.uint8)
                pixels[0, 0] = 10 * c + i  # class and index in one pixel
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root
