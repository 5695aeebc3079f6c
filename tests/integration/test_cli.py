"""The command line: --version, --help, --check-config on good and bad files (FILE:LINE:COL,
the key, what is wrong), and a bad file refused at startup too."""

import re
import subprocess
import textwrap

import pytest

from conftest import free_port, sluice_bin


def run(*args, timeout=10):
    return subprocess.run([str(sluice_bin()), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def write(tmp_path, text, name="sluice.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def loc(path, needle, nth=1):
    """1-based (line, column) of the nth occurrence of needle in the file."""
    text = path.read_text()
    idx = -1
    for _ in range(nth):
        idx = text.index(needle, idx + 1)
    line = text.count("\n", 0, idx) + 1
    col = idx - (text.rfind("\n", 0, idx) + 1) + 1
    return line, col


def error_lines(stderr):
    return [l for l in stderr.splitlines() if l.strip()]


def check_error(tmp_path, text, needle, key, what, column_of=None):
    """--check-config exits 1 and prints FILE:LINE:COL: KEY: ... WHAT, where LINE:COL is the
    position of `column_of` (default: needle)."""
    p = write(tmp_path, text)
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "configuration OK" not in r.stdout
    if isinstance(column_of, tuple):  # (needle, offset from its start)
        line, col = loc(p, column_of[0])
        col += column_of[1]
    else:
        line, col = loc(p, column_of or needle)
    prefix = f"{p}:{line}:{col}: "
    matching = [l for l in error_lines(r.stderr) if l.startswith(prefix)]
    assert matching, f"no error line starting with {prefix!r} in:\n{r.stderr}"
    msg = matching[0]
    assert key in msg, msg
    assert re.search(what, msg, re.I), msg
    return r


GOOD = """
[server]
listen = "127.0.0.1:{port}"
workers = 2
max_request_header_bytes = 8192
max_request_body_bytes = 1048576
request_header_timeout = "5s"
idle_timeout = "30s"
drain_timeout = "5s"

[admin]
listen = "127.0.0.1:{admin}"

[log]
level = "debug"
access_log = "off"

[[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000", "127.0.0.1:9001"]
connect_timeout = "250ms"
response_timeout = "30s"
idle_timeout = "10s"
fail_timeout = "5s"
max_idle_connections = 8

[[upstream]]
name = "other"
endpoints = ["localhost:9002"]

[[route]]
name = "api"
match = {{ path_prefix = "/api/", methods = ["GET", "POST"] }}
upstream = "app"

[[route]]
name = "exact"
match = {{ path = "/login", host = "example.com" }}
upstream = "other"
"""


def good_text():
    return GOOD.format(port=free_port(), admin=free_port())


def test_version():
    r = run("--version")
    assert r.returncode == 0, r.stderr
    assert re.match(r"^sluice \d+\.\d+\.\d+", r.stdout), r.stdout


def test_help():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for word in ("--check-config", "-c", "--config", "--version"):
        assert word in r.stdout, (word, r.stdout)


def test_unknown_flag_is_an_error():
    r = run("--no-such-flag")
    assert r.returncode != 0
    assert "no-such-flag" in (r.stdout + r.stderr)


def test_check_config_good_file(tmp_path):
    p = write(tmp_path, good_text())
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "configuration OK"


def test_check_config_long_option(tmp_path):
    p = write(tmp_path, good_text())
    r = run("--check-config", "--config", str(p))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "configuration OK"


def test_check_config_missing_file(tmp_path):
    p = tmp_path / "nope.toml"
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1
    assert str(p) in r.stderr
    assert "configuration OK" not in r.stdout


def test_unknown_key_in_server(tmp_path):
    check_error(tmp_path, """
        [server]
        listen = "127.0.0.1:8080"
        workres = 2
        """, "workres", "server.workres", r"unknown key")


def test_unknown_top_level_table(tmp_path):
    check_error(tmp_path, """
        [sever]
        listen = "127.0.0.1:8080"
        """, "sever", "sever", r"unknown key")


def test_unknown_key_in_upstream(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]
        conect_timeout = "1s"
        """, "conect_timeout", "upstream[0].conect_timeout", r"unknown key")


def test_unknown_key_in_route_match(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]

        [[route]]
        name = "r"
        match = { path_prefx = "/api/" }
        upstream = "app"
        """, "path_prefx", "path_prefx", r"unknown key")


def test_wrong_type_integer(tmp_path):
    check_error(tmp_path, """
        [server]
        workers = "two"
        """, '"two"', "server.workers", r"expected an integer")


def test_wrong_type_array(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = "127.0.0.1:9000"
        """, '"127.0.0.1:9000"', "upstream[0].endpoints", r"expected an array")


def test_bad_duration_unit(tmp_path):
    check_error(tmp_path, """
        [server]
        idle_timeout = "10 parsecs"
        """, '"10 parsecs"', "server.idle_timeout", r"duration")


def test_bad_duration_without_unit(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]
        response_timeout = "30"
        """, '"30"', "upstream[0].response_timeout", r"duration|unit")


def test_duration_as_integer(tmp_path):
    check_error(tmp_path, """
        [server]
        drain_timeout = 5
        """, "5", "server.drain_timeout", r"duration", column_of=("drain_timeout = 5", 16))


def test_bad_listen_port(tmp_path):
    check_error(tmp_path, """
        [server]
        listen = "127.0.0.1:99999"
        """, '"127.0.0.1:99999"', "server.listen", r"port|address")


def test_bad_listen_address(tmp_path):
    check_error(tmp_path, """
        [admin]
        listen = "nonsense"
        """, '"nonsense"', "admin.listen", r"address")


def test_bad_endpoint_address(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000", "no-port-here"]
        """, '"no-port-here"', "upstream[0].endpoints[1]", r"address")


def test_route_with_unknown_upstream(tmp_path):
    check_error(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]

        [[route]]
        name = "r"
        match = { path_prefix = "/" }
        upstream = "ap"
        """, '"ap"', "route[0].upstream", r"unknown upstream")


def test_duplicate_upstream_names(tmp_path):
    # the second "app" is the duplicate
    p = write(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]

        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9001"]
        """)
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1
    line, col = loc(p, '"app"', nth=2)
    lines = [l for l in error_lines(r.stderr) if l.startswith(f"{p}:{line}:{col}: ")]
    assert lines, r.stderr
    assert "upstream[1].name" in lines[0] and "duplicate" in lines[0], lines[0]


def test_duplicate_route_names(tmp_path):
    p = write(tmp_path, """
        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]

        [[route]]
        name = "r"
        match = { path_prefix = "/a/" }
        upstream = "app"

        [[route]]
        name = "r"
        match = { path_prefix = "/b/" }
        upstream = "app"
        """)
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1
    line, col = loc(p, '"r"', nth=2)
    lines = [l for l in error_lines(r.stderr) if l.startswith(f"{p}:{line}:{col}: ")]
    assert lines, r.stderr
    assert "route[1].name" in lines[0] and "duplicate" in lines[0], lines[0]


def test_plan_lowers_token_bucket_capacity_below_cost(tmp_path):
    """A token bucket without a burst has the plan's limit as its capacity: a plan limit below
    the cost is refused at load, pointing at that value, though the plan comes first."""
    check_error(tmp_path, """
        [[plan]]
        name = "free"
        limits = { tb = 2 }

        [[limit]]
        name = "tb"
        algorithm = "token_bucket"
        by = ["ip"]
        limit = 10
        window = "1s"
        cost = 3
        """, "tb = 2", "plan[0].limits.tb", r"below the cost of limit 'tb' \(cost = 3\)",
                column_of=("tb = 2", len("tb = ")))


def test_toml_syntax_error(tmp_path):
    p = write(tmp_path, """
        [server]
        listen = "127.0.0.1:8080
        """)
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1
    assert re.match(rf"^{re.escape(str(p))}:2:\d+: ", r.stderr), r.stderr


def test_every_error_is_reported(tmp_path):
    p = write(tmp_path, """
        [server]
        workres = 2
        idle_timeout = "soon"

        [[upstream]]
        name = "app"
        endpoints = ["127.0.0.1:9000"]

        [[route]]
        name = "r"
        upstream = "nope"
        """)
    r = run("--check-config", "-c", str(p))
    assert r.returncode == 1
    lines = error_lines(r.stderr)
    for needle, key in (("workres", "server.workres"), ('"soon"', "server.idle_timeout"),
                        ('"nope"', "route[0].upstream")):
        line, col = loc(p, needle)
        assert any(l.startswith(f"{p}:{line}:{col}: ") and key in l for l in lines), (key, r.stderr)


def test_bad_file_refused_at_startup(tmp_path):
    """Without --check-config a bad file is refused too: exit 1, the error, nothing listening."""
    port = free_port()
    p = write(tmp_path, f"""
        [server]
        listen = "127.0.0.1:{port}"
        workres = 2
        """)
    r = run("-c", str(p))
    assert r.returncode == 1
    line, col = loc(p, "workres")
    assert f"{p}:{line}:{col}: " in r.stderr and "server.workres" in r.stderr, r.stderr


def test_check_config_reads_the_rls_yaml_folder(tmp_path):
    """[rls] config: envoyproxy/ratelimit's YAML files are checked with the configuration, a
    file that service refuses named with its own line and column; the folder is relative to
    the configuration file's; fixed, the configuration is OK."""
    folder = tmp_path / "ratelimit"
    folder.mkdir()
    (folder / "edge.yaml").write_text(
        "domain: edge\ndescriptors:\n  - key: remote_address\n"
        "    rate_limit: {unit: minute, requests_per_unit: 20}\n")
    (folder / "other.yaml").write_text(
        "domain: other\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n")
    r = check_error(tmp_path, """
        [rls]
        listen = "127.0.0.1:8081"
        config = "ratelimit"
        """, '"ratelimit"', "rls.config",
        re.escape(f"{folder / 'other.yaml'}:4:5: config error, unknown key 'ratelimit'"))
    assert len(error_lines(r.stderr)) == 1, r.stderr
    (folder / "other.yaml").write_text("domain: other\n")
    r = run("--check-config", "-c", str(tmp_path / "sluice.toml"))
    assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)
