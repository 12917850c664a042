"""Grafana dashboards as code, and getting them to people.

- ``builders``: typed dataclasses rendering Grafana's dashboard JSON model.
- ``boards``/``backend``: the Overview, Model, Rollout and Backend dashboards.
- ``generate``: writes them to the repository's ``dashboards/`` folder (checked in).
- ``push``: uploads them and their data source to a Grafana (grafana-api).
- ``snapshot``: renders the key panels to PNG from Prometheus, without Grafana.
- ``cli``: the ``infergate dashboards ...`` commands.
"""
