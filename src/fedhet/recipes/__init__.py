"""The papers' experiments as recipes (`fedhet reproduce NAME`). Each module registers its recipes."""

from fedhet.experiments.recipes import RECIPES, get_recipe

__all__ = ["RECIPES", "get_recipe"]
