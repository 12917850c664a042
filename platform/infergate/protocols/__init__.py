"""The wire protocols of the front-end (native, OpenAI, Open Inference Protocol V2,
rerank), its router and its OpenAPI document. Handlers only adapt to the data plane."""
