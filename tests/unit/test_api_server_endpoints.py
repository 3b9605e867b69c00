"""The API server's own addresses from the `kubernetes` Service's EndpointSlice (controller/api_server_endpoints.py)."""

from __future__ import annotations

import asyncio

from posttrain.controller.api_server_endpoints import (
    API_SERVER_SLICE,
    api_server_endpoints,
    endpoint_slice_addresses,
)
from posttrain.controller.kube import KubeError


def test_every_address_for_every_port_once() -> None:
    endpoint_slice = {
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": 6443}],
        "endpoints": [{"addresses": ["10.1.0.5"]}, {"addresses": ["10.1.0.6", "10.1.0.5", "not-an-ip"]}],
    }
    assert endpoint_slice_addresses(endpoint_slice) == ["10.1.0.5:6443", "10.1.0.6:6443"]
    assert endpoint_slice_addresses({"ports": [{"port": 443}], "endpoints": [{"addresses": ["fd00::1"]}]}) == [
        "[fd00::1]:443"
    ]
    assert endpoint_slice_addresses({}) == []


class Kube:
    def __init__(self, answer=None, error: KubeError | None = None) -> None:
        self.answer, self.error, self.paths = answer, error, []

    async def get(self, path: str):
        self.paths.append(path)
        if self.error:
            raise self.error
        return self.answer


def test_read_by_name_and_nothing_when_refused() -> None:
    kube = Kube({"ports": [{"port": 6443}], "endpoints": [{"addresses": ["192.0.2.2"]}]})
    assert asyncio.run(api_server_endpoints(kube)) == ["192.0.2.2:6443"]
    assert kube.paths == [API_SERVER_SLICE]
    assert asyncio.run(api_server_endpoints(Kube(error=KubeError(403, "forbidden")))) == []
    assert asyncio.run(api_server_endpoints(Kube(None))) == []
