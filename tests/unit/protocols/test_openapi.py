"""The OpenAPI document comes from the route table: every route the front-end answers is
in it (but the document's own), with its path parameters, and nothing else is."""

from infergate.protocols.frontend import ROUTES, openapi_document


def test_the_document_has_every_route_and_only_the_routes():
    paths = openapi_document()["paths"]
    documented = {(path, method.upper()) for path, ops in paths.items() for method in ops}
    routed = {(route.pattern, route.method) for route in ROUTES}
    assert routed - documented == {("/openapi.json", "GET")}
    assert documented <= routed


def test_path_parameters_come_from_the_pattern():
    operation = openapi_document()["paths"]["/v2/models/{name}/versions/{version}/infer"]["post"]
    assert [p["name"] for p in operation["parameters"]] == ["name", "version"]
    assert "parameters" not in openapi_document()["paths"]["/predict"]["post"]


def test_every_schema_referenced_is_defined():
    document = openapi_document()
    text = str(document["paths"]) + str(document["components"])
    schemas = document["components"]["schemas"]
    referenced = {part.split("'")[0] for part in text.split("#/components/schemas/")[1:]}
    assert referenced and referenced <= set(schemas)
