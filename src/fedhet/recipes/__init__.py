"""The papers' experiments as recipes (`fedhet reproduce NAME`). Each module registers its recipes."""

from fedhet.experiments.reproduce import RECIPES, get_recipe
from fedhet.recipes import (  # registers each paper's recipes
    cafed,
    capacity,
    clusters,
    fedgsnr,
    fedmgda,
    fedmgda_leaf,
    leakage,
    lora,
    maxfl,
    personal,
    privacy,
    time,
)

__all__ = ["RECIPES", "get_recipe"]
