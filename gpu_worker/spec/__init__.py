"""Speculative decoding inside the continuous batch: proposers, adaptive depth."""
