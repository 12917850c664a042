"""Upload the dashboards and their Prometheus data source to a Grafana, with grafana-api.

Idempotent: the data source is created or updated only when it differs, the folder is
created once, and dashboards are uploaded with ``overwrite=True`` by uid, so running it
again changes nothing but the dashboards' version numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import requests
from grafana_api.grafana_api import GrafanaClientError, GrafanaException, GrafanaServerError
from grafana_api.grafana_face import GrafanaFace

from infergate.dashboards.builders import (
    DATASOURCE_NAME,
    DATASOURCE_UID,
    FOLDER_TITLE,
    FOLDER_UID,
)
from infergate.dashboards.generate import DASHBOARDS_DIR
from infergate.errors import DashboardError

SCRAPE_INTERVAL = "5s"  # deployments/prometheus.yml; Grafana sizes $__rate_interval on it


@dataclass(frozen=True)
class PushedDashboard:
    uid: str
    title: str
    url: str
    version: int


@dataclass(frozen=True)
class PushResult:
    """What :func:`push` did."""

    datasource: Literal["created", "updated", "unchanged"]
    folder: Literal["created", "exists"]
    dashboards: tuple[PushedDashboard, ...]


def datasource_body(prometheus_url: str) -> dict[str, Any]:
    """The data source the dashboards default to (same uid as the provisioning file)."""
    return {
        "name": DATASOURCE_NAME,
        "uid": DATASOURCE_UID,
        "type": "prometheus",
        "access": "proxy",  # Grafana's server queries Prometheus, not the browser
        "url": prometheus_url,
        "isDefault": False,
        "jsonData": {"httpMethod": "POST", "timeInterval": SCRAPE_INTERVAL},
    }


def push(
    grafana_url: str,
    token: str,
    prometheus_url: str,
    dashboards_dir: Path = DASHBOARDS_DIR,
    *,
    timeout_s: float = 10.0,
) -> PushResult:
    """Create or update the Prometheus data source, the "infergate" folder, and every
    ``*.json`` dashboard of ``dashboards_dir`` in the Grafana at ``grafana_url``.

    ``token`` is a Grafana service-account token (Admin role: data sources need it);
    ``prometheus_url`` is where *Grafana's server* reaches Prometheus. Raises
    :class:`DashboardError` with a message saying what to fix.
    """
    files = sorted(Path(dashboards_dir).glob("*.json"))
    if not files:
        raise DashboardError(
            f"no dashboards (*.json) in {dashboards_dir}; generate them with "
            "`infergate dashboards generate`"
        )
    grafana = _client(grafana_url, token, timeout_s)
    try:
        datasource = _ensure_datasource(grafana, datasource_body(prometheus_url))
        folder = _ensure_folder(grafana)
        dashboards = tuple(_upload(grafana, path) for path in files)
    except requests.RequestException as error:
        raise DashboardError(
            f"cannot reach Grafana at {grafana_url}: {error}; is it running, is the URL right?"
        ) from error
    except GrafanaException as error:
        raise DashboardError(_explain(error, grafana_url)) from error
    return PushResult(datasource, folder, dashboards)


def _client(grafana_url: str, token: str, timeout_s: float) -> GrafanaFace:
    parts = urlsplit(grafana_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DashboardError(
            f"the Grafana URL {grafana_url!r} is not an http(s) URL; expected e.g. "
            "http://127.0.0.1:3000"
        )
    if not token:
        raise DashboardError("no Grafana token; create a service-account token and pass it")
    # GrafanaFace builds "{protocol}://{host}:{port}/{prefix}api", so a Grafana served
    # under a sub-path (https://example.org/grafana) needs the prefix with a trailing /.
    prefix = parts.path.strip("/")
    return GrafanaFace(
        auth=token,
        host=parts.hostname,
        port=parts.port,
        url_path_prefix=f"{prefix}/" if prefix else "",
        protocol=parts.scheme,
        timeout=timeout_s,
    )


def _not_found(error: GrafanaException) -> bool:
    return isinstance(error, GrafanaClientError) and error.status_code == 404


def _ensure_datasource(
    grafana: GrafanaFace, wanted: dict[str, Any]
) -> Literal["created", "updated", "unchanged"]:
    existing = None
    # By uid first (what the dashboards reference), then by name (names are unique in
    # Grafana, so creating ours next to a same-named one would fail).
    lookups = (
        lambda: grafana.api.GET(f"/datasources/uid/{quote(DATASOURCE_UID)}"),
        lambda: grafana.datasource.get_datasource_by_name(quote(DATASOURCE_NAME)),
    )
    for lookup in lookups:
        try:
            existing = lookup()
            break
        except GrafanaClientError as error:
            if not _not_found(error):
                raise
    if existing is None:
        grafana.datasource.create_datasource(wanted)
        return "created"
    current = {key: existing.get(key) for key in wanted}
    current["jsonData"] = {
        key: (existing.get("jsonData") or {}).get(key) for key in wanted["jsonData"]
    }
    if current == wanted:
        return "unchanged"
    # Keep settings made in Grafana (other jsonData keys) and change only ours.
    body = {
        **existing,
        **wanted,
        "jsonData": {**(existing.get("jsonData") or {}), **wanted["jsonData"]},
    }
    grafana.datasource.update_datasource(existing["id"], body)
    return "updated"


def _ensure_folder(grafana: GrafanaFace) -> Literal["created", "exists"]:
    try:
        grafana.folder.get_folder(FOLDER_UID)
        return "exists"
    except GrafanaClientError as error:
        if not _not_found(error):
            raise
    grafana.folder.create_folder(FOLDER_TITLE, uid=FOLDER_UID)
    return "created"


def _upload(grafana: GrafanaFace, path: Path) -> PushedDashboard:
    try:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DashboardError(f"{path} is not a readable dashboard JSON file: {error}") from error
    dashboard["id"] = None  # match by uid, whatever id this Grafana gave it
    response = grafana.dashboard.update_dashboard(
        {
            "dashboard": dashboard,
            "folderUid": FOLDER_UID,
            "overwrite": True,
            "message": "infergate dashboards push",
        }
    )
    return PushedDashboard(
        uid=str(response.get("uid", dashboard.get("uid"))),
        title=str(dashboard.get("title", path.stem)),
        url=str(response.get("url", "")),
        version=int(response.get("version", 0)),
    )


def _explain(error: GrafanaException, grafana_url: str) -> str:
    status = getattr(error, "status_code", None)
    if status == 401:
        return (
            f"Grafana at {grafana_url} rejected the token (401 Unauthorized): create a "
            "service-account token (Administration > Users and access > Service accounts, "
            "role Admin) and pass it with --token"
        )
    if status == 403:
        return (
            f"Grafana at {grafana_url} refused the change (403 Forbidden): the token's "
            "service account needs the Admin role to manage data sources"
        )
    if isinstance(error, GrafanaServerError):
        return f"Grafana at {grafana_url} failed: {error.message}"
    return f"Grafana at {grafana_url} answered {status}: {error.message}"
