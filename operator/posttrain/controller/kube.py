"""A small async Kubernetes API client for the controller's writes (server-side apply, merge patches of
status, deletes, a few reads), on aiohttp (already in the process: kopf's client), with the kubeconfig or
in-cluster credentials that kopf uses too.

Why not the `kubernetes` package: it is synchronous (a thread per call under kopf's event loop) and spends
its time (de)serialising typed models; the controller only needs dicts. Why not httpx: it cost about
1.2 ms of CPU per request here (its pure-Python HTTP/1.1 machinery and anyio), aiohttp's C parser a
fraction of that, and the operator's CPU per job is mostly its requests. Connections are kept and
reused; a response body the caller does not read is never decoded. Every request is counted
(`Kube.requests`) so the benchmark can report API requests per job. Transient failures (connection errors,
409 Conflict on a write, 429, 5xx) are retried with backoff; 404 on read/delete is "absent". 422
(Unprocessable Entity) is final: KubeError.details carries the Status' causes (the fields refused)."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import logging
import os
import ssl
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from posttrain.controller import metrics, safejson

logger = logging.getLogger(__name__)

FIELD_MANAGER = "posttrain-operator"
PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "Secret": "secrets",
    "NetworkPolicy": "networkpolicies",
    "Pod": "pods",
    "Event": "events",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",  # policy/v1 (render/disruption.py)
    "Job": "jobs",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "RLJob": "rljobs",
    "SFTJob": "sftjobs",
    "TaskApp": "taskapps",
    "Workload": "workloads",  # kueue.x-k8s.io (controller/gang.py)
    "WorkloadPriorityClass": "workloadpriorityclasses",  # kueue.x-k8s.io, cluster-scoped
    "PriorityClass": "priorityclasses",  # scheduling.k8s.io, cluster-scoped
}
RETRY_STATUSES = {409, 429, 500, 502, 503, 504}
WATCH_LINE_MAX = 2**24  # one watch event (one object) may be this long
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# This client's aiohttp sessions: kopf's share the library, and the benchmark counts kopf's apart
_OWN_SESSIONS: weakref.WeakSet[aiohttp.ClientSession] = weakref.WeakSet()


def is_own_session(session: aiohttp.ClientSession) -> bool:
    return session in _OWN_SESSIONS


class KubeError(Exception):
    def __init__(
        self, status: int, message: str, details: dict[str, Any] | None = None, api_message: str = ""
    ):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.details = details  # a Status' `details` ({name, kind, causes: [{field, message}]})
        self.api_message = api_message  # a Status' `message` in full (the text above is cut short)


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{root}{ns}/{PLURALS[kind]}"


def object_path(api_version: str, kind: str, namespace: str | None, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def path_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


class Kube:
    """Counted, retried API calls. Build with `Kube.from_env()` (KUBECONFIG / ~/.kube/config / in-cluster)."""

    def __init__(
        self,
        host: str,
        *,
        verify: Any = True,
        cert: tuple[str, str] | None = None,
        token: str | None = None,
        token_file: str | None = None,
        max_connections: int = 8,
        read_timeout: float = 30.0,
        watch_idle: float = 90.0,
    ):
        self.host = host.rstrip("/")
        self._token = token
        self._token_file = token_file
        self._token_read = 0.0
        self.requests: collections.Counter[str] = collections.Counter()
        self._ssl = _ssl_of(verify, cert) if self.host.startswith("https") else False
        self._max_connections = max_connections
        self.read_timeout = read_timeout  # a request's answer (per read)
        self.watch_idle = watch_idle  # a watch that sends nothing (not even a bookmark) this long is dead
        self._session: aiohttp.ClientSession | None = None  # made in the event loop, at the first request
        self._watch_session: aiohttp.ClientSession | None = None

    @staticmethod
    def from_env(kubeconfig: str | None = None) -> Kube:
        from kubernetes import client, config

        cfg = client.Configuration()
        if (
            kubeconfig is None
            and os.environ.get("KUBERNETES_SERVICE_HOST")
            and not os.environ.get("KUBECONFIG")
        ):
            host = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
            return Kube(
                host, verify=ssl.create_default_context(cafile=IN_CLUSTER_CA), token_file=IN_CLUSTER_TOKEN
            )
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        verify: Any = True
        if not cfg.verify_ssl:
            verify = False
        elif cfg.ssl_ca_cert:
            verify = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        cert = (cfg.cert_file, cfg.key_file) if cfg.cert_file and cfg.key_file else None
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        return Kube(cfg.host, verify=verify, cert=cert, token=token)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # a few connections are enough for what the API server can take; a request waits for a free one
            connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl, keepalive_timeout=60)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=self.read_timeout)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            _OWN_SESSIONS.add(self._session)
        return self._session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()

    def _headers(self) -> dict[str, str]:
        if self._token_file and time.monotonic() - self._token_read > 60:
            with open(self._token_file) as fh:
                self._token = fh.read().strip()
            self._token_read = time.monotonic()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        absent_ok: bool = False,
        retries: int = 6,
        parse: bool = True,
        accept: str | None = None,
    ) -> dict[str, Any] | None:
        delay = 0.2
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        url = self.host + path
        for attempt in range(retries + 1):
            self.requests[method] += 1
            metrics.count_request(method)
            headers = self._headers()
            if data is not None:
                headers["Content-Type"] = content_type
            if accept is not None:
                headers["Accept"] = accept
            try:
                async with self._client().request(method, url, data=data, headers=headers, params=params) as rsp:
                    status = rsp.status
                    content = await rsp.read()
                    retry_after = rsp.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientError) as exc:
                metrics.count_error(method, 0)
                if attempt == retries:
                    raise KubeError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if status >= 400 and not (status == 404 and absent_ok):
                metrics.count_error(method, status)
            if status == 404 and absent_ok:
                return None
            if status < 400:
                # a write's echo of the object is only decoded when the caller reads it
                return safejson.loads(content) if parse and content else {}
            if status in RETRY_STATUSES and attempt < retries:
                await asyncio.sleep(float(retry_after) if retry_after and retry_after.isdigit() else delay)
                delay = min(delay * 2, 5.0)
                continue
            text = content.decode(errors="replace")
            raise KubeError(
                status, f"{method} {path}: {text[:300]}", _status_details(content), _status_message(content)
            )
        raise AssertionError("unreachable")

    # --- verbs -------------------------------------------------------------------------------------
    async def get(self, path: str) -> dict[str, Any] | None:
        return await self.request("GET", path, absent_ok=True)

    async def exists(self, path: str) -> bool:
        """Whether the object is there, from its metadata alone (a Secret's data is never sent)."""
        found = await self.request("GET", path, absent_ok=True, accept=METADATA_ONLY)
        return found is not None

    async def list(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        found = await self.request("GET", path, params={"labelSelector": label_selector})
        return list((found or {}).get("items") or [])

    async def apply(self, obj: dict[str, Any], *, subresource: str = "") -> dict[str, Any] | None:
        """Server-side apply (create or update the fields we own; never a duplicate). Returns {}: the
        object the API server echoes is not read."""
        path = path_of(obj) + (f"/{subresource}" if subresource else "")
        return await self.request(
            "PATCH",
            path,
            body=obj,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            parse=False,
        )

    async def create(self, obj: dict[str, Any]) -> bool:
        """POST `obj`; False when an object of that name exists already (409), which is left as it is."""
        meta = obj["metadata"]
        path = collection_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        try:
            await self.request("POST", path, body=obj, retries=0, parse=False,
                               params={"fieldManager": FIELD_MANAGER})  # fmt: skip
        except KubeError as err:
            if err.status == 409:
                return False
            raise
        return True

    async def owners(self, path: str) -> list[str] | None:
        """The uids of the object's ownerReferences, from its metadata alone (None: no such object)."""
        found = await self.request("GET", path, absent_ok=True, accept=METADATA_ONLY)
        if found is None:
            return None
        refs = (found.get("metadata") or {}).get("ownerReferences") or []
        return [str(ref.get("uid") or "") for ref in refs if isinstance(ref, dict)]

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request, decoded, until the API server ends it. It runs on a session of
        its own (a watch holds its connection for minutes: the requests' few connections stay free)."""
        self.requests["GET"] += 1
        metrics.count_request("WATCH")
        if self._watch_session is None or self._watch_session.closed:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._ssl)
            self._watch_session = aiohttp.ClientSession(connector=connector, read_bufsize=WATCH_LINE_MAX)
            _OWN_SESSIONS.add(self._watch_session)
        # a silent connection (dropped without a close) ends the watch: the caller resumes it
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=self.watch_idle)
        url = self.host + path
        query = {**params, "watch": "true"}
        async with self._watch_session.get(url, params=query, headers=self._headers(), timeout=timeout) as rsp:
            if rsp.status >= 400:
                content = await rsp.read()
                raise KubeError(rsp.status, f"GET {path} (watch): {content.decode(errors='replace')[:300]}")
            while line := await rsp.content.readline():
                if line.strip():
                    yield safejson.loads(line)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return await self.request(
            "PATCH", path, body=body, content_type="application/merge-patch+json", absent_ok=True
        )

    async def delete(self, path: str, propagation: str = "Background") -> None:
        await self.request(
            "DELETE",
            path,
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            absent_ok=True,
            parse=False,
        )

    async def secret_labels(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's labels from its metadata alone (its data is never sent); None when it is absent."""
        path = object_path("v1", "Secret", namespace, name)
        found = await self.request("GET", path, absent_ok=True, accept=METADATA_ONLY)
        return None if found is None else dict((found.get("metadata") or {}).get("labels") or {})

    async def read_secret_key(
        self, namespace: str, name: str, key: str
    ) -> tuple[str | None, str | None, dict[str, str]]:
        """(the decoded value of one key of a Secret, the Secret's resourceVersion, its labels); (None, None,
        {}) when the Secret is absent, (None, version, labels) when the key is."""
        secret = await self.get(object_path("v1", "Secret", namespace, name))
        if not secret:
            return None, None, {}
        metadata = secret.get("metadata") or {}
        version, labels = metadata.get("resourceVersion"), dict(metadata.get("labels") or {})
        raw = (secret.get("data") or {}).get(key)
        if raw is None:
            string = (secret.get("stringData") or {}).get(key)
            return (str(string) if string is not None else None), version, labels
        return base64.b64decode(raw).decode(), version, labels


def _ssl_of(verify: Any, cert: tuple[str, str] | None) -> ssl.SSLContext | bool:
    """What aiohttp takes: a context that checks the server (and presents `cert`), or False (no check)."""
    if verify is False:
        if not cert:
            return False
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
    if cert:
        context.load_cert_chain(*cert)
    return context


def _status_message(content: bytes, limit: int = 2000) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message[:limit] if isinstance(message, str) else ""


def _status_details(content: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(content)
    except ValueError:
        return None
    details = body.get("details") if isinstance(body, dict) else None
    return details if isinstance(details, dict) else None
