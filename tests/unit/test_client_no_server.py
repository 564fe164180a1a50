"""clients/llm_client.py with no server at the address: one line naming the address and what to do, exit 1."""
from __future__ import annotations

import pytest

from clients import llm_client
from tritonllm.serving.discovery import find_free_ports


@pytest.mark.parametrize("extra", [["--stream"], [], ["--protocol", "http"], ["--protocol", "http", "--stream"]])
def test_no_server_says_the_address_and_how_to_start_one(extra, capsys):
    (port,) = find_free_ports(1)   # free: nothing listens there
    url = f"localhost:{port}"
    assert llm_client.main(["hello", "--url", url, "--max-tokens", "4", *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot connect to {url}"), err
    assert "make serve" in err and "Traceback" not in err
