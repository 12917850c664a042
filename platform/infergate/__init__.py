"""infergate: serve Hugging Face transformer models behind Ray Serve and Triton."""

import os

# gRPC's fork handlers start its threads again in every forked child; here they sometimes
# aborted the child before it could exec (Ray's GCS or raylet then never ran, and Ray gave
# up after 30 s). infergate's processes fork only to exec, so the children need no gRPC.
# Set before any gRPC channel exists; a value the caller exported wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
