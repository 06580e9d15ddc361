"""The web harness server answers only requests addressed to it by a loopback name: a page whose DNS
name was rebound to 127.0.0.1 sends its own name as Host and is refused."""

from __future__ import annotations

import http.client

import pytest

from targets.web_support import HarnessServer


@pytest.fixture
def server():
    started = HarnessServer()
    yield started
    started.stop()


def _status(server: HarnessServer, host: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.httpd.server_address[1], timeout=10)
    try:
        connection.putrequest("GET", "/harness/index.html", skip_host=True)
        connection.putheader("Host", host)
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_rebound_host_name_is_refused_and_loopback_names_are_served(server):
    port = server.httpd.server_address[1]
    assert _status(server, f"attacker.example:{port}") == 421
    assert _status(server, "127.0.0.1") == 421  # another port's origin is another origin
    assert _status(server, f"127.0.0.1:{port}") == 200
    assert _status(server, f"localhost:{port}") == 200
