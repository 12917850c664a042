"""The precision-settings benchmark (infergate.bench.settings) on a tiny model: every int8
setting measured for quality and throughput in one run, ratios to int8-dynamic."""

from infergate.bench.settings import BASELINE, compare_settings, markdown
from infergate.registration.quantise import SETTINGS
from tiny_models import tiny_bert


def test_every_setting_is_measured_side_by_side(tmp_path):
    folder = tiny_bert(tmp_path / "model", "feature-extraction")
    texts = [f"text number {i} about films and food" for i in range(40)]
    results = compare_settings(
        folder, "feature-extraction", texts, rounds=2, round_s=0.2, work=tmp_path / "work"
    )
    assert list(results["quality"]) == list(SETTINGS["int8"])
    assert results["ratio"][BASELINE] == 1.0
    assert all(len(figures) == 2 and min(figures) > 0 for figures in
               results["sequences_per_s"].values())  # fmt: skip
    fp32 = results["quality"]["fp32"]
    assert fp32["cosine_mean"] > 1 - 1e-9 and fp32["nn_agreement"] == 1.0
    table = markdown(results)
    assert table.count("\n| int8-") == 2 and "| fp32 |" in table
