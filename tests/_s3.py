"""A real S3 API server on loopback for the object-storage tests: moto's server mode, reached through s3fs.

:func:`s3_server` starts ``moto.server.ThreadedMotoServer`` on a free port of
127.0.0.1 and points botocore (so s3fs, so pimm_fn) at it with
``AWS_ENDPOINT_URL`` and dummy credentials, set only while it runs and
restored after. Processes started meanwhile (the ranks of a gloo test)
inherit them. :func:`new_bucket` makes an empty bucket per test.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import uuid

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server():
    """Run an S3 API server on loopback; yields its endpoint URL, with the environment pointing at it."""
    from moto.server import ThreadedMotoServer
    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made before would talk to another endpoint
    try:
        yield endpoint
    finally:
        # Runs a test dropped unfinished release their store locks while the server still answers, not in a
        # later test's collection, where each would wait for a gone endpoint (pimm_fn.checkpoint.lock).
        gc.collect()
        s3fs.S3FileSystem.clear_instance_cache()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def new_bucket() -> str:
    """Create an empty bucket on the running server; returns its name."""
    import s3fs

    name = f"pimm-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(name)
    return name
