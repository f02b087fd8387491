"""`fedhet bench`: whole-round timings of fedhet's backends against a naive reference, Flower and the
machine's matrix-multiply limit, all measured in the same run."""
