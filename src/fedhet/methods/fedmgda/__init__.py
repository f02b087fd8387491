"""FedMGDA+ (Hu et al., IEEE TNSE) and its FedMGDA / FedAvg-n variants. Importing the package registers them."""

from fedhet.methods.fedmgda import strategy

__all__ = ["strategy"]
