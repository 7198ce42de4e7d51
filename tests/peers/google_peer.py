#!/usr/bin/env python3
"""A Gemini and Google Code Assist endpoint on loopback for tests of what a Gemini-shaped
provider needs back. Prints its port first.

Routes: POST /v1beta/models/{model}:streamGenerateContent?alt=sse (key in x-goog-api-key)
and POST /v1internal:streamGenerateContent?alt=sse (OAuth bearer; the request inside the
{model, project, user_prompt_id, request} envelope, each event inside {"response": ...}).

The first request of a conversation (no functionResponse yet) is answered with a thought part
carrying a thoughtSignature, then a functionCall WITHOUT an id carrying another signature.
The second is checked: the model turn must come back with both signatures on the parts they
came with, the call without an id, and a functionResponse naming the function. The answer
says "Signatures came back." when all of that holds, or "MISMATCH: ..." naming what did not.
Every request (path, headers that matter, body) is appended as one JSON line to the file
named by REQUESTS_FILE.
"""

import http.server
import json
import os
import sys

REQUESTS_FILE = os.environ.get("REQUESTS_FILE", "")
THOUGHT_SIG = "c2lnLXRob3VnaHQtMDAx"
CALL_SIG = "c2lnLWNhbGwtMDAy"


def first_answer():
    return [
        {"candidates": [{"content": {"role": "model", "parts": [
            {"text": "I should record it.", "thought": True, "thoughtSignature": THOUGHT_SIG}]}}],
         "responseId": "resp-1"},
        {"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "record", "args": {"note": "hi"}},
             "thoughtSignature": CALL_SIG}]},
            "finishReason": "STOP"}],
         "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 8,
                           "thoughtsTokenCount": 12, "totalTokenCount": 70}},
    ]


def check_second(req):
    model = [c for c in req.get("contents", []) if c.get("role") == "model"]
    if not model:
        return "no model turn came back"
    parts = model[-1].get("parts", [])
    want = [
        {"thought": True, "text": "I should record it.", "thoughtSignature": THOUGHT_SIG},
        {"functionCall": {"name": "record", "args": {"note": "hi"}}, "thoughtSignature": CALL_SIG},
    ]
    if parts != want:
        return "model parts " + json.dumps(parts)
    last = req["contents"][-1]
    responses = [p.get("functionResponse") for p in last.get("parts", []) if "functionResponse" in p]
    if len(responses) != 1 or responses[0].get("name") != "record" or "id" in responses[0]:
        return "function responses " + json.dumps(responses)
    return None


def second_answer(problem):
    text = "Signatures came back." if problem is None else "MISMATCH: " + problem
    return [{"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                             "finishReason": "STOP"}],
             "usageMetadata": {"promptTokenCount": 90, "candidatesTokenCount": 4,
                               "cachedContentTokenCount": 50, "totalTokenCount": 94}}]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw)
        code_assist = self.path.startswith("/v1internal:streamGenerateContent")
        if REQUESTS_FILE:
            with open(REQUESTS_FILE, "a") as f:
                f.write(json.dumps({
                    "path": self.path,
                    "authorization": self.headers.get("authorization"),
                    "x-goog-api-key": self.headers.get("x-goog-api-key"),
                    "body": body,
                }) + "\n")
        req = body.get("request", {}) if code_assist else body
        answered = any("functionResponse" in p for c in req.get("contents", [])
                       for p in c.get("parts", []))
        events = second_answer(check_second(req)) if answered else first_answer()
        if code_assist:
            events = [{"response": e, "traceId": "trace-1"} for e in events]
        data = "".join(f"data: {json.dumps(e)}\r\n\r\n" for e in events).encode()
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
