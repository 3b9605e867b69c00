"""Where the API server really listens: the `kubernetes` Service's EndpointSlice (the API server keeps it in
`default`). A pod's packets to the Service's ClusterIP reach the API server after kube-proxy's DNAT, and a
NetworkPolicy sees that address, not the ClusterIP: a fence that names only the ClusterIP fences nothing
(tests/e2e/test_network_fences_node.py shows both)."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from posttrain.controller.kube import KubeError

logger = logging.getLogger(__name__)

API_SERVER_SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"


def endpoint_slice_addresses(endpoint_slice: dict[str, Any]) -> list[str]:
    """ip:port of every endpoint address of an EndpointSlice, for each of its ports (pure)."""
    ports = [p.get("port") for p in endpoint_slice.get("ports") or [] if isinstance(p.get("port"), int)]
    out: list[str] = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        for address in endpoint.get("addresses") or []:
            try:
                ip = ipaddress.ip_address(str(address))
            except ValueError:
                continue
            for port in ports:
                text = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
                if text not in out:
                    out.append(text)
    return out


async def api_server_endpoints(kube: Any) -> list[str]:
    """The API server's own ip:port as the `kubernetes` Service's EndpointSlice names them; none when the
    operator may not read it (the install grants get on that one object) or the cluster has none."""
    try:
        found = await kube.get(API_SERVER_SLICE)
    except KubeError as err:
        logger.warning("cannot read the API server's endpoints (%s): set POSTTRAIN_API_SERVER_ADDRESSES", err.status)
        return []
    return endpoint_slice_addresses(found or {})
