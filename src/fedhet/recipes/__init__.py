"""The papers' experiments as recipes (`fedhet reproduce NAME`). Each module registers its recipes."""

from fedhet.experiments.recipes import RECIPES, get_recipe
from fedhet.recipes import cafed, fedgsnr, fedmgda, fedmgda_leaf, maxfl, personal, privacy  # registers the recipes

__all__ = ["RECIPES", "get_recipe"]
