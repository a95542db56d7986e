"""A real S3 endpoint for the tests: moto's server on a free loopback port with one empty bucket,
started and stopped by the fixture that enters :func:`s3_server`. s3fs talks to it over HTTP as it
would to AWS; without s3fs or moto the test skips, saying which is missing."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest

#: The endpoint's secret; the tests that build against it assert that nothing written holds it.
SECRET = "hx-test-secret-never-reported"
#: The endpoint's access key id.
KEY = "hx"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at this moment (nothing listens there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3_client(endpoint: str) -> Any:
    """A boto3 client of ``endpoint``, to look at what a test's build left there."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def s3_options(endpoint: str) -> dict[str, Any]:
    """The storage options (s3fs) of a remote on ``endpoint``."""
    return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}


@contextlib.contextmanager
def s3_server(bucket: str) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with an empty ``bucket``; yields its URL, stops it after."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        s3_client(url).create_bucket(Bucket=bucket)
        yield url
    finally:
        server.stop()
