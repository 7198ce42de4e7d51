#!/usr/bin/env python3
"""An OpenAI Chat Completions endpoint on loopback that streams an answer and never reports
usage (as servers that ignore `stream_options.include_usage` do). Prints its port first."""

import http.server
import json
import sys

CHUNKS = [
    {"id": "c1", "object": "chat.completion.chunk",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Nothing "}, "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk",
     "choices": [{"index": 0, "delta": {"content": "counted."}, "finish_reason": None}]},
    {"id": "c1", "object": "chat.completion.chunk",
     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in CHUNKS) + "data: [DONE]\n\n"
        data = body.encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()
