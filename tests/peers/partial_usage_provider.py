#!/usr/bin/env python3
"""An OpenAI-compatible Chat Completions endpoint on loopback (the usage members OpenRouter
reports) whose answers report usage in part, as the prompt asks: `usage:full` reports every
member (cache reads and writes, reasoning), `usage:plain` only prompt and completion counts,
`usage:none` no usage at all. Prints its port first."""

import http.server
import json
import sys

USAGE = {
    "usage:full": {
        "prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 60, "cache_write_tokens": 10},
        "completion_tokens_details": {"reasoning_tokens": 5},
    },
    "usage:plain": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    "usage:none": None,
}


def chunk(delta, finish=None, usage=None, choices=True):
    c = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}
    c["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []
    if usage is not None:
        c["usage"] = usage
    return c


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        text = json.dumps(body["messages"][-1])
        usage = next((u for k, u in USAGE.items() if k in text), None)
        chunks = [chunk({"role": "assistant", "content": "counted"}), chunk({}, "stop")]
        if usage is not None:
            chunks.append(chunk({}, usage=usage, choices=False))
        data = ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()
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
