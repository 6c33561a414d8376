"""Model definitions (GPT-2, Llama), their layers, weight loading and tensor-parallel sharding."""
