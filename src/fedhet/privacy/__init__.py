"""Differential privacy: client-level DP on any strategy (`fedhet.privacy.strategy`), its accounting and that of
example-level DP-SGD (`fedhet.privacy.accounting`, `fedhet.privacy.ledger`), and what privacy costs each group of
clients. The clients' side of both (clipping, local noise, DP-SGD's steps) is the engine's (`fedhet.engine.privacy`).
docs/privacy.md has the whole story."""
