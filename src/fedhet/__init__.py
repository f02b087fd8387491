"""fedhet: federated learning when clients differ.

One engine (sequential and vectorised backends) serves every algorithm; strategies are short files.
"""

__version__ = "0.1.0"
