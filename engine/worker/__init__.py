"""The model side: runner, CUDA graphs, step buffers, sampling, models, tensor-parallel workers."""
