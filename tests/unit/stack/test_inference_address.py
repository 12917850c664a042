"""What `infergate up` prints as the inference addresses, and the gRPC ingress it asks
Ray Serve for."""

import importlib

from infergate.config import FrontendSettings, ServeSettings, StackConfig
from infergate.stack.ray_start import GRPC_SERVICER, grpc_options
from infergate.stack.supervisor import grpc_address, inference_address


def test_the_local_ingress_or_the_clusters_never_one_where_nothing_listens():
    assert inference_address(ServeSettings(port=8123)) == "http://127.0.0.1:8123"
    external = ServeSettings(external=True, port=8123)
    assert "8123" not in inference_address(external)  # nothing listens there
    assert "serve.external_url" in inference_address(external)
    url = "http://infergate-serve-svc.ml:8000"
    assert inference_address(ServeSettings(external=True, external_url=url)) == url


def test_the_grpc_address_is_the_ingress_s_host_and_the_grpc_port():
    config = StackConfig(frontend=FrontendSettings(grpc_port=9123))
    assert grpc_address(config) == "127.0.0.1:9123"
    assert grpc_options(9123) == {"port": 9123, "grpc_servicer_functions": [GRPC_SERVICER]}
    off = StackConfig(frontend=FrontendSettings(grpc_port=0))
    assert "off" in grpc_address(off) and grpc_options(0) is None
    external = StackConfig(serve=ServeSettings(external=True))
    assert "8081" not in grpc_address(external)  # nothing listens here


def test_the_servicer_ray_serve_imports_is_tritonclient_s():
    module, _, function = GRPC_SERVICER.rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))
