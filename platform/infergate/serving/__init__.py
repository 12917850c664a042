"""The data plane: a front-end replica's traffic split, batching, tokenization,
access control, the runtime of one served version, and loading a version's files."""
