"""The warm-up and pace probe against a local streaming server with known timings."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.suite.probe import PROBE_TOKENS, probe_prompt, token_times, warm_up_and_probe
from benchmarks.suite.servers.base import Launch

TTFT_S = 0.25
TPOT_S = 0.04


class FakeServer(BaseHTTPRequestHandler):
    """Streams max_tokens SSE chunks, the first after TTFT_S and then one per TPOT_S, as an
    HTTP/1.0 response without chunked encoding (as Python-stdlib servers send it)."""

    protocol_version = "HTTP/1.0"
    bodies: list[dict] = []
    status = 200

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        self.send_response(type(self).status)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if type(self).status != 200:
            return
        for i in range(body["max_tokens"]):
            time.sleep(TTFT_S if i == 0 else TPOT_S)
            chunk = {"choices": [{"index": 0, "text": f" w{i}"}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        # A final usage-only chunk carries no text: it is no token.
        self.wfile.write(b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n')
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    FakeServer.bodies = []
    FakeServer.status = 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


LAUNCH = Launch(argv=[], model_name="m", extra_body={"logprobs": False})


def test_token_times_stamps_each_text_chunk_as_it_arrives(server):
    times = token_times(server, LAUNCH, "hi", 6, timeout=30)
    assert len(times) == 6
    assert times[0] == pytest.approx(TTFT_S, abs=0.1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(TPOT_S, abs=0.02)


def test_probe_measures_ttft_and_tpot_after_a_warm_up(server):
    pace = warm_up_and_probe(server, LAUNCH, input_len=256, timeout=30)
    assert pace is not None
    assert pace.ttft_s == pytest.approx(TTFT_S, abs=0.1)
    assert pace.tpot_s == pytest.approx(TPOT_S, abs=0.02)
    assert pace.request_s(128) == pytest.approx(pace.ttft_s + 127 * pace.tpot_s)
    warm, probe = FakeServer.bodies
    # Both requests carry the server's model name and extra body, and stream.
    assert all(b["model"] == "m" and b["logprobs"] is False and b["stream"] for b in (warm, probe))
    assert probe["max_tokens"] == PROBE_TOKENS and warm["max_tokens"] < PROBE_TOKENS
    assert probe["prompt"] == probe_prompt(256) and len(probe["prompt"].split()) == 256
    assert not probe["prompt"].startswith(warm["prompt"])


def test_probe_returns_none_when_the_server_fails(server):
    FakeServer.status = 500
    assert warm_up_and_probe(server, LAUNCH, input_len=16, timeout=30) is None


def test_probe_prompt_rejects_an_empty_length():
    with pytest.raises(ValueError, match="words"):
        probe_prompt(0)
