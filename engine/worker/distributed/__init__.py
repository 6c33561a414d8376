"""Tensor parallelism: process group setup, sharded-layer helpers, rank worker processes."""
