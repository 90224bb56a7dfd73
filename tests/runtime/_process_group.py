"""A one-rank gloo process group for runtime tests that need torch.distributed in this process."""

import socket

import pytest
import torch.distributed as td


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank in this process, removed afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        td.destroy_process_group()
