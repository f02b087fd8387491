"""FedGSNR: local steps from the gradient signal-to-noise ratio, and GSNR contribution scores. Importing the
package registers its components."""

from fedhet.methods.fedgsnr import contribution, strategy

__all__ = ["contribution", "strategy"]
