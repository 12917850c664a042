"""The MLflow model registry, as the platform sees it.

Registered models carry their task as a tag; each version's artifacts live under one
folder whose files ``infergate.versions`` names. Aliases (``champion``, ``canary``) say
what is served.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from infergate.errors import ModelNotFound
from infergate.versions import ARTIFACT_DIR, SPEC_FILE

log = logging.getLogger(__name__)

TASK_TAG = "infergate.task"
EXPERIMENT = "infergate-registrations"


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    task: str
    aliases: dict[str, str]
    tags: dict[str, str]
    # Milliseconds since the epoch: a model deleted and registered again under its name is
    # another model, whose version numbers start over.
    created: int = 0


def _registered(model: Any) -> RegisteredModel:
    return RegisteredModel(
        model.name,
        model.tags.get(TASK_TAG, ""),
        dict(model.aliases),
        dict(model.tags),
        int(model.creation_timestamp or 0),
    )


class Registry:
    """Reads and writes registered models through an MLflow tracking server."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def has_model(self, name: str) -> bool:
        try:
            self.client.get_registered_model(name)
        except (MlflowException, RestException):
            return False
        return True

    def register(
        self,
        name: str,
        task: str,
        files: Path,
        *,
        metrics: Mapping[str, float],
        params: Mapping[str, str],
        tags: Mapping[str, str],
        alias: str | None = None,
    ) -> str:
        """Log ``files`` as a run's artifacts and make them a new version of ``name``."""
        mlflow.set_tracking_uri(self.tracking_uri)
        experiment = mlflow.set_experiment(EXPERIMENT)
        with mlflow.start_run(experiment_id=experiment.experiment_id, run_name=name) as run:
            mlflow.log_params(dict(params))
            mlflow.log_metrics(dict(metrics))
            mlflow.log_artifacts(str(files), artifact_path=ARTIFACT_DIR)
        if not self.has_model(name):
            self.client.create_registered_model(name, tags={TASK_TAG: task})
        version = self.client.create_model_version(
            name,
            source=f"{run.info.artifact_uri}/{ARTIFACT_DIR}",
            run_id=run.info.run_id,
            tags={TASK_TAG: task, **tags},
        ).version
        if alias:
            self.client.set_registered_model_alias(name, alias, version)
        return str(version)

    def models(self) -> list[RegisteredModel]:
        """Every model the platform registered (it carries the task tag)."""
        found = self.client.search_registered_models(max_results=1000)
        models = [_registered(m) for m in found if TASK_TAG in m.tags]
        return sorted(models, key=lambda m: m.name)

    def model(self, name: str) -> RegisteredModel:
        try:
            model = self.client.get_registered_model(name)
        except (MlflowException, RestException):
            raise ModelNotFound(f"model {name!r} is not in the registry") from None
        return _registered(model)

    def version_source(self, name: str, version: str) -> str:
        return self._version(name, version).source

    def version_task(self, name: str, version: str) -> str:
        """The task ``version`` was registered for ("" if it carries no task tag)."""
        return self._version(name, version).tags.get(TASK_TAG, "")

    def _version(self, name: str, version: str) -> Any:
        try:
            return self.client.get_model_version(name, version)
        except (MlflowException, RestException):
            raise ModelNotFound(f"model {name!r} has no version {version!r}") from None

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def delete_alias(self, name: str, alias: str) -> None:
        self.client.delete_registered_model_alias(name, alias)

    def set_model_tags(self, name: str, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_registered_model_tag(name, key, value)

    def delete_model_tags(self, name: str, keys: list[str]) -> None:
        for key in keys:
            self.client.delete_registered_model_tag(name, key)

    def set_version_tags(self, name: str, version: str, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(name, version, key, value)

    def download(self, source: str, relative: str, dst: Path) -> Path:
        """Fetch ``source/relative`` into ``dst`` once; later calls reuse it."""
        target = dst / relative
        if target.exists():
            return target
        dst.mkdir(parents=True, exist_ok=True)
        # Download beside the target, then rename: a crashed download never looks complete.
        with tempfile.TemporaryDirectory(dir=dst) as tmp:
            fetched = mlflow.artifacts.download_artifacts(
                artifact_uri=f"{source}/{relative}",
                dst_path=tmp,
                tracking_uri=self.tracking_uri,
            )
            try:
                Path(fetched).rename(target)
            except OSError:
                # A folder another process sharing ``dst`` (a replica or a batch actor of
                # the same node) renamed into place first: theirs is as complete as ours.
                if not target.exists():
                    raise
        return target

    def load_spec(self, source: str, cache: Path) -> dict[str, Any]:
        return json.loads(self.download(source, SPEC_FILE, cache).read_text())
