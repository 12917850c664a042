"""``infergate batch``: a registered version over a whole data set, on Ray Data.

The job runs the version's own tokenizer, graph and post-processing through the serving
path's code (:class:`infergate.serving.runtime.ModelRuntime`), with the model in process
(ONNX Runtime, or CTranslate2 for translation) through the same session and engine code
as the Triton models (``infergate.triton.backend_model``, ``translator_model``).

options.py (what a job is asked, checked before any work), rows.py (a row's checks and
the output columns; pure), files.py (Parquet, JSON Lines and CSV parts through pyarrow's
filesystems), csv_parts.py (a CSV file cut at record boundaries), engines.py (the
in-process backends), worker.py (the Ray Data actor that runs one part), job.py
(planning, Ray, progress, the MLflow record), cli.py.
"""
