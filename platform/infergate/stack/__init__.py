"""``infergate up``: the local stack's processes (MLflow, Triton, Ray Serve) and
what supervises them."""
