"""`fedhet bench`: whole-round timings of fedhet's backends against a plain PyTorch loop, a vmap loop and the
machine's matrix-multiply limit, all measured in the same run (benchmarks/full_bench.py adds the naive reference,
pfl and Flower from a source checkout)."""
