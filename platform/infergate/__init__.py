"""infergate: serve Hugging Face transformer models behind Ray Serve and Triton."""

__version__ = "0.1.0"
