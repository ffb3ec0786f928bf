"""scripts/prefill_stall.py against the real server app over an in-memory model (no weights), with chunked
prefill: short requests finish beside a long prefill, and a client that leaves mid-prefill frees its slot
before the prefill would have ended. Each forward pass of the fake model takes DELAY_S, so a 400-token prompt
in chunks of 16 prefills in 25 passes."""

from __future__ import annotations

import json
import sys

from spekula.server.app import create_app
from spekula.server.background import serving
from spekula.server.settings import ServerSettings

from pipelinekit import fake_pipeline
from scriptkit import loaded

DELAY_S = 0.02


def test_prefill_stall_measures_a_chunked_server(capsys, one_torch_thread):
    app = create_app(fake_pipeline(draft="same", k=4, delay_s=DELAY_S), ServerSettings(prefill_chunk=16))
    with serving(app) as running, loaded("prefill_stall.py") as script:
        argv = ["--url", running.url, "--long-tokens", "400", "--ids", "32:95", "--chunk", "16"]
        rc = script.main([*argv, "--repeats", "2", "--long-repeats", "1", "--leave-after", "0.1", "--timeout", "60"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["solo_s"]["n"] == 2 and summary["loaded_s"]["n"] >= 1  # short requests finished mid-prefill
    assert summary["long_ttft_alone_s"] >= 25 * DELAY_S and summary["chunk_s"] > 0
    assert summary["freed_s"] < summary["long_ttft_alone_s"]  # freed before the prefill would have ended
    assert "prefill_stall" not in sys.modules
