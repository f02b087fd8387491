"""Differential privacy: privacy mechanisms as registered components (`fedhet.privacy.mechanisms`: a client
transform, server noise, and a release), among them client-level DP on any strategy (`fedhet.privacy.strategy`)
and DP-SGD; their accounting (`fedhet.privacy.accounting`, `fedhet.privacy.ledger`), and what privacy costs each
group of clients. The clients' side (clipping, local noise, DP-SGD's steps) is the engine's
(`fedhet.engine.privacy`). docs/privacy.md has the whole story."""
