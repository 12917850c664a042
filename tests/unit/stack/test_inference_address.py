"""What `infergate up` prints as the inference address."""

from infergate.config import ServeSettings
from infergate.stack.supervisor import inference_address


def test_the_local_ingress_or_the_clusters_never_one_where_nothing_listens():
    assert inference_address(ServeSettings(port=8123)) == "http://127.0.0.1:8123"
    external = ServeSettings(external=True, port=8123)
    assert "8123" not in inference_address(external)  # nothing listens there
    assert "serve.external_url" in inference_address(external)
    url = "http://infergate-serve-svc.ml:8000"
    assert inference_address(ServeSettings(external=True, external_url=url)) == url
