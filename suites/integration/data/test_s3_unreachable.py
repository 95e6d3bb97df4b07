"""An S3 endpoint that does not answer, over real loopback sockets: a port nothing listens on,
a listener that accepts each connection and closes it at once, and a SeaweedFS server that
was killed after the dataset was written.

Opening a dataset reads its manifest; that request must go through the configured retries
and then fail with a DataError naming the endpoint, never a raw botocore error.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from reference_impls.data import (
    DataError,
    DatasetConfig,
    RetryConfig,
    S3Config,
    ShardedDataset,
    ShardWriter,
    StorageUnavailableError,
)

# No jitter: the delays are exactly 0.2 s then 0.4 s, so 3 attempts take >= 0.6 s.
RETRY = RetryConfig(max_attempts=3, backoff_initial_s=0.2, backoff_max_s=0.4, jitter=0.0)


def closed_port() -> int:
    """A loopback port that was just free and is closed again (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(endpoint: str) -> DatasetConfig:
    s3 = S3Config(
        endpoint_url=endpoint, access_key_id="k", secret_access_key="s", connect_timeout_s=2
    )
    return DatasetConfig(s3=s3, retry=RETRY)


def test_a_closed_port_is_a_data_error_naming_the_endpoint_after_the_retries():
    endpoint = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()

    with pytest.raises(StorageUnavailableError) as info:
        ShardedDataset("s3://bucket/train", config(endpoint))

    elapsed = time.monotonic() - started
    assert isinstance(info.value, DataError)
    message = str(info.value)
    assert message.startswith(
        f"reading the manifest of s3://bucket/train: no answer from endpoint {endpoint} after "
        "3 attempt(s)"
    )
    assert "EndpointConnectionError" in message and "RetryConfig.max_attempts (now 3)" in message
    assert elapsed >= 0.6  # both backoff delays were waited: the retries happened


def test_writing_shards_to_a_closed_port_is_a_data_error_naming_the_endpoint():
    endpoint = f"http://127.0.0.1:{closed_port()}"
    writer = ShardWriter("s3://bucket/train", s3=config(endpoint).s3)
    writer.write({"__key__": "k0", "txt": "x"})

    with pytest.raises(StorageUnavailableError) as info:
        writer.close()

    assert str(info.value).startswith(
        f"writing s3://bucket/train/shard-000000.tar: the storage at {endpoint} failed "
        "(EndpointConnectionError"
    )


class ClosingListener:
    """Accepts connections on a free loopback port and closes each at once; counts them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by stop()
                return
            self.accepted += 1
            conn.close()

    def __enter__(self) -> ClosingListener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        self.thread.join(5)


def test_each_configured_attempt_is_one_request_and_then_the_error_names_the_endpoint():
    with ClosingListener() as server:
        endpoint = f"http://127.0.0.1:{server.port}"
        with pytest.raises(StorageUnavailableError, match=f"no answer from endpoint {endpoint}"):
            ShardedDataset("s3://bucket/train", config(endpoint))
        # Counted before each close, so before the client saw it: no wait needed.
        assert server.accepted == RETRY.max_attempts


def test_a_killed_seaweedfs_server_is_a_data_error_naming_its_endpoint(
    fresh_s3_server, s3_config_for, make_dataset
):
    server = fresh_s3_server
    server.client().create_bucket(Bucket="gone")
    s3 = s3_config_for(server, connect_timeout_s=2)
    make_dataset("s3://gone/ds", 20, s3=s3)
    ShardedDataset("s3://gone/ds", DatasetConfig(s3=s3, retry=RETRY))  # opens while it is up
    server.kill()

    with pytest.raises(StorageUnavailableError) as info:
        ShardedDataset("s3://gone/ds", DatasetConfig(s3=s3, retry=RETRY))

    assert f"no answer from endpoint {server.endpoint} after 3 attempt(s)" in str(info.value)
