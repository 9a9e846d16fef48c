"""The operators' kit (docker-compose.yml, ops/prometheus, ops/grafana) agrees with what kq
serve exports: a renamed metric or a mistyped uid would otherwise show up only as an empty
panel, or an alert that never fires, on a machine with Docker."""

import json
import re
import tomllib
from pathlib import Path

from prometheus_client import generate_latest

from broker.service.metrics import Metrics

OPS = Path(__file__).resolve().parents[2] / "ops"
DASHBOARD = json.loads((OPS / "grafana/dashboards/kq.json").read_text())
ALERTS = (OPS / "prometheus/alerts.yml").read_text()


def exported() -> set[str]:
    text = generate_latest(Metrics().registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))


def walk(node: object, key: str) -> list:
    """Every value under `key`, anywhere in the dashboard."""
    if isinstance(node, dict):
        return [*([node[key]] if key in node else []),
                *(v for child in node.values() for v in walk(child, key))]
    if isinstance(node, list):
        return [v for child in node for v in walk(child, key)]
    return []


def test_every_series_the_dashboard_and_the_alerts_query_is_one_kq_serve_exports():
    queries = [*walk(DASHBOARD, "expr"), ALERTS]
    named = {m for q in queries for m in re.findall(r"\bkq_[a-z_]+\b(?=\s*[{\[)>=<]|\s*$)",
                                                   q, re.MULTILINE)}
    assert len(walk(DASHBOARD, "expr")) >= 8 and named, "nothing found: the parsing broke"
    assert named - exported() == set()


def test_the_dashboard_uses_the_provisioned_datasource():
    provisioned = re.findall(r"^\s*uid:\s*(\S+)",
                             (OPS / "grafana/provisioning/datasources/prometheus.yml")
                             .read_text(), re.MULTILINE)
    used = {d["uid"] for d in walk(DASHBOARD, "datasource")
            if isinstance(d, dict) and not d.get("uid", "").startswith("--")}
    assert used and used <= set(provisioned)


def test_prometheus_scrapes_every_kq_instance_of_the_compose_file_as_job_kq():
    scrape = (OPS / "prometheus/prometheus.yml").read_text()
    assert re.search(r"job_name:\s*kq\s*$", scrape, re.MULTILINE)
    assert 'job="kq"' in ALERTS  # the lost-instance alert selects that job
    port = tomllib.loads((OPS / "compose.queues.toml").read_text())["service"]["metrics_port"]
    compose = (OPS.parent / "docker-compose.yml").read_text()
    services = set(re.findall(r"^  (kq-[a-z]+):\s*$", compose, re.MULTILINE))
    targets = set(re.findall(r'"([\w-]+):(\d+)"', scrape))
    assert services and targets == {(s, str(port)) for s in services}
