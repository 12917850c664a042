"""A batch job as an MLflow run, linked to the version it ran (tags ``model`` and
``version``, the version's ``source``), with its input, output and figures."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from infergate.batch.options import JobOptions
from infergate.versions import ServedVersion

if TYPE_CHECKING:
    from infergate.registry import Registry

EXPERIMENT = "infergate-batch"
METRICS = (
    "rows",
    "errors",
    "rows_per_s",
    "busy_rows_per_s",
    "busy_cpu_ms_per_row",
    "busy_waited_share",
    "work_rows_per_s",
    "duration_s",
    "ray_start_s",
    "load_s",
    "startup_s",
    "work_s",
    "parts",
    "parts_failed",
    "actors",
    "nodes",
)


class JobRecord:
    """The run, started when the job starts; ``finish`` logs the figures and ends it."""

    def __init__(self, registry: Registry, served: ServedVersion, options: JobOptions) -> None:
        client = registry.client
        experiment = client.get_experiment_by_name(EXPERIMENT)
        experiment_id = (
            experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
        )
        tags = {
            "model": served.name,
            "version": served.version,
            "task": served.task,
            "source": served.source,
            "mlflow.runName": f"batch {served.name} v{served.version}",
        }
        if options.version is None:
            tags["alias"] = options.alias
        run = client.create_run(experiment_id, tags=tags)
        self.client, self.run_id = client, run.info.run_id
        params = {
            "input": options.input,
            "output": options.output,
            "column": options.column,
            "batch_size": options.batch_size,
        }
        if options.query_column:
            params["query_column"] = options.query_column
        if options.parameters:
            params["parameters"] = dict(options.parameters)
        for key, value in params.items():
            client.log_param(self.run_id, key, str(value))

    def finish(self, figures: dict[str, Any], duration_s: float, *, failed: bool) -> None:
        values = {**figures, "duration_s": duration_s}
        for key in METRICS:
            if key in values:
                self.client.log_metric(self.run_id, key, float(values[key]))
        if "rows_by_node" in values:  # where the actors ran: {node address: rows}
            self.client.set_tag(self.run_id, "rows_by_node", json.dumps(values["rows_by_node"]))
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
