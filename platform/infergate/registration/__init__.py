"""Registration: a Hugging Face folder or an ONNX file in, an optimised and checked
registry version out (export, quantisation, parity, quality, reference statistics)."""
