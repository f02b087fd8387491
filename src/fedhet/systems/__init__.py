"""Clients in time: how fast each client computes and communicates (`base`), and what a round costs on the
simulated clock (`clock`)."""
