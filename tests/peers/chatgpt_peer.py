#!/usr/bin/env python3
"""A ChatGPT backend (`POST .../responses`, Responses events over SSE) on loopback, for tests
of the chatgpt family's policy. Prints its port first. The last user text picks the answer:

- "quota please": text, with x-codex-* quota headers on the answer;
- "limit please": first a 429 usage_limit_reached (resets_in_seconds 1), then text;
- "refuse please": a refusal (response.refusal.delta), then completed.

Every request's headers that matter and body are appended as one JSON line to REQUESTS_FILE.
"""

import http.server
import json
import os
import sys

REQUESTS_FILE = os.environ.get("REQUESTS_FILE", "")
SEEN = {}


def last_user_text(body):
    for item in reversed(body.get("input", [])):
        if item.get("type") == "message" and item.get("role") == "user":
            return "".join(c.get("text", "") for c in item.get("content", []))
    return ""


def events(kind, delta):
    out = [
        {"type": "response.created", "sequence_number": 0,
         "response": {"id": "resp_peer", "status": "in_progress", "output": []}},
        {"type": kind, "sequence_number": 1, "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": delta},
        {"type": "response.completed", "sequence_number": 2,
         "response": {"id": "resp_peer", "status": "completed",
                      "usage": {"input_tokens": 11, "output_tokens": 3,
                                "input_tokens_details": {"cached_tokens": 0},
                                "output_tokens_details": {"reasoning_tokens": 0}}}},
    ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in out).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        if REQUESTS_FILE:
            with open(REQUESTS_FILE, "a") as f:
                f.write(json.dumps({
                    "path": self.path,
                    "authorization": self.headers.get("authorization"),
                    "chatgpt-account-id": self.headers.get("chatgpt-account-id"),
                    "openai-beta": self.headers.get("openai-beta"),
                    "originator": self.headers.get("originator"),
                }) + "\n")
        prompt = last_user_text(body)
        SEEN[prompt] = SEEN.get(prompt, 0) + 1
        extra = {}
        if prompt == "limit please" and SEEN[prompt] == 1:
            data = json.dumps({"error": {"type": "usage_limit_reached",
                                         "message": "The usage limit has been reached",
                                         "plan_type": "plus", "resets_in_seconds": 1}}).encode()
            self.send_response(429)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if prompt == "refuse please":
            data = events("response.refusal.delta", "I can't help with that.")
        elif prompt == "quota please":
            data = events("response.output_text.delta", "Within quota.")
            extra = {"x-codex-primary-used-percent": "42.5",
                     "x-codex-primary-window-minutes": "300",
                     "x-codex-primary-reset-after-seconds": "1200",
                     "x-codex-secondary-used-percent": "7"}
        else:
            data = events("response.output_text.delta", "After the reset.")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()
