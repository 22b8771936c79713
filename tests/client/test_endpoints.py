"""How a client finds the DCs: a cluster file, addresses, the environment, DNS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import txsync.client
from txsync.client import Tls
from txsync.client.endpoints import Endpoint, EndpointError, resolve


def test_a_cluster_file_names_every_dc_and_the_preferred_one_goes_first(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    dcs = {name: {"store": f"127.0.0.1:71{n}1"} for n, name in enumerate(["dc1", "dc2", "dc3"])}
    cluster.write_text(json.dumps({"dcs": dcs}))
    assert [e.dc for e in resolve(str(cluster))] == ["dc1", "dc2", "dc3"]
    assert [e.dc for e in resolve(str(cluster), prefer="dc2")] == ["dc2", "dc1", "dc3"]
    assert resolve(str(cluster), prefer="127.0.0.1:7121")[0].dc == "dc3"
    with pytest.raises(EndpointError, match=r"no DC 'dc9'.*dc1 \(127\.0\.0\.1:7101\)"):
        resolve(str(cluster), prefer="dc9")
    with pytest.raises(EndpointError, match=r"cannot read the cluster file .*make run"):
        resolve(str(tmp_path / "missing.json"))


def test_addresses_the_environment_and_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve("127.0.0.1:1, 127.0.0.2:2") == [Endpoint("127.0.0.1:1"), Endpoint("127.0.0.2:2")]
    assert resolve(["127.0.0.1:1", "[::1]:2"]) == [Endpoint("127.0.0.1:1"), Endpoint("[::1]:2")]
    monkeypatch.setenv("TXSYNC_ENDPOINTS", "127.0.0.3:3")
    assert resolve() == [Endpoint("127.0.0.3:3")]
    # A name with one address (IPv4 preferred: a dual-stack host is one DC) stays a name.
    assert resolve("localhost:7101") == [Endpoint("localhost:7101")]
    assert resolve("dns:///localhost:7101") == [Endpoint("localhost:7101")]
    with pytest.raises(EndpointError, match=r"cannot resolve 'no-such-host\.invalid'"):
        resolve("no-such-host.invalid:7101")


def test_addresses_may_name_their_dcs_and_a_tls_name_may_use_them() -> None:
    named = resolve("dc1=127.0.0.1:1, dc2=localhost:2", prefer="dc2")
    assert named == [Endpoint("localhost:2", "dc2"), Endpoint("127.0.0.1:1", "dc1")]
    assert resolve("dc1=db.example:7101") == [Endpoint("db.example:7101", "dc1")], "no lookup"
    with pytest.raises(EndpointError, match=r"a DC's name before '='"):
        resolve("=127.0.0.1:1")
    per_dc = Tls(b"ca", server_name="{dc}")
    assert [per_dc.name_for(e) for e in named] == ["dc2", "dc1"]
    assert Tls(b"ca", server_name="store.{dc}.example").name_for(named[0]) == "store.dc2.example"
    assert Tls(b"ca", server_name="dc1").name_for(named[0]) == "dc1", "one name for all"
    assert Tls(b"ca").name_for(named[0]) == "", "the address's host"
    with pytest.raises(ValueError, match=r"names no DC: give DC=HOST:PORT"):
        per_dc.name_for(Endpoint("127.0.0.1:1"))
    with pytest.raises(ValueError, match=r"names no DC"):
        txsync.client.Client("127.0.0.1:1", tls=per_dc)


def test_every_exported_name_is_importable_from_the_package() -> None:
    for name in txsync.client.__all__:
        assert getattr(txsync.client, name).__name__ == name
    with pytest.raises(AttributeError):
        _ = txsync.client.NoSuchThing
