"""docker/compose.yaml, validated by a real compose tool (Debian's docker-compose: `config`), built never.

Docker itself cannot run on these machines; `docker-compose config` parses the file, checks it against the
Compose schema, resolves anchors, variables and defaults, and prints the effective configuration.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = shutil.which("docker-compose")

pytestmark = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose not found (Debian package docker-compose; the Makefile installs it)"
)


def compose_config(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMPOSE, "--project-directory", str(path.parent), "-f", str(path), "config"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def config() -> dict:
    result = compose_config(DOCKER_DIR / "compose.yaml")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_every_part_is_there(config: dict) -> None:
    assert set(config["services"]) == {"postgres", "redis", "migrate", "api", "worker", "lb"}
    assert set(config["volumes"]) == {"pgdata", "uploads", "models", "caddy"}
    assert config["services"]["api"]["deploy"]["replicas"] == 2
    assert config["services"]["worker"]["deploy"]["replicas"] == 2


def test_replicas_and_workers_share_catalog_queue_and_kv(config: dict) -> None:
    services = config["services"]
    for name in ("migrate", "api", "worker"):
        env = services[name]["environment"]
        assert env["BLENDRAG_CATALOG__URL"] == "postgresql+psycopg://blendrag:blendrag@postgres:5432/blendrag"
        assert env["BLENDRAG_KVCACHE__REDIS_URL"] == "redis://redis:6379/0"
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
    assert services["api"]["command"][:2] == ["blendrag", "serve"]
    assert services["worker"]["command"] == ["blendrag", "worker", "--data-dir", "/data"]
    assert services["migrate"]["command"] == ["blendrag", "db", "upgrade", "--data-dir", "/data"]
    assert services["worker"]["environment"]["BLENDRAG_KVCACHE__MEMORY_BYTES"] == "0"
    # uploads must be readable by whichever worker runs the job
    assert "uploads:/data/uploads:rw" in services["api"]["volumes"]
    assert "uploads:/data/uploads:rw" in services["worker"]["volumes"]
    # one model cache (the image's BLENDRAG_MODELS_DIR) for every container: the model is converted once
    for name in ("migrate", "api", "worker"):
        assert "models:/models:rw" in services[name]["volumes"]
    assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql/data:rw"]


def test_start_order_and_health_checks(config: dict) -> None:
    services = config["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert services["lb"]["depends_on"] == {"api": {"condition": "service_healthy"}}
    for name in ("postgres", "redis", "api", "worker", "lb"):
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    assert "/ready" in " ".join(services["api"]["healthcheck"]["test"])
    # only the load balancer is published
    assert [name for name, s in services.items() if s.get("ports")] == ["lb"]
    assert services["lb"]["ports"][0]["target"] == 8000 and services["lb"]["ports"][0]["published"] == 8000
    assert services["lb"]["volumes"] == [f"{DOCKER_DIR}/Caddyfile:/etc/caddy/Caddyfile:ro", "caddy:/data:rw"]
    assert (DOCKER_DIR / "Caddyfile").is_file()


def test_sizes_and_secrets_come_from_the_environment() -> None:
    result = compose_config(
        DOCKER_DIR / "compose.yaml",
        env={"API_REPLICAS": "5", "WORKERS": "3", "POSTGRES_PASSWORD": "s3cret", "BLENDRAG_PORT": "9000"},
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert (services["api"]["deploy"]["replicas"], services["worker"]["deploy"]["replicas"]) == (5, 3)
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "s3cret"
    assert services["api"]["environment"]["BLENDRAG_CATALOG__URL"].startswith("postgresql+psycopg://blendrag:s3cret@")
    assert services["lb"]["ports"][0]["published"] == 9000


def test_the_tool_rejects_a_broken_file(tmp_path: Path) -> None:
    """The check can fail: an unknown key in a service is a schema error."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        (DOCKER_DIR / "compose.yaml").read_text().replace("    stop_grace_period: 60s", "    stop_grace_periodd: 60s")
    )
    (tmp_path / "Caddyfile").write_text("")
    result = compose_config(broken)
    assert result.returncode != 0
    assert "stop_grace_periodd" in result.stderr


@pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy not found (Debian package caddy)")
def test_caddyfile_balances_over_every_api_replica() -> None:
    """Caddy's own parser turns the Caddyfile into its JSON config: the load balancer is what we meant."""
    import json

    result = subprocess.run(
        ["caddy", "adapt", "--config", str(DOCKER_DIR / "Caddyfile"), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    server = json.loads(result.stdout)["apps"]["http"]["servers"]["srv0"]
    assert server["listen"] == [":8000"]
    proxy = server["routes"][0]["handle"][0]
    assert proxy["handler"] == "reverse_proxy"
    assert proxy["dynamic_upstreams"] == {"name": "api", "port": "8000", "refresh": 5_000_000_000, "source": "a"}
    assert proxy["load_balancing"]["selection_policy"] == {"policy": "round_robin"}
    assert proxy["health_checks"]["active"]["uri"] == "/ready"
    assert proxy["flush_interval"] == -1  # SSE events are not buffered
