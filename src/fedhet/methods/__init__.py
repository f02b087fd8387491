"""The four papers' methods, each a package holding its strategy and every component only it needs.

* `maxfl` — MaxFL (Cho et al., TMLR): client requirements ρ_k, the MaxFL and MW-Fed strategies, appeal-driven
  participation and the GM-appeal metrics.
* `cafed` — CA-Fed (Rodio et al., INFOCOM 2023): availability-aware strategies (CA-Fed, Unbiased, AdaFed, F3AST)
  and the α-weighted accuracy metrics.
* `fedmgda` — FedMGDA+ (Hu et al., IEEE TNSE): the min-norm subproblem and the FedMGDA+/FedMGDA/FedAvg-n
  strategies.
* `fedgsnr` — FedGSNR: per-client local steps from the gradient signal-to-noise ratio, and the contribution score.

Generic algorithms and baselines live in `fedhet.strategies`; the engine knows none of these by name.
"""
