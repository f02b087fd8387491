"""CA-Fed (Rodio et al., INFOCOM 2023) and the availability-aware baselines of its experiments. Importing the
package registers its components."""

from fedhet.methods.cafed import adafed, f3ast, metrics, strategy, unbiased

__all__ = ["adafed", "f3ast", "metrics", "strategy", "unbiased"]
