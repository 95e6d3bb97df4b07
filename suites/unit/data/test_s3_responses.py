"""How the S3 source reads responses and sorts failures (no server: botocore's own types).

Retry decisions must be right in both directions: a 404 retried ten times hides a typo behind
seconds of backoff; a reset not retried loses an epoch to one dropped connection.
"""

from __future__ import annotations

import io
import math

import botocore.exceptions as bce
import pytest
import urllib3.exceptions as u3e

from reference_impls.data import (
    DatasetConfig,
    ManifestMismatchError,
    RetryConfig,
    S3Config,
    S3Source,
    ShardNotFoundError,
)
from reference_impls.data.s3 import _S3Range
from reference_impls.data.sources import IncompleteResponseError, is_transient


def client_error(code: str, status: int) -> bce.ClientError:
    return bce.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    "exc",
    [
        bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        bce.ConnectionClosedError(endpoint_url="http://127.0.0.1:1"),
        bce.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        u3e.ProtocolError("Connection broken"),
        ConnectionResetError(104, "reset"),
        client_error("InternalError", 500),
        client_error("SlowDown", 503),
        IncompleteResponseError("no Content-Range"),
    ],
)
def test_connection_failures_and_server_errors_are_retried(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        client_error("NoSuchKey", 404),
        client_error("NoSuchBucket", 404),
        client_error("AccessDenied", 403),
        client_error("InvalidRange", 416),
        ShardNotFoundError("x"),
    ],
)
def test_missing_objects_and_refusals_are_not_retried(exc):
    assert not is_transient(exc)


def test_storage_errors_become_errors_naming_the_object():
    src = S3Source("s3://bucket/prefix", S3Config(endpoint_url="http://127.0.0.1:9"))
    missing = src.translate(client_error("NoSuchKey", 404), src.key("s-1.tar"))
    assert isinstance(missing, ShardNotFoundError)
    assert "s3://bucket/prefix/s-1.tar does not exist" in str(missing)
    bucket = src.translate(client_error("NoSuchBucket", 404), src.key("s-1.tar"))
    assert "bucket 'bucket' does not exist at http://127.0.0.1:9" in str(bucket)
    short = src.translate(client_error("InvalidRange", 416), src.key("s-1.tar"))
    assert isinstance(short, ManifestMismatchError) and "shorter than the manifest" in str(short)


def _response(**headers):
    return {"Body": io.BytesIO(b"data"), **headers}


def test_a_ranged_response_gives_the_object_size_from_content_range():
    assert (
        _S3Range(_response(ContentRange="bytes 100-999/1000", ContentLength=900), 100).total_size
        == 1000
    )
    assert _S3Range(_response(ContentLength=1000), 0).total_size == 1000


@pytest.mark.parametrize(
    ("headers", "start", "message"),
    [
        ({}, 0, r"no Content-Range and no Content-Length \(headers cut\?\)"),
        ({"ContentLength": 1000}, 100, r"bytes=100- has no Content-Range"),  # Range ignored: a 200
        ({"ContentRange": "bytes 0-999/1000"}, 100, r"asked for bytes from 100"),
        ({"ContentRange": "bytes x"}, 0, r"malformed Content-Range"),
    ],
)
def test_a_response_that_cannot_continue_the_stream_is_refused_for_a_retry(headers, start, message):
    with pytest.raises(IncompleteResponseError, match=message):
        _S3Range(_response(**headers), start)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: S3Config(connect_timeout_s=math.nan), "S3Config.connect_timeout_s"),
        (lambda: S3Config(read_timeout_s=math.inf), "S3Config.read_timeout_s"),
        (lambda: RetryConfig(backoff_max_s=math.inf), "RetryConfig.backoff_max_s"),
        (lambda: DatasetConfig(progress_interval_s=math.nan), "DatasetConfig.progress_interval_s"),
    ],
)
def test_a_nan_or_infinite_timeout_or_backoff_is_refused_naming_it(make, message):
    # NaN passes "> 0" checks (every comparison with it is False); inf waits for ever.
    with pytest.raises(ValueError, match=rf"{message} must be a finite number, got (nan|inf)"):
        make()
