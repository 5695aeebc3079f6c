"""Robustness: request smuggling and CR/LF injection, through the gateway to a real upstream that
records every byte it receives.

Smuggling: each ambiguous or malformed framing (CL+TE, two Content-Lengths, obfuscated
Transfer-Encoding, obs-fold, bare LF where CRLF is required, invalid chunk sizes and
extensions, bad header names, NUL bytes) is sent with a second request ("GET /smuggled-<case>")
right behind it, in one write and also with the head first and the bad part later (the head
then may already be at the upstream). Every case gets 400 and a close, and the upstream never
sees a request it was not meant to see: no "/smuggled" request line, no connection reused after
a broken body.

Injection: a CR or LF that a client manages to put into a value Sluice writes (percent-encoded
in the path, the query, X-Forwarded-For from a trusted proxy, an API key and a header used as
rate-limit key parts, the Host; JSON escapes in a body field used as a key part) never becomes a
line break at the upstream, in a response head, in the access log (one JSON object per line) or
in a Valkey key (SCAN); raw CR / LF / NUL in those places are refused with 400.
"""

import base64
import json
import re
import time

import pytest

from conftest import limit_cfg, limit_keys, route_cfg, sluice_with_limits
from rawhttp import RawClient
from upstream import UpstreamServer


@pytest.fixture(autouse=True)
def _asan_small_quarantine(asan_small_quarantine):
    """A smaller ASan quarantine for RSS checks (conftest.asan_small_quarantine)."""


class Tap:
    """A socket whose received bytes are also appended to `buf`."""

    def __init__(self, sock, buf):
        self._sock, self._buf = sock, buf

    def recv(self, n, *args):
        data = self._sock.recv(n, *args)
        self._buf += data
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


class RecordingUpstream(UpstreamServer):
    """UpstreamServer (same endpoints) that also keeps every byte received, per connection."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.raw: dict = {}

    def _serve_conn(self, sock, rec):
        super()._serve_conn(Tap(sock, self.raw.setdefault(rec.id, bytearray())), rec)

    def all_bytes(self) -> bytes:
        with self._lock:
            return b"".join(bytes(v) for v in self.raw.values())


@pytest.fixture
def recorder():
    up = RecordingUpstream(name="rec").start()
    yield up
    up.stop()


SMUGGLED = "GET /smuggled-{} HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST /echo HTTP/1.1\r\nHost: x\r\n"
CHUNKED = POST + b"Transfer-Encoding: chunked\r\n\r\n"

# name: (bytes before the smuggled request, split point or None). With a split point the client
# sends the bytes up to it, waits until the upstream has the head (when the gateway forwarded
# it), then sends the rest and the smuggled request.
CASES = {
    # Content-Length and Transfer-Encoding
    "cl_and_te": (POST + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None),
    "te_and_cl": (POST + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", None),
    "two_content_lengths": (POST + b"Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello", None),
    "content_length_list": (POST + b"Content-Length: 5, 0\r\n\r\nhello", None),
    "content_length_plus": (POST + b"Content-Length: +5\r\n\r\nhello", None),
    # obfuscated Transfer-Encoding
    "te_xchunked": (POST + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", None),
    "te_space_before_colon": (POST + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", None),
    "te_tab_before_colon": (POST + b"Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n", None),
    "te_chunked_identity": (POST + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", None),
    "te_two_fields": (POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
                      b"0\r\n\r\n", None),
    "te_vertical_tab": (POST + b"Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n", None),
    "te_form_feed": (POST + b"Transfer-Encoding:\x0cchunked\r\n\r\n0\r\n\r\n", None),
    "te_inner_space": (POST + b"Transfer-Encoding: chu nked\r\n\r\n0\r\n\r\n", None),
    "te_leading_space_line": (b"POST /echo HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: x\r\n\r\n"
                              b"0\r\n\r\n", None),
    # obs-fold
    "obs_fold_te": (POST + b"Transfer-Encoding: identity\r\n chunked\r\n\r\n0\r\n\r\n", None),
    "obs_fold_other": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n", None),
    # bare LF
    "lf_after_request_line": (b"GET /echo HTTP/1.1\nHost: x\r\n\r\n", None),
    "lf_between_fields": (b"GET /echo HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n", None),
    "lf_ending_head": (b"GET /echo HTTP/1.1\r\nHost: x\r\n\n", None),
    "lf_lf_ending_head": (b"GET /echo HTTP/1.1\r\nHost: x\n\n", None),
    "lf_after_chunk_size": (CHUNKED + b"5\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "lf_after_chunk_data": (CHUNKED + b"5\r\nhello\n0\r\n\r\n", len(CHUNKED)),
    "lf_after_last_chunk": (CHUNKED + b"5\r\nhello\r\n0\n\n", len(CHUNKED) + 10),
    "lf_ending_trailers": (CHUNKED + b"5\r\nhello\r\n0\r\n\n", len(CHUNKED) + 10),
    # chunk sizes and extensions
    "chunk_size_overflow": (CHUNKED + b"10000000000000005\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "chunk_size_negative": (CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "chunk_size_0x": (CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "chunk_size_leading_space": (CHUNKED + b" 5\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "chunk_ext_bare_cr": (CHUNKED + b"5;a=\rb\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "chunk_ext_bare_lf": (CHUNKED + b"5;a=\nb\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    "second_chunk_bad": (CHUNKED + b"5\r\nhello\r\nzz\r\n0\r\n\r\n", len(CHUNKED) + 10),
    "chunk_data_longer": (CHUNKED + b"3\r\nhello\r\n0\r\n\r\n", len(CHUNKED)),
    # header names, NUL
    "space_in_name": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX Y: z\r\n\r\n", None),
    "space_before_colon": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A : b\r\n\r\n", None),
    "nul_in_name": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-\x00A: b\r\n\r\n", None),
    "nul_in_value": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", None),
    "nul_in_target": (b"GET /ec\x00ho HTTP/1.1\r\nHost: x\r\n\r\n", None),
    "bare_cr_in_value": (b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: a\rX-B: b\r\n\r\n", None),
    "bare_cr_after_request_line": (b"GET /echo HTTP/1.1\rHost: x\r\n\r\n", None),
}


def received_requests(up):
    with up._lock:
        return [r["target"] for r in up.requests]


def send_case(gw, up, name, split):
    payload, cut = CASES[name]
    smuggled = SMUGGLED.format(name).encode()
    before = up.request_count
    head_at_upstream = False
    with RawClient(gw.port, timeout=5) as c:
        if split is None:
            c.send(payload + smuggled)
        else:
            c.send(payload[:split])
            head_at_upstream = up.wait_for(lambda u: u.request_count > before, 0.5)
            try:
                c.send(payload[split:] + smuggled)
            except OSError:
                pass  # answered and closed already
        r = c.read_response()
        closed = c.is_closed(3)
    return r, closed, head_at_upstream


@pytest.mark.parametrize("split", [False, True], ids=["one_write", "head_first"])
def test_smuggling_attempts_refused_and_never_reach_the_upstream(sluice_factory, recorder, split):
    gw = sluice_factory(recorder)
    wrong = []
    forwarded_first = []
    for name, (payload, cut) in CASES.items():
        if split and cut is None:
            continue
        r, closed, head_at_upstream = send_case(gw, recorder, name, cut if split else None)
        if head_at_upstream:
            forwarded_first.append(name)
        if r.status != 400 or "close" not in r.connection_tokens() or not closed:
            wrong.append((name, r.status, r.header("connection"), closed, r.body[:120]))
    # after all of them: nothing smuggled, and every upstream connection that carried a request
    # refused half-way is closed (never reused for someone else's request)
    time.sleep(0.2)
    targets = received_requests(recorder)
    smuggled = [t for t in targets if "smuggled" in t]
    raw = recorder.all_bytes()
    request_lines = re.findall(rb"(?:^|\r\n)(?:GET|POST) (\S+) HTTP/1\.1\r\n", raw)
    assert not wrong, f"not 400 + close: {wrong}"
    assert not smuggled, f"the upstream received smuggled requests: {smuggled}"
    assert all(b"smuggled" not in t for t in request_lines), request_lines
    half_way = [c for c in recorder.connections if c.requests and c.open]
    assert not half_way, f"upstream connections left open after refused bodies: {half_way}"
    if split:  # the head was at the upstream before the bad part arrived, for every split case
        assert forwarded_first == [n for n, (_, cut) in CASES.items() if cut is not None]
    # and the gateway serves normally
    r = gw.get("/echo?after")
    assert r.status == 200 and r.json()["target"] == "/echo?after"
    print(f"\n[robustness] smuggling ({'head first' if split else 'one write'}): "
          f"{len(CASES) if not split else len(forwarded_first)} cases, 400 + close each, "
          f"heads forwarded before the bad part: {len(forwarded_first)}, "
          f"upstream requests: {len(targets)}, smuggled: {len(smuggled)}")


# Framings that are valid (RFC 9112: OWS is SP / HTAB, coding names are case-insensitive, chunk
# extensions are allowed) or that the RFC says to process and then close (HTTP/1.0 with
# Transfer-Encoding). The gateway may refuse them (400 + close) or forward them; when it forwards,
# the upstream gets exactly the body that was sent, and the request behind it is either refused
# or forwarded as a request of its own: the gateway and the upstream never disagree on where a
# message ends.
VALID = {
    "te_tab_ows": POST + b"Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "te_trailing_space": POST + b"Transfer-Encoding: chunked \r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "te_trailing_tab": POST + b"Transfer-Encoding: chunked\t\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "te_upper_case": POST + b"Transfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "chunk_extension": CHUNKED + b"5;name=value\r\nhello\r\n0\r\n\r\n",
    "chunk_size_upper_hex": CHUNKED + b"5\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\n",
    "trailer_field": CHUNKED + b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
    "http10_te": b"POST /echo HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"5\r\nhello\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_framings_never_desynchronize(sluice_factory, recorder, name):
    gw = sluice_factory(recorder)
    payload = VALID[name]
    expected_body = b"hello0123456789" if name == "chunk_size_upper_hex" else b"hello"
    with RawClient(gw.port, timeout=5) as c:
        c.send(payload + b"GET /echo?second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        r = c.read_response()
        if r.status == 400:
            assert "close" in r.connection_tokens() and c.is_closed(3), r
            assert recorder.request_count == 0
            print(f"\n[robustness] valid framing {name}: 400 + close, nothing forwarded")
            return
        assert r.status == 200, r
        body = r.json()
        assert base64.b64decode(body["body_b64"]) == expected_body, body
        if "close" in r.connection_tokens():
            assert c.is_closed(3)
            targets = ["/echo"]
        else:
            r2 = c.read_response()
            assert r2.status == 200 and r2.json()["target"] == "/echo?second", r2
            targets = ["/echo", "/echo?second"]
    assert received_requests(recorder) == targets
    print(f"\n[robustness] valid framing {name}: forwarded, upstream saw {targets}")


def test_chunk_size_above_the_body_cap_refused_at_once(sluice_factory, recorder):
    """A chunk that announces more than max_request_body_bytes can only end in 413: nginx
    (client_max_body_size) refuses it as soon as it reads the chunk size. Sluice must not keep
    the client (and an upstream connection) waiting for bytes it will refuse anyway."""
    gw = sluice_factory(recorder, server={"max_request_body_bytes": 1000, "idle_timeout": "2s"})
    with RawClient(gw.port, timeout=8) as c:
        t0 = time.monotonic()
        c.send(CHUNKED + b"ffffffffffffffff\r\nhello")
        r = c.read_response()
        took = time.monotonic() - t0
        assert r.status == 413 and took < 1.0, (r, round(took, 2))
        assert c.is_closed(3)
    assert recorder.request_count == 0, received_requests(recorder)


# ------------------------------------------------------------------------------ injection

CRLF = "%0d%0a"
INJ = "X-Injected: yes"


def head_lines_ok(raw_head: bytes) -> list:
    """Problems of a raw head (request or response): a CR or LF anywhere but in CRLF pairs, a
    field line that is not `name: value`, an X-Injected field."""
    problems = []
    body = raw_head[:-2] if raw_head.endswith(b"\r\n") else raw_head
    lines = body.split(b"\r\n")
    for i, line in enumerate(lines):
        if b"\r" in line or b"\n" in line or b"\x00" in line:
            problems.append(("bare CR/LF/NUL", line))
        if i == 0 or not line:
            continue
        if not re.fullmatch(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*[^\r\n]*", line):
            problems.append(("not a field line", line))
        if line.lower().startswith(b"x-injected"):
            problems.append(("injected field", line))
    return problems


def upstream_heads(up) -> list:
    """Every request head the upstream received, raw (from the recorded bytes: the head ends at
    the first CRLF CRLF; the requests here have no bodies but the JSON ones, whose framing is
    Content-Length)."""
    heads = []
    with up._lock:
        streams = [bytes(v) for v in up.raw.values()]
    for data in streams:
        while data:
            head, sep, rest = data.partition(b"\r\n\r\n")
            heads.append(head + b"\r\n")
            m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
            n = int(m.group(1)) if m else 0
            data = rest[n:] if sep else b""
    return heads


@pytest.fixture
def injection_gateway(sluice_factory, recorder, valkey, tmp_path):
    log_path = tmp_path / "access.jsonl"
    limits = [limit_cfg("by_key", "fixed_window", 100, "1h", by=["api_key"]),
              limit_cfg("by_user", "fixed_window", 100, "1h", by=["header:X-User"]),
              limit_cfg("by_query", "fixed_window", 100, "1h", by=["query:user"]),
              limit_cfg("by_ip", "fixed_window", 100, "1h", by=["ip"]),
              limit_cfg("by_json", "fixed_window", 100, "1h", by=["json:user"]),
              limit_cfg("tight", "fixed_window", 1, "1h", by=["header:X-Tight"])]
    routes = [route_cfg("login", ["by_json"], match={"path": "/echo/login", "methods": ["POST"]}),
              route_cfg("api", ["by_key", "by_user", "by_query", "by_ip", "tight"])]
    gw = sluice_with_limits(sluice_factory, recorder, valkey, limits, routes,
                            identity={"trusted_proxies": ["127.0.0.1/32"]},
                            log={"access_log": str(log_path)})
    gw.access_log = log_path
    return gw


INJECTIONS = {
    # name: (method, target, [(field, value)], body)
    "path": ("GET", f"/echo/a{CRLF}{INJ.replace(' ', '%20')}", [], b""),
    "path_upper": ("GET", f"/echo/%0D%0A{INJ.replace(' ', '%20')}/%0A%0D", [], b""),
    "query": ("GET", f"/echo?q={CRLF}{INJ.replace(' ', '%20')}&user=u{CRLF}{INJ.replace(' ', '%20')}",
              [], b""),
    "xff_trusted": ("GET", "/echo", [("X-Forwarded-For", f"203.0.113.9{CRLF}{INJ}, 198.51.100.7")], b""),
    "xff_client_ip": ("GET", "/echo", [("X-Forwarded-For", f"203.0.113.{CRLF}7")], b""),
    "api_key": ("GET", "/echo", [("X-API-Key", f"key{CRLF}{INJ}")], b""),
    "header_key_part": ("GET", "/echo", [("X-User", f"u{CRLF}{INJ}")], b""),
    "host": ("GET", "/echo", [("Host", f"evil.test{CRLF}{INJ}")], b""),
    "host_encoded_only": ("GET", "/echo", [("Host", f"evil.test{CRLF}")], b""),
    "json_key_part": ("POST", "/echo/login", [("Content-Type", "application/json")],
                      json.dumps({"user": "u\r\nX-Injected: yes\n\r"}).encode()),
    "tight_first": ("GET", f"/echo?user={CRLF}", [("X-Tight", f"t{CRLF}{INJ}")], b""),
    "tight_429": ("GET", f"/echo?user={CRLF}", [("X-Tight", f"t{CRLF}{INJ}")], b""),
}

RAW_REFUSED = {
    "raw_cr_in_xff": b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.2.3.4\rX-Injected: yes\r\n\r\n",
    "raw_lf_in_api_key": b"GET /echo HTTP/1.1\r\nHost: x\r\nX-API-Key: k\nX-Injected: yes\r\n\r\n",
    "raw_cr_in_host": b"GET /echo HTTP/1.1\r\nHost: a\rX-Injected: yes\r\n\r\n",
    "raw_cr_in_target": b"GET /echo\rX-Injected: HTTP/1.1\r\nHost: x\r\n\r\n",
    "raw_nul_in_key_part": b"GET /echo HTTP/1.1\r\nHost: x\r\nX-User: u\x00v\r\n\r\n",
}


def test_crlf_never_becomes_a_line_break(injection_gateway, recorder, valkey):
    gw = injection_gateway
    answers = {}
    for name, (method, target, fields, body) in INJECTIONS.items():
        with RawClient(gw.port, timeout=5) as c:
            fields = fields if any(f == "Host" for f, _ in fields) else [("Host", "x")] + fields
            c.send(f"{method} {target} HTTP/1.1\r\n".encode()
                   + b"".join(f"{f}: {v}\r\n".encode("latin-1") for f, v in fields)
                   + (f"Content-Length: {len(body)}\r\n".encode() if body else b"")
                   + b"Connection: close\r\n\r\n" + body)
            r = c.read_response()
            answers[name] = r
    for name, raw in RAW_REFUSED.items():
        with RawClient(gw.port, timeout=5) as c:
            c.send(raw)
            r = c.read_response()
            answers[name] = r
            assert r.status == 400 and c.is_closed(3), (name, r)

    statuses = {n: r.status for n, r in answers.items()}
    # every response head the client got: CRLF line structure intact, nothing injected
    bad = {n: head_lines_ok(r.raw_head) for n, r in answers.items() if head_lines_ok(r.raw_head)}
    assert not bad, bad
    # the second "tight" one is refused by its limit (a 429 with RateLimit fields and a
    # problem+json body), the others go through (a gateway may refuse a Host that is not a valid
    # host name, with 400)
    assert statuses["tight_429"] == 429, answers["tight_429"]
    assert statuses["host"] in (200, 400) and statuses["host_encoded_only"] in (200, 400), statuses
    assert all(s == 200 for n, s in statuses.items()
               if n not in ("tight_429", "host", "host_encoded_only") and n not in RAW_REFUSED), statuses

    # the upstream: every head it received keeps its CRLF structure, no X-Injected field
    time.sleep(0.2)
    heads = upstream_heads(recorder)
    assert heads, "nothing reached the upstream"
    bad = [(h[:200], head_lines_ok(h)) for h in heads if head_lines_ok(h)]
    assert not bad, bad
    with recorder._lock:
        for req in recorder.requests:
            for n, v in req["headers"]:
                assert n.lower() != "x-injected" and "\r" not in v and "\n" not in v, req

    # the access log: one JSON object per line, one line per request
    deadline = time.monotonic() + 5
    n_requests = len(answers)
    while time.monotonic() < deadline:
        data = gw.access_log.read_bytes()
        if data.count(b"\n") >= n_requests:
            break
        time.sleep(0.05)
    time.sleep(0.2)
    data = gw.access_log.read_bytes()
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    assert len(lines) == n_requests, (len(lines), n_requests, data[-2000:])
    assert b"\r" not in data
    recs = [json.loads(line.decode("utf-8")) for line in lines]
    assert all(isinstance(x, dict) for x in recs)

    # Valkey: no key with a CR or LF (values with them are hashed), every key under the prefix
    keys = limit_keys(valkey.client)
    bad_keys = [k for k in keys if "\r" in k or "\n" in k or "\x00" in k]
    assert not bad_keys, bad_keys
    assert {k.split(":")[2] for k in keys if k.startswith("rl:v2:")} >= \
        {"by_key", "by_user", "by_query", "by_ip", "by_json", "tight"}, keys
    print(f"\n[robustness] injection: statuses={statuses}, upstream_heads={len(heads)}, "
          f"log_lines={len(lines)}, valkey_keys={keys}")


def test_bare_cr_or_lf_in_an_upstream_response_head_never_reaches_the_client(sluice_factory,
                                                                             recorder):
    """The response path: an upstream field value with a bare CR or LF (upstream.py writes the
    query's decoded values as fields) is refused (502) or cleaned, never passed on as a line
    break."""
    gw = sluice_factory(recorder)
    seen = []
    for q in ("X-A=a%0dX-Injected:%20yes", "X-A=a%0aX-Injected:%20yes", "X-A=a%00b"):
        with RawClient(gw.port, timeout=5) as c:
            c.request("GET", f"/response-headers?{q}", [("Connection", "close")])
            try:
                r = c.read_response()
            except (EOFError, ValueError) as e:
                pytest.fail(f"{q}: unreadable response: {e}")
            assert r.status in (200, 502), (q, r)
            seen.append((q, r.status))
            assert not head_lines_ok(r.raw_head), (q, head_lines_ok(r.raw_head))
    assert gw.get("/echo").status == 200
    print(f"\n[robustness] upstream response heads with bare CR/LF/NUL: {seen}")


def test_chunk_size_near_2_64_cannot_wrap_the_body_cap(sluice_factory, recorder):
    """After a first chunk, a size of 2^64 - 3 would wrap body_bytes + size below the cap and
    skip the early 413: the check is done without a sum that can wrap."""
    gw = sluice_factory(recorder, server={"max_request_body_bytes": 1000, "idle_timeout": "3s"})
    for size in (b"fffffffffffffffd", b"ffffffffffffffff"):  # 5 + size wraps to 2, to 4
        with RawClient(gw.port, timeout=8) as c:
            t0 = time.monotonic()
            c.send(CHUNKED + b"5\r\nhello\r\n" + size + b"\r\nhello")
            r = c.read_response()
            took = time.monotonic() - t0
            assert r.status == 413 and took < 1.0, (size, r, round(took, 2))
            assert c.is_closed(3)
    assert gw.get("/echo").status == 200


def test_empty_field_name_refused(sluice_factory, recorder):
    """RFC 9110 5.1: a field name is a token. ': Transfer-Encoding: chunked' (a field without a
    name) is 400 and never forwarded, wherever it is in the head."""
    gw = sluice_factory(recorder)
    for head in (b"POST /echo HTTP/1.1\r\nHost: x\r\n: Transfer-Encoding: chunked\r\n"
                 b"Content-Length: 5\r\n\r\nhello",
                 b"GET /echo HTTP/1.1\r\n: x\r\nHost: x\r\n\r\n",
                 b"GET /echo HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n:\r\n\r\n"):
        with RawClient(gw.port, timeout=5) as c:
            c.send(head + SMUGGLED.format("empty_name").encode())
            r = c.read_response()
            assert r.status == 400 and c.is_closed(3), (head, r)
    # trailers too
    with RawClient(gw.port, timeout=5) as c:
        c.send(CHUNKED + b"5\r\nhello\r\n0\r\n: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 400 and c.is_closed(3), r
    assert b": Transfer-Encoding" not in recorder.all_bytes()
    assert not [t for t in received_requests(recorder) if "smuggled" in t]


def test_transfer_codings_forwarded_as_they_came(sluice_factory, recorder):
    """Transfer-Encoding: gzip, chunked: the body is re-chunked, and the gzip coding goes on
    with it (the upstream would otherwise take a coded body for the representation)."""
    gw = sluice_factory(recorder)
    coded = bytes(range(256)) * 4
    with RawClient(gw.port, timeout=5) as c:
        c.send(POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n"
               + b"%x\r\n" % len(coded) + coded + b"\r\n0\r\n\r\n")
        r = c.read_response()
    assert r.status == 200, r
    got = r.json()
    te = [v for n, v in got["headers"] if n.lower() == "transfer-encoding"]
    assert te == ["gzip, chunked"], got["headers"]
    assert base64.b64decode(got["body_b64"]) == coded
    # plain chunked stays plain chunked
    with RawClient(gw.port, timeout=5) as c:
        c.send(CHUNKED + b"5\r\nhello\r\n0\r\n\r\n")
        got = c.read_response().json()
    assert [v for n, v in got["headers"] if n.lower() == "transfer-encoding"] == ["chunked"]


def test_http10_with_transfer_encoding_closes_after_the_response(sluice_factory, recorder):
    """RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing; it is
    answered and the connection is closed, even with Connection: keep-alive, so that the bytes
    after it are never read as a request."""
    gw = sluice_factory(recorder)
    with RawClient(gw.port, timeout=5) as c:
        c.send(b"POST /echo HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
               + SMUGGLED.format("http10_te").encode())
        r = c.read_response()
        assert r.status in (200, 400), r
        assert "close" in r.connection_tokens() and c.is_closed(3), r
    assert not [t for t in received_requests(recorder) if "smuggled" in t]
    # HTTP/1.0 keep-alive without Transfer-Encoding still keeps the connection
    with RawClient(gw.port, timeout=5) as c:
        c.send(b"POST /echo HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
               b"Content-Length: 5\r\n\r\nhello")
        r = c.read_response()
        assert r.status == 200 and "close" not in r.connection_tokens(), r
        c.send(b"GET /echo?second HTTP/1.0\r\nHost: x\r\n\r\n")
        assert c.read_response().json()["target"] == "/echo?second"
