"""``push`` through grafana-api against a stand-in for Grafana.

Grafana cannot be installed on this machine, so ``FakeGrafana`` below STANDS IN FOR
GRAFANA: a small in-process HTTP server implementing only the endpoints ``push`` uses,
with Grafana's paths, status codes and response shapes
(https://grafana.com/docs/grafana/latest/developers/http_api/):

- ``GET  /api/datasources/uid/{uid}``, ``GET /api/datasources/name/{name}`` (404 if none)
- ``POST /api/datasources``, ``PUT /api/datasources/{id}``
- ``GET  /api/folders/{uid}`` (404 if none), ``POST /api/folders``
- ``POST /api/dashboards/db`` (create or, with ``overwrite``, replace by uid; bumps the
  version)

Every request must carry ``Authorization: Bearer <token>``, otherwise 401 as Grafana
answers. It records each request so the tests can assert what was sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from infergate.dashboards.builders import DATASOURCE_NAME, DATASOURCE_UID, FOLDER_UID
from infergate.dashboards.generate import DASHBOARDS_DIR
from infergate.dashboards.push import push
from infergate.errors import DashboardError

TOKEN = "glsa_test_token"
PROMETHEUS = "http://prometheus:9090"


class FakeGrafana(ThreadingHTTPServer):
    """The state of the stand-in Grafana and the requests it received."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.prefix = prefix  # a Grafana served under a sub-path (root_url .../grafana)
        self.requests: list[tuple[str, str, Any]] = []
        self.datasources: dict[int, dict[str, Any]] = {}
        self.folders: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}  # uid -> {dashboard, folderUid, version}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{self.prefix}"

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path, _ in self.requests if method != "GET"]

    def handle_api(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not path.startswith(f"{self.prefix}/api/"):
            return 404, {"message": "Not found"}
        parts = [unquote(p) for p in path.removeprefix(f"{self.prefix}/api/").split("/")]
        if parts[0] == "datasources":
            return self._datasources(method, parts[1:], body)
        if parts[0] == "folders":
            return self._folders(method, parts[1:], body)
        if parts == ["dashboards", "db"] and method == "POST":
            return self._save_dashboard(body)
        return 404, {"message": "Not found"}

    def _datasources(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 2 and rest[0] in ("uid", "name"):
            for datasource in self.datasources.values():
                if datasource[rest[0]] == rest[1]:
                    return 200, datasource
            return 404, {"message": "Data source not found"}
        if method == "POST" and not rest:
            if any(d["name"] == body["name"] for d in self.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            new_id = len(self.datasources) + 1
            self.datasources[new_id] = {**body, "id": new_id, "version": 1}
            return 200, {"id": new_id, "message": "Datasource added", "name": body["name"]}
        if method == "PUT" and len(rest) == 1 and int(rest[0]) in self.datasources:
            old = self.datasources[int(rest[0])]
            self.datasources[old["id"]] = {**body, "id": old["id"], "version": old["version"] + 1}
            return 200, {"id": old["id"], "message": "Datasource updated"}
        return 404, {"message": "Not found"}

    def _folders(self, method: str, rest: list[str], body: Any) -> tuple[int, Any]:
        if method == "GET" and len(rest) == 1:
            folder = self.folders.get(rest[0])
            return (200, folder) if folder else (404, {"message": "folder not found"})
        if method == "POST" and not rest:
            folder = {"id": len(self.folders) + 1, "uid": body["uid"], "title": body["title"]}
            self.folders[body["uid"]] = folder
            return 200, folder
        return 404, {"message": "Not found"}

    def _save_dashboard(self, body: dict[str, Any]) -> tuple[int, Any]:
        dashboard = body["dashboard"]
        old = self.dashboards.get(dashboard["uid"])
        if old and not body.get("overwrite"):
            return 412, {"message": "The dashboard has been changed by someone else"}
        if body.get("folderUid") not in self.folders:
            return 400, {"message": "folder not found"}
        version = old["version"] + 1 if old else 1
        self.dashboards[dashboard["uid"]] = {
            "dashboard": dashboard,
            "folderUid": body["folderUid"],
            "version": version,
        }
        uid = dashboard["uid"]
        return 200, {
            "id": 1,
            "uid": uid,
            "url": f"/d/{uid}/x",
            "status": "success",
            "version": version,
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeGrafana

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.requests.append((self.command, self.path, body))
        if self.headers.get("authorization") != f"Bearer {TOKEN}":
            status, answer = 401, {"message": "invalid API key"}
        else:
            status, answer = self.server.handle_api(self.command, self.path, body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    yield from _serve(FakeGrafana())


@pytest.fixture
def grafana_under_sub_path() -> Iterator[FakeGrafana]:
    yield from _serve(FakeGrafana(prefix="/grafana"))


def _serve(server: FakeGrafana) -> Iterator[FakeGrafana]:
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def committed_dashboards() -> dict[str, dict[str, Any]]:
    files = sorted(DASHBOARDS_DIR.glob("*.json"))
    return {d["uid"]: d for d in (json.loads(p.read_text()) for p in files)}


def test_first_push_creates_datasource_folder_and_dashboards(grafana):
    result = push(grafana.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR)
    assert result.datasource == "created" and result.folder == "created"
    assert len(result.dashboards) == 4
    assert all(d.version == 1 and d.url.startswith("/d/") for d in result.dashboards)

    (datasource,) = grafana.datasources.values()
    assert datasource["uid"] == DATASOURCE_UID and datasource["name"] == DATASOURCE_NAME
    assert datasource["type"] == "prometheus" and datasource["url"] == PROMETHEUS
    assert datasource["access"] == "proxy"
    assert grafana.folders[FOLDER_UID]["title"] == "infergate"

    expected = committed_dashboards()
    assert set(grafana.dashboards) == set(expected)
    uploads = [body for method, path, body in grafana.requests if path == "/api/dashboards/db"]
    assert all(b["overwrite"] is True and b["folderUid"] == FOLDER_UID for b in uploads)
    for uid, stored in grafana.dashboards.items():
        assert stored["dashboard"] == expected[uid]  # exactly the committed JSON


def test_second_push_changes_nothing_but_versions(grafana):
    push(grafana.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR)
    datasources = json.loads(json.dumps(grafana.datasources))
    folders = dict(grafana.folders)
    contents = {uid: d["dashboard"] for uid, d in grafana.dashboards.items()}
    grafana.requests.clear()

    result = push(grafana.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR)
    assert result.datasource == "unchanged" and result.folder == "exists"
    assert [d.version for d in result.dashboards] == [2, 2, 2, 2]
    # Only the dashboard uploads write anything; the rest is read.
    assert set(grafana.writes()) == {("POST", "/api/dashboards/db")}
    assert json.loads(json.dumps(grafana.datasources)) == datasources
    assert grafana.folders == folders
    assert {uid: d["dashboard"] for uid, d in grafana.dashboards.items()} == contents


def test_a_new_prometheus_url_updates_the_datasource_in_place(grafana):
    push(grafana.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR)
    result = push(grafana.url, TOKEN, "http://127.0.0.1:9090", DASHBOARDS_DIR)
    assert result.datasource == "updated"
    (datasource,) = grafana.datasources.values()
    assert datasource["url"] == "http://127.0.0.1:9090" and datasource["version"] == 2
    assert ("PUT", f"/api/datasources/{datasource['id']}") in grafana.writes()


def test_a_datasource_found_by_name_is_taken_over(grafana):
    grafana.datasources[7] = {"id": 7, "uid": "other", "name": DATASOURCE_NAME,
                              "type": "prometheus", "url": PROMETHEUS, "access": "proxy",
                              "jsonData": {"keep": "me"}, "version": 1}  # fmt: skip
    assert push(grafana.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR).datasource == "updated"
    assert grafana.datasources[7]["uid"] == DATASOURCE_UID
    assert grafana.datasources[7]["jsonData"]["keep"] == "me"  # settings made in Grafana stay


def test_a_wrong_token_is_a_clear_error(grafana):
    with pytest.raises(DashboardError, match=r"rejected the token \(401 Unauthorized\)") as error:
        push(grafana.url, "wrong", PROMETHEUS, DASHBOARDS_DIR)
    assert "--token" in error.value.message
    assert grafana.writes() == []


def test_unreachable_grafana_and_missing_dashboards_are_clear_errors(grafana, tmp_path: Path):
    with pytest.raises(DashboardError, match="cannot reach Grafana"):
        push("http://127.0.0.1:9", TOKEN, PROMETHEUS, DASHBOARDS_DIR, timeout_s=2)
    with pytest.raises(DashboardError, match="no dashboards"):
        push(grafana.url, TOKEN, PROMETHEUS, tmp_path)
    with pytest.raises(DashboardError, match="not an http"):
        push("grafana:3000", TOKEN, PROMETHEUS, DASHBOARDS_DIR)


def test_grafana_under_a_sub_path(grafana_under_sub_path):
    result = push(grafana_under_sub_path.url, TOKEN, PROMETHEUS, DASHBOARDS_DIR)
    assert result.datasource == "created" and len(result.dashboards) == 4
    assert all(path.startswith("/grafana/api/") for _, path, _ in grafana_under_sub_path.requests)
