"""Operations: the access log. One JSON object per line and per request, to a file, to stdout,
or nowhere; every field; API keys only as a fingerprint; no client byte can add a line; the
writer never blocks the gateway (a stalled FIFO drops lines and counts them instead)."""

import datetime
import json
import os
import select
import threading
import time

from conftest import (free_port, hashed_part, limit_cfg, metric_sum, route_cfg, sluice_with_limits)
from rawhttp import RawClient, build_request

API_KEY = "sk_live_Sluice_SECRET_7f3a9c"


def read_lines(path, n, timeout=5.0, settle=0.3):
    """Waits until `path` holds at least n lines (the writer is asynchronous), then a little
    longer, so that a surplus line would be seen too. Every line must be UTF-8 JSON."""
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        data = path.read_bytes() if path.exists() else b""
        if data.count(b"\n") >= n:
            break
        time.sleep(0.02)
    time.sleep(settle)
    data = path.read_bytes() if path.exists() else b""
    assert data == b"" or data.endswith(b"\n"), f"last line not terminated: {data[-200:]!r}"
    out = []
    for raw in data.split(b"\n")[:-1] if data else []:
        text = raw.decode("utf-8")  # strict: RFC 8259 text is UTF-8
        obj = json.loads(text)
        assert isinstance(obj, dict), text
        out.append(obj)
    return out


def raw_response(c, method="GET"):
    r = c.read_response(method)
    return r, len(r.raw_head) + len(r.body)


def assert_common(rec):
    t = datetime.datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    now = datetime.datetime.utcnow()
    assert abs((now - t).total_seconds()) < 60, rec["time"]
    assert isinstance(rec["request_id"], str) and rec["request_id"], rec
    assert rec["peer"] == "127.0.0.1", rec
    assert isinstance(rec["duration_ms"], (int, float)) and rec["duration_ms"] >= 0, rec
    assert isinstance(rec["bytes_in"], int) and isinstance(rec["bytes_out"], int), rec


def test_access_log_file_one_json_object_per_request_with_every_field(sluice_factory, upstream,
                                                                      valkey, tmp_path):
    log_path = tmp_path / "access.jsonl"
    limits = [limit_cfg("per_client", "fixed_window", 2, "1h", by=["header:X-Client"]),
              limit_cfg("per_key", "token_bucket", 100, "1h", by=["api_key"])]
    routes = [route_cfg("down", upstream="dead", match={"host": "down.test"}),
              route_cfg("api", ["per_client", "per_key"], match={"path_prefix": "/echo"})]
    upstreams = [{"name": "app", "endpoints": [upstream]},
                 {"name": "dead", "endpoints": [free_port()], "fail_timeout": "0s"}]
    gw = sluice_with_limits(sluice_factory, None, valkey, limits, routes, upstreams=upstreams,
                            identity={"trusted_proxies": ["127.0.0.1/32"]},
                            tenants=[{"name": "acme", "api_keys": [API_KEY]}],
                            log={"access_log": str(log_path)})
    sent = []
    with RawClient(gw.port) as c:
        c.request("GET", "/echo?q=1", [("X-Client", "c1"), ("X-API-Key", API_KEY),
                                       ("X-Forwarded-For", "203.0.113.7")])
        sent.append(raw_response(c))
        c.request("POST", "/echo", [("X-Client", "c1")], body=b"hello world")
        sent.append(raw_response(c))
        c.request("GET", "/echo", [("X-Client", "c1")])
        sent.append(raw_response(c))
        c.request("GET", "/nope")
        sent.append(raw_response(c))
        c.request("GET", "/echo", [("Host", "down.test")])
        sent.append(raw_response(c))
    assert [r.status for r, _ in sent] == [200, 200, 429, 404, 502]

    recs = read_lines(log_path, len(sent))
    assert len(recs) == len(sent), recs
    for rec, (r, size) in zip(recs, sent):
        assert_common(rec)
        assert rec["status"] == r.status, (rec, r)
        assert rec["bytes_out"] == size, (rec, size)
    assert len({rec["request_id"] for rec in recs}) == len(recs)

    ok, post, limited, missing, bad_gateway = recs
    # 200 through a trusted proxy, with an API key of tenant acme
    assert ok["method"] == "GET" and ok["path"] == "/echo" and ok["route"] == "api", ok
    assert ok["client"] == "203.0.113.7" and ok["peer"] == "127.0.0.1", ok
    assert ok["upstream"] == "app" and ok["endpoint"] == upstream.address, ok
    assert ok["upstream_ms"] >= 0 and ok["valkey_ms"] >= 0, ok
    assert ok["duration_ms"] >= ok["upstream_ms"], ok
    assert ok["bytes_in"] == 0
    assert ok["tenant"] == "acme", ok
    assert ok["api_key_id"] == hashed_part(API_KEY)[:17], ok
    assert ok["limits"] == [{"name": "per_client", "outcome": "allowed", "remaining": 1},
                            {"name": "per_key", "outcome": "allowed", "remaining": 99}], ok
    # a body
    assert post["method"] == "POST" and post["bytes_in"] == 11, post
    assert post["client"] == "127.0.0.1", post
    assert "tenant" not in post and "api_key_id" not in post, post
    assert post["limits"] == [{"name": "per_client", "outcome": "allowed", "remaining": 0}], post
    # 429: decided, never forwarded
    assert limited["route"] == "api" and limited["status"] == 429, limited
    assert limited["limits"] == [{"name": "per_client", "outcome": "denied", "remaining": 0}]
    assert "upstream_ms" not in limited, limited
    assert limited["valkey_ms"] >= 0, limited
    # 404: no route, no limits, no Valkey
    assert missing["route"] == "" and missing["path"] == "/nope", missing
    assert "limits" not in missing and "valkey_ms" not in missing, missing
    assert "upstream_ms" not in missing, missing
    # 502
    assert bad_gateway["route"] == "down" and bad_gateway["upstream"] == "dead", bad_gateway
    assert "upstream_ms" not in bad_gateway, bad_gateway

    assert API_KEY.encode() not in log_path.read_bytes(), "the API key itself is in the access log"
    assert API_KEY not in gw.stderr()


def test_access_log_stdout(sluice_factory, upstream, tmp_path):
    """Lines on the process's stdout: written while it runs, and none lost at exit (the last
    requests are followed at once by SIGTERM)."""
    gw = sluice_factory(upstream, log={"access_log": "stdout"})
    stdout = gw.stderr_path.with_suffix(".stdout")
    assert gw.get("/status/200").status == 200
    assert len(read_lines(stdout, 1, settle=0)) == 1, "no line on stdout while running"
    for i in (1, 2):
        assert gw.get(f"/status/20{i}").status == 200 + i
    assert gw.stop() == 0
    recs = read_lines(stdout, 3, timeout=0.1, settle=0)
    assert [(r["path"], r["status"], r["route"]) for r in recs] == \
        [("/status/200", 200, "all"), ("/status/201", 201, "all"), ("/status/202", 202, "all")]
    assert '"request_id"' not in gw.stderr(), "access log lines on stderr"


def test_access_log_off_writes_nothing(sluice_factory, upstream, tmp_path):
    gw = sluice_factory(upstream, log={"access_log": "off"})
    before = set(os.listdir(tmp_path))
    for _ in range(3):
        assert gw.get("/echo").status == 200
    assert gw.get("/nope-but-routed").status == 404  # the upstream's 404
    time.sleep(0.3)
    assert gw.stderr_path.with_suffix(".stdout").read_bytes() == b""
    assert '"request_id"' not in gw.stderr()
    assert set(os.listdir(tmp_path)) == before


def send_and_read_all(port, raw):
    """Sends one raw request (which asks for, or gets, a close) and reads until EOF: the status
    and the number of bytes the client received."""
    with RawClient(port) as c:
        c.send(raw)
        data = b""
        while True:
            chunk = c.recv_some()
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else -1
    return status, len(data)


ODD = b'a"b\\c\xff\xfe}{\\u2028'  # quote, backslash, obs-text (allowed in field values)


def test_access_log_client_bytes_never_make_an_extra_line(sluice_factory, upstream, valkey,
                                                           tmp_path):
    """Encoded CR LF in the path, bytes above 0x7f, quotes and backslashes in the header fields
    the log reads (X-Forwarded-For from a trusted proxy, the API key, a key part), control bytes
    that the parser refuses: exactly one valid JSON line per request, whatever the status."""
    log_path = tmp_path / "access.jsonl"
    limits = [limit_cfg("per_client", "fixed_window", 1000, "1h", by=["header:X-Client"])]
    gw = sluice_with_limits(sluice_factory, upstream, valkey, limits,
                            identity={"trusted_proxies": ["127.0.0.1/32"]},
                            log={"access_log": str(log_path)})
    close = b"Connection: close\r\n"
    raws = [
        b"GET /echo/%0d%0a{\"status\":200}%0D%0AInjected HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n",
        b"GET /echo?x=%0a%0d%22 HTTP/1.1\r\nHost: x\r\nX-Client: " + ODD + b"\r\n" + close + b"\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.2.3.4" + ODD + b", \"}\r\n" + close + b"\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-API-Key: " + ODD + b"\r\n" + close + b"\r\n",
        b"GET /echo HTTP/1.1\r\nHost: \xff\"x\r\nUser-Agent: " + ODD + b"\r\n" + close + b"\r\n",
        b"GET /a\"b\\c HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n",
        b"GET /%E2%80%A8%E2%80%A9/echo HTTP/1.1\r\nHost: x\r\nX-Client: \xe2\x80\xa8\r\n" + close + b"\r\n",
        # refused by the parser or the target rules: 400, still one line each
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Client: a\x01b\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Odd: \x1b[31m\x7f\r\n\r\n",
        b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a%00b HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n",
    ]
    statuses = [send_and_read_all(gw.port, raw)[0] for raw in raws]
    # The fifth has an invalid Host ("\xff\"x"): refused with 400 rather than forwarded.
    assert statuses[:7] == [200, 200, 200, 200, 400, 404, 404], statuses
    assert statuses[7:] == [400] * 4, statuses

    recs = read_lines(log_path, len(raws))
    assert len(recs) == len(raws), f"{len(recs)} lines for {len(raws)} requests"
    assert [r["status"] for r in recs] == statuses
    data = log_path.read_bytes()
    assert data.count(b"\n") == len(raws)
    for line in data.split(b"\n")[:-1]:
        assert line.startswith(b'{"time":') and line.endswith(b"}"), line
        assert not any(b < 0x20 for b in line), line
    assert b"\nInjected" not in data
    assert recs[0]["path"].endswith("Injected") and "\n" not in recs[0]["path"], recs[0]
    assert recs[5]["path"] == '/a"b\\c', recs[5]
    assert recs[2]["client"] == "127.0.0.1", recs[2]  # a malformed hop is never the client
    assert recs[3]["api_key_id"] == hashed_part(ODD)[:17], recs[3]
    assert "a\"b\\c" not in data.decode(), "the raw API key is in the log"


def test_access_log_requests_answered_by_the_gateway_itself(sluice_factory, upstream, tmp_path):
    """404 (no route), 400 (NUL in the target), 400 (malformed head), 431, 405: each logged once
    with the client's address (here the peer: nothing else is known), a request id of its own,
    and bytes_out equal to what the client received."""
    log_path = tmp_path / "access.jsonl"
    gw = sluice_factory(upstream, routes=[route_cfg("api", match={"path_prefix": "/echo"})],
                        server={"max_request_header_bytes": 1024},
                        log={"access_log": str(log_path)})
    close = [("Connection", "close")]
    raws = [
        build_request("GET", "/echo", close),                      # 200, for comparison
        build_request("GET", "/nope", close),                      # 404: no route
        build_request("GET", "/echo/a%00b", close),                # 400: NUL in the target
        b"GET /echo HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",   # 400: parser
        build_request("GET", "/echo", [("X-Big", "b" * 2000)] + close),   # 431
        build_request("CONNECT", "example.com:443", close),        # 405
    ]
    answers = [send_and_read_all(gw.port, raw) for raw in raws]
    assert [s for s, _ in answers] == [200, 404, 400, 400, 431, 405], answers
    recs = read_lines(log_path, len(raws))
    assert [r["status"] for r in recs] == [s for s, _ in answers], recs
    problems = []
    for rec, (status, size) in zip(recs, answers):
        if rec["client"] != "127.0.0.1":
            problems.append(f"{status}: client {rec['client']!r}, want the peer 127.0.0.1")
        if not rec["request_id"]:
            problems.append(f"{status}: empty request_id")
        if rec["bytes_out"] != size:
            problems.append(f"{status}: bytes_out {rec['bytes_out']} but the client got {size}")
    ids = [r["request_id"] for r in recs]
    if len(set(ids)) != len(ids):
        problems.append(f"request ids not unique: {ids}")
    assert not problems, "\n".join(problems) + "\n" + "\n".join(map(json.dumps, recs))


def test_access_log_2000_requests_all_logged(sluice_factory, upstream, tmp_path):
    """2000 requests on 4 keep-alive connections: all answered, 2000 lines, nothing dropped, and
    sluice_access_log_dropped_total is exposed."""
    log_path = tmp_path / "access.jsonl"
    gw = sluice_factory(upstream, log={"access_log": str(log_path)})
    per_client = 500
    errors = []

    def run(k):
        try:
            with RawClient(gw.port, timeout=10) as c:
                for i in range(0, per_client, 50):
                    c.send(b"".join(build_request("GET", f"/status/200?c={k}&i={i + j}")
                                    for j in range(50)))
                    for _ in range(50):
                        r = c.read_response()
                        if r.status != 200:
                            errors.append(r.status)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - t0
    assert not errors, errors[:5]
    assert elapsed < 20, f"2000 requests took {elapsed:.1f}s"
    recs = read_lines(log_path, 2000, timeout=10)
    assert len(recs) == 2000
    assert len({r["request_id"] for r in recs}) == 2000
    status, text = gw.admin_get("/metrics")
    assert "\nsluice_access_log_dropped_total 0\n" in text, \
        [l for l in text.splitlines() if "dropped" in l]
    assert metric_sum(gw, "sluice_requests_total", route="all", status="200") == 2000


def test_access_log_on_a_stalled_fifo_drops_lines_never_blocks(sluice_factory, upstream, tmp_path):
    """The log goes to a FIFO whose reader never reads: the writer thread blocks, yet 12000
    requests are answered at full speed; the lines that did not fit are counted in
    sluice_access_log_dropped_total, and written + dropped = requests once the reader reads."""
    fifo = tmp_path / "access.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = bytearray()
    stop_reading = threading.Event()
    reading = None
    try:
        # No route for /x: the gateway answers 404 itself, fast, and logs it.
        gw = sluice_factory(upstream, routes=[route_cfg("only", match={"path": "/only"})],
                            log={"access_log": str(fifo)})
        n_conn, per_conn, batch = 4, 3000, 500
        errors = []

        def run(k):
            try:
                with RawClient(gw.port, timeout=10) as c:
                    for i in range(0, per_conn, batch):
                        c.send(build_request("GET", f"/x?c={k}&i={i}") * batch)
                        for _ in range(batch):
                            if c.read_response().status != 404:
                                errors.append("status")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        t0 = time.monotonic()
        threads = [threading.Thread(target=run, args=(k,)) for k in range(n_conn)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads), "requests blocked behind the access log"
        assert not errors, errors[:5]
        total = n_conn * per_conn
        assert elapsed < 20, f"{total} requests took {elapsed:.1f}s with a stalled log"
        assert gw.admin_get("/healthz")[0] == 200
        deadline = time.monotonic() + 2  # counted once the response went to the socket
        while metric_sum(gw, "sluice_requests_total", status="404") != total \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert metric_sum(gw, "sluice_requests_total", status="404") == total
        # Read once every request is counted: the last ones may still have been logged (or
        # dropped) after the clients had their responses, each right after it was counted.
        time.sleep(0.1)
        dropped = metric_sum(gw, "sluice_access_log_dropped_total")
        assert dropped > 0, "a stalled log target dropped nothing: was it written at all?"

        def drain():
            while not stop_reading.is_set():
                r, _, _ = select.select([reader], [], [], 0.1)
                if r:
                    try:
                        chunk = os.read(reader, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        # writer closed: EOF (or no writer yet)
                        if gw.stopped:
                            return
                        time.sleep(0.02)
                        continue
                    got.extend(chunk)

        reading = threading.Thread(target=drain)
        reading.start()
        rc = gw.stop(timeout=10)
        assert rc == 0, gw.stderr()[-3000:]
    finally:
        stop_reading.set()
        if reading:
            reading.join(5)
        os.close(reader)
    lines = bytes(got).split(b"\n")
    assert lines[-1] == b""
    for line in lines[:-1]:
        json.loads(line)
    written = len(lines) - 1
    assert written + dropped == total, (written, dropped, total)


def test_access_log_refused_before_the_target_is_parsed_logs_the_path_only(sluice_factory,
                                                                          upstream, tmp_path):
    """A request refused before its target was parsed (417 for an Expect it does not know, 400
    for a malformed %-escape) is logged with its path only: a query can carry a secret
    (/reset?token=...), and the log never shows it, whatever answered the request."""
    log_path = tmp_path / "access.jsonl"
    gw = sluice_factory(upstream, log={"access_log": str(log_path)})
    close = [("Connection", "close")]
    raws = [
        build_request("GET", "/reset?token=SECRET1", [("Expect", "magic")] + close),   # 417
        build_request("GET", "/reset%zz?token=SECRET2", close),                        # 400
        build_request("GET", "http://h.example/reset?token=SECRET3", [("Expect", "x")] + close),
        build_request("GET", "/echo?token=SECRET4", close),                            # 200
    ]
    answers = [send_and_read_all(gw.port, raw)[0] for raw in raws]
    assert answers == [417, 400, 417, 200], answers
    recs = read_lines(log_path, len(raws))
    assert [r["path"] for r in recs] == ["/reset", "/reset%zz", "http://h.example/reset",
                                         "/echo"], recs
    assert "SECRET" not in log_path.read_text()
