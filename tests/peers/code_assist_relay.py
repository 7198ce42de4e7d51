#!/usr/bin/env python3
"""Google Code Assist in front of a Gemini endpoint (aimock, at GEMINI_URL), on loopback, so a
test can script Code Assist answers with the same fixtures as the other families. Prints its
port first.

POST /v1internal:streamGenerateContent?alt=sse with an OAuth bearer and the
{model, project, user_prompt_id, request} envelope: a request without the bearer, the project
or the prompt id is answered 401 / 400 as Code Assist would; else `request` goes to
GEMINI_URL/v1beta/models/{model}:streamGenerateContent?alt=sse, and each event of its answer
comes back inside {"response": ..., "traceId": ...}, as Code Assist wraps them.
"""

import http.client
import http.server
import json
import os
import sys
import urllib.parse

GEMINI = urllib.parse.urlsplit(os.environ["GEMINI_URL"])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        if not self.path.startswith("/v1internal:streamGenerateContent"):
            return self.answer(404, {"error": {"code": 404, "status": "NOT_FOUND"}})
        if not (self.headers.get("authorization") or "").startswith("Bearer "):
            return self.answer(401, {"error": {"code": 401, "status": "UNAUTHENTICATED",
                                               "message": "no bearer"}})
        envelope = json.loads(raw)
        missing = [k for k in ("model", "project", "user_prompt_id", "request") if k not in envelope]
        if missing:
            return self.answer(400, {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                               "message": "missing " + ", ".join(missing)}})
        conn = http.client.HTTPConnection(GEMINI.hostname, GEMINI.port, timeout=30)
        model = urllib.parse.quote(envelope["model"], safe="")
        conn.request("POST", f"/v1beta/models/{model}:streamGenerateContent?alt=sse",
                     body=json.dumps(envelope["request"]),
                     headers={"content-type": "application/json", "x-goog-api-key": "relay"})
        upstream = conn.getresponse()
        body = upstream.read().decode()
        if upstream.status != 200:
            data = body.encode()
            self.send_response(upstream.status)
            self.send_header("content-type", "application/json")
        else:
            events = []
            for line in body.splitlines():
                if line.startswith("data:"):
                    inner = line[len("data:"):].strip()
                    events.append('data: {"response": %s, "traceId": "relay"}\r\n\r\n' % inner)
            data = "".join(events).encode()
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
