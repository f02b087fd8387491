"""MaxFL (Cho et al., TMLR): maximise global-model appeal. Importing the package registers its components."""

from fedhet.methods.maxfl import metrics, mwfed, participation, strategy

__all__ = ["metrics", "mwfed", "participation", "strategy"]
