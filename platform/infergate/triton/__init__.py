"""The Triton side of infergate: starting the server, writing its model repository, and
talking to it.

``backend_model.py`` is not a module of this package in the usual sense: it is the
``model.py`` copied into every Triton model folder and runs inside Triton's Python-backend
stub, where ``triton_python_backend_utils`` exists. Nothing here imports it.
"""
