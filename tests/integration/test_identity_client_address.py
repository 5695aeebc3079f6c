"""Who the client is, network-wise: the peer, unless it is a trusted proxy; then X-Forwarded-For
(or RFC 7239 Forwarded) walked from right to left. Checked through the budgets the gateway
keeps and the keys it writes in Valkey."""

import pytest

from conftest import limit_cfg, limit_keys, sluice_with_limits

TRUSTED = {"trusted_proxies": ["127.0.0.1/32", "10.0.0.0/8"]}


def per_ip_gateway(sluice_factory, upstream, valkey, identity=None, limit=2):
    return sluice_with_limits(sluice_factory, upstream, valkey,
                              [limit_cfg("per_ip", "fixed_window", limit, "1h")],
                              identity=identity)


def clients(valkey, limit="per_ip"):
    """The client part of every key of `limit` ("rl:v2:<limit>:{<client>}")."""
    prefix = f"rl:v2:{limit}:"
    keys = limit_keys(valkey.client, prefix + "*")
    assert all(k.startswith(prefix + "{") and k.endswith("}") for k in keys), keys
    return sorted(k[len(prefix) + 1:-1] for k in keys)


def statuses(gw, headers_list):
    return [gw.get("/status/200", h).status for h in headers_list]


def test_forwarded_headers_from_untrusted_peer_never_change_the_budget(sluice_factory, upstream,
                                                                       valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey)
    spoofs = [[("X-Forwarded-For", "203.0.113.1")],
              [("X-Forwarded-For", "203.0.113.2, 10.0.0.1")],
              [("Forwarded", "for=198.51.100.3")],
              [("X-Real-IP", "198.51.100.4")],
              [("X-Forwarded-For", "2001:db8::1")],
              []]
    assert statuses(gw, spoofs) == [200, 200, 429, 429, 429, 429]
    assert clients(valkey) == ["127.0.0.1"]


def test_trusted_chain_picks_the_first_untrusted_hop_from_the_right(sluice_factory, upstream, valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=TRUSTED)
    a = [("X-Forwarded-For", "203.0.113.9, 10.0.0.2")]
    a_spoofed = [("X-Forwarded-For", "6.6.6.6, 203.0.113.9, 10.0.0.7")]  # the left part is the client's
    a_split = [("X-Forwarded-For", "203.0.113.9"), ("X-Forwarded-For", "10.1.2.3")]  # one list
    b = [("X-Forwarded-For", "198.51.100.7, 10.0.0.2")]
    assert statuses(gw, [a, a_spoofed, a_split]) == [200, 200, 429]
    assert statuses(gw, [b, b, b]) == [200, 200, 429], "another client has its own budget"
    assert clients(valkey) == ["198.51.100.7", "203.0.113.9"]
    echoed = gw.get("/echo", [("X-Forwarded-For", "192.0.2.55, 10.0.0.2")]).json()["headers"]
    assert [v for n, v in echoed if n.lower() == "x-real-ip"] == ["192.0.2.55"]


def test_only_listed_proxies_are_trusted(sluice_factory, upstream, valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey,
                        identity={"trusted_proxies": ["127.0.0.1/32"]})
    h = [("X-Forwarded-For", "203.0.113.9, 10.0.0.2")]
    assert statuses(gw, [h, h, h]) == [200, 200, 429]
    assert clients(valkey) == ["10.0.0.2"], "10.0.0.2 is not a trusted proxy here: it is the client"


@pytest.mark.parametrize("xff, client", [
    ("203.0.113.9, garbage, 10.0.0.2", "10.0.0.2"),
    ("203.0.113.9, unknown, 10.0.0.2", "10.0.0.2"),
    ("203.0.113.9, 10.0.0.2, not-an-ip", "127.0.0.1"),
    ("203.0.113.9, 10.0.0.2, 1.2.3.4.5", "127.0.0.1"),
    # an empty list element is no element at all (RFC 9110, 5.6.1): not a malformed entry
    ("203.0.113.9, , 10.0.0.2", "203.0.113.9"),
])
def test_malformed_entry_stops_the_walk_at_the_last_good_hop(sluice_factory, upstream, valkey,
                                                             xff, client):
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=TRUSTED)
    assert gw.get("/status/200", [("X-Forwarded-For", xff)]).status == 200
    assert clients(valkey) == [client]


def test_rfc7239_forwarded(sluice_factory, upstream, valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=TRUSTED)
    a = [("Forwarded", 'for=203.0.113.9;proto=https, for="10.0.0.2:8080";by=10.0.0.1')]
    a2 = [("Forwarded", "for=203.0.113.9"), ("Forwarded", "for=10.0.0.3")]
    a3 = [("Forwarded", 'For="203.0.113.9:4711"')]
    v6 = [("Forwarded", 'for="[2001:db8:cafe::17]:4711", for=10.0.0.2')]
    assert statuses(gw, [a, a2, a3]) == [200, 200, 429]
    assert statuses(gw, [v6]) == [200]
    assert clients(valkey) == ["2001:db8:cafe::/64", "203.0.113.9"]


def test_entries_with_ports(sluice_factory, upstream, valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=TRUSTED)
    with_port = [("X-Forwarded-For", "203.0.113.9:51234, 10.0.0.2:443")]
    without = [("X-Forwarded-For", "203.0.113.9")]
    v6_port = [("X-Forwarded-For", "[2001:db8:1:2::7]:8443, 10.0.0.2")]
    v6_bare = [("X-Forwarded-For", "2001:db8:1:2::8")]
    assert statuses(gw, [with_port, without, with_port]) == [200, 200, 429], \
        "the same client with and without a port"
    assert statuses(gw, [v6_port, v6_bare, v6_port]) == [200, 200, 429]
    assert clients(valkey) == ["2001:db8:1:2::/64", "203.0.113.9"]


@pytest.mark.parametrize("prefix, same, other, network, other_network", [
    (None, ["2001:db8:1:2::5", "2001:db8:1:2:ffff:ffff:ffff:ffff"], "2001:db8:1:3::5",
     "2001:db8:1:2::/64", "2001:db8:1:3::/64"),
    (56, ["2001:db8:1:2::5", "2001:db8:1:ff::9"], "2001:db8:1:100::5",
     "2001:db8:1::/56", "2001:db8:1:100::/56"),
], ids=["default_64", "prefix_56"])
def test_ipv6_clients_grouped_by_prefix(sluice_factory, upstream, valkey, prefix, same, other,
                                        network, other_network):
    identity = dict(TRUSTED)
    if prefix:
        identity["ipv6_prefix"] = prefix
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=identity)
    hs = [[("X-Forwarded-For", f"{a}, 10.0.0.2")] for a in same]
    assert statuses(gw, [hs[0], hs[1], hs[0]]) == [200, 200, 429], "one network, one budget"
    assert statuses(gw, [[("X-Forwarded-For", other)]]) == [200], "another network, its own budget"
    assert clients(valkey) == sorted([network, other_network])


def test_ipv4_mapped_ipv6_is_the_ipv4_client(sluice_factory, upstream, valkey):
    gw = per_ip_gateway(sluice_factory, upstream, valkey, identity=TRUSTED)
    assert statuses(gw, [[("X-Forwarded-For", "::ffff:203.0.113.9")],
                         [("X-Forwarded-For", "203.0.113.9")],
                         [("X-Forwarded-For", "::ffff:203.0.113.9")]]) == [200, 200, 429]
    assert clients(valkey) == ["203.0.113.9"]
