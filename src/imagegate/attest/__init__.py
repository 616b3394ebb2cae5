"""Attestations: the in-toto Statement with the acceptance predicate (DSSE signing, keys and
verification live beside it)."""
