"""Where a served version's artifacts are kept on the serving side."""

from infergate.versions import ServedVersion, version_cache


def served(source: str, version: str = "1") -> ServedVersion:
    return ServedVersion("sentiment", version, "text-classification", source)


def test_a_version_keeps_its_folder_while_its_files_stay_the_same(tmp_path):
    first = version_cache(tmp_path, served("mlflow-artifacts:/1/run-a/artifacts/model"))
    assert first == version_cache(tmp_path, served("mlflow-artifacts:/1/run-a/artifacts/model"))
    assert first.is_relative_to(tmp_path / "sentiment__v1")


def test_a_model_registered_again_does_not_reuse_the_deleted_ones_files(tmp_path):
    """Deleted and registered again, a model restarts at version 1 from another run."""
    before = version_cache(tmp_path, served("mlflow-artifacts:/1/run-a/artifacts/model"))
    after = version_cache(tmp_path, served("mlflow-artifacts:/1/run-b/artifacts/model"))
    assert before != after
    assert version_cache(tmp_path, served("mlflow-artifacts:/1/run-a/artifacts/model", "2")) != (
        before
    )
