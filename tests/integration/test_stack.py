"""The local stack: docker-compose.yml (validated with Debian's docker-compose, since no Docker
engine runs here), the Dockerfile built with the same scripts the tests build with, and the
configurations in conf/ that the README and the stack run."""

import re
import shutil
import subprocess

import yaml

from conftest import REPO, SLUICE_BIN


def compose_config():
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose (Debian package docker-compose) is required"
    out = subprocess.run([exe, "-f", str(REPO / "docker-compose.yml"), "config"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_file_is_valid_and_has_its_services():
    config = compose_config()
    services = config["services"]
    assert set(services) == {"valkey", "demo", "sluice", "prometheus", "grafana"}
    # Valkey 8 (the official image), loading the module the Dockerfile builds beside sluice.
    assert services["valkey"]["build"]["target"] == "valkey"
    command = services["valkey"]["command"]
    assert command[command.index("--loadmodule") + 1] == "/usr/local/lib/sluice-valkey.so"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM valkey/valkey:8 AS valkey$", dockerfile, re.M)
    assert "COPY --from=build /src/build/sluice-valkey.so /usr/local/lib/sluice-valkey.so" in \
        dockerfile
    assert services["sluice"]["build"]["target"] == "sluice"
    assert services["demo"]["build"]["target"] == "demo"
    # The admin port is published on the host's loopback only.
    ports = {str(p).split("/")[0] for p in services["sluice"]["ports"]}
    assert ports == {"127.0.0.1:8080:8080", "127.0.0.1:9901:9901"}
    assert services["sluice"]["depends_on"]["valkey"]["condition"] == "service_healthy"
    # Prometheus and Grafana (the dashboard: test_dashboard.py) on the loopback too.
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    assert {str(p).split("/")[0] for p in services["prometheus"]["ports"]} == {"127.0.0.1:9090:9090"}
    assert {str(p).split("/")[0] for p in services["grafana"]["ports"]} == {"127.0.0.1:3000:3000"}


def test_compose_appendonly_is_an_option():
    text = (REPO / "docker-compose.yml").read_text()
    assert "${VALKEY_APPENDONLY:-no}" in text
    config = compose_config()
    assert config["services"]["valkey"]["command"][:3] == ["valkey-server", "--appendonly", "no"]


def run_steps(text):
    return [line.split("RUN", 1)[1].strip() for line in text.splitlines()
            if line.strip().startswith("RUN")]


def test_dockerfile_builds_like_the_tests():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:12 AS build$", dockerfile, re.M)
    steps = run_steps(dockerfile)
    assert "scripts/deps.sh build" in steps
    assert "scripts/build.sh build" in steps
    # The tests build with the same script and the same arguments.
    test_script = (REPO / "scripts" / "test.sh").read_text()
    assert re.search(r'^stage "[^"]*" scripts/build.sh build$', test_script, re.M)
    # And the packages of the build stage are the ones the tests install.
    deps = (REPO / "scripts" / "deps.sh").read_text()
    assert 'all) packages=("${build[@]}" "${test[@]}")' in deps


def check(path):
    return subprocess.run([str(SLUICE_BIN), "--check-config", "-c", str(path)],
                          capture_output=True, text=True, timeout=30)


def test_shipped_configurations_are_valid():
    for path in [REPO / "conf" / "sluice.toml", REPO / "conf" / "docker" / "sluice.toml"]:
        out = check(path)
        assert out.returncode == 0, (path, out.stderr)
        assert out.stdout.strip() == "configuration OK"


def test_stack_configuration_points_at_the_compose_services():
    text = (REPO / "conf" / "docker" / "sluice.toml").read_text()
    assert 'address = "valkey:6379"' in text
    assert 'endpoints = ["demo:9000"]' in text
    assert 'listen = "0.0.0.0:8080"' in text
