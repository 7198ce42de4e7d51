#!/usr/bin/env python3
"""A ChatGPT backend on loopback, for tests of the chatgpt family's policy: `POST .../responses`
answered with Responses events over SSE, and `GET .../responses` upgraded to a WebSocket (the
Codex mode), written here from RFC 6455 with the standard library alone: the client's frames
must be masked, its first message a `response.create`; the answer's events go as text
frames, one of them split into a fragment and its continuation, after a ping that the client
must answer with a pong echoing its payload; a usage limit is an `error` event; the server
closes with a close frame. Prints its port first. The last user text picks the answer:

- "quota please": text, with x-codex-* quota headers on the answer (over a WebSocket, every
  upgrade's reply carries them);
- "limit please": first a 429 usage_limit_reached (resets_in_seconds 1), then text;
- "refuse please": a refusal (response.refusal.delta), then completed.

An OAuth token endpoint answers `POST .../oauth/token` (a form): the refresh token "rt-1"
gets the access token "at-2" (and the refresh token "rt-2"); any other is refused
`invalid_grant`. A request whose bearer is "at-expired" or "at-old" is refused 401.

Every request's headers that matter and body are appended as one JSON line to REQUESTS_FILE.
"""

import base64
import hashlib
import http.server
import json
import os
import struct
import sys
import urllib.parse

REQUESTS_FILE = os.environ.get("REQUESTS_FILE", "")
SEEN = {}


def last_user_text(body):
    for item in reversed(body.get("input", [])):
        if item.get("type") == "message" and item.get("role") == "user":
            return "".join(c.get("text", "") for c in item.get("content", []))
    return ""


def event_list(kind, delta):
    return [
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


def log(entry):
    if REQUESTS_FILE:
        with open(REQUESTS_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")


USAGE_LIMIT = {"type": "usage_limit_reached", "message": "The usage limit has been reached",
               "plan_type": "plus", "resets_in_seconds": 1}


def answer_for(prompt):
    """(status or None, events) for a prompt: the usage limit first for "limit please"."""
    SEEN[prompt] = SEEN.get(prompt, 0) + 1
    if prompt == "limit please" and SEEN[prompt] == 1:
        return 429, None
    if prompt == "refuse please":
        return None, event_list("response.refusal.delta", "I can't help with that.")
    if prompt == "quota please":
        return None, event_list("response.output_text.delta", "Within quota.")
    return None, event_list("response.output_text.delta", "After the reset.")



# The quota headers of an answer (on every WebSocket upgrade, and on the HTTP answer to
# "quota please").
QUOTA_HEADERS = {"x-codex-primary-used-percent": "42.5",
                 "x-codex-primary-window-minutes": "300",
                 "x-codex-primary-reset-after-seconds": "1200",
                 "x-codex-secondary-used-percent": "7"}

class Frames:
    """RFC 6455 frames over a connection's file objects (server side)."""

    def __init__(self, rfile, wfile):
        self.r, self.w = rfile, wfile
        self.unmasked = 0

    def read(self):
        head = self.r.read(2)
        if len(head) < 2:
            return None, None, b""
        fin, opcode = head[0] >> 7, head[0] & 0x0F
        masked, n = head[1] >> 7, head[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", self.r.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self.r.read(8))[0]
        if not masked:
            self.unmasked += 1
        key = self.r.read(4) if masked else b"\0\0\0\0"
        data = bytes(b ^ key[i % 4] for i, b in enumerate(self.r.read(n)))
        return fin, opcode, data

    def message(self):
        """The next whole message (opcode, payload); pongs are returned too."""
        parts, first = [], None
        while True:
            fin, opcode, data = self.read()
            if opcode is None:
                return None, b""
            if opcode in (8, 9, 10):
                return opcode, data
            first = opcode if first is None else first
            parts.append(data)
            if fin:
                return first, b"".join(parts)

    def write(self, opcode, data, fin=True):
        n = len(data)
        head = bytes([(0x80 if fin else 0) | opcode])
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        self.w.write(head + data)
        self.w.flush()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def token(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        form = dict(urllib.parse.parse_qsl(raw))
        log({"path": self.path, "form": form,
             "content-type": self.headers.get("content-type")})
        if form.get("grant_type") == "refresh_token" and form.get("refresh_token") == "rt-1":
            status, answer = 200, {"access_token": "at-2", "refresh_token": "rt-2",
                                   "expires_in": 3600, "token_type": "Bearer"}
        else:
            status, answer = 400, {"error": "invalid_grant"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path.endswith("/oauth/token"):
            return self.token()
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
        if self.headers.get("authorization") in ("Bearer at-expired", "Bearer at-old"):
            data = json.dumps({"error": {"message": "The token has expired",
                                         "type": "invalid_request_error",
                                         "code": "token_expired"}}).encode()
            self.send_response(401)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        prompt = last_user_text(body)
        status, evs = answer_for(prompt)
        extra = {}
        if status == 429:
            data = json.dumps({"error": USAGE_LIMIT}).encode()
            self.send_response(429)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in evs).encode()
        if prompt == "quota please":
            extra = QUOTA_HEADERS
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if (self.headers.get("upgrade") or "").lower() != "websocket":
            self.send_error(404)
            return
        key = self.headers.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept)
        # Over a socket the quota comes with the upgrade (the prompt is not known yet).
        for k, v in QUOTA_HEADERS.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.flush()
        frames = Frames(self.rfile, self.wfile)
        opcode, data = frames.message()
        body = json.loads(data) if opcode == 1 else {}
        entry = {
            "mode": "websocket",
            "path": self.path,
            "authorization": self.headers.get("authorization"),
            "chatgpt-account-id": self.headers.get("chatgpt-account-id"),
            "openai-beta": self.headers.get("openai-beta"),
            "originator": self.headers.get("originator"),
            "version": self.headers.get("sec-websocket-version"),
            "first_opcode": opcode,
            "message_type": body.get("type"),
            "model": body.get("model"),
        }
        status, evs = answer_for(last_user_text(body))
        if status == 429:
            evs = [{"type": "error", "status": 429, "error": USAGE_LIMIT}]
        frames.write(9, b"are-you-there")
        pong_opcode, pong = frames.message()
        entry["pong"] = pong.decode() if pong_opcode == 10 else None
        for i, e in enumerate(evs):
            text = json.dumps(e).encode()
            if i == 1:
                frames.write(1, text[:10], fin=False)
                frames.write(0, text[10:])
            else:
                frames.write(1, text)
        frames.write(8, struct.pack(">H", 1000))
        closing, _ = frames.message()
        entry["client_closed"] = closing == 8
        entry["unmasked_frames"] = frames.unmasked
        log(entry)
        self.close_connection = True

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()
