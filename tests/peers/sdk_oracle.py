#!/usr/bin/env python3
"""The official SDKs as strict decoders of a recorded stream: a loopback server answers every
POST with the bytes of FIXTURE, and the SDK reads them as it would the provider's answer.
Prints one JSON object: the requests the SDK made (path, headers, body in base64; boto3's are
signed with SigV4) and what it decoded, in the order it came.

    sdk_oracle.py gemini FIXTURE    google-genai, generate_content_stream
    sdk_oracle.py bedrock FIXTURE   boto3 bedrock-runtime, converse_stream (which checks every
                                    event-stream checksum)

The decoded items: {"text"}, {"thought"}, {"thought_signature"} (a thought's), {"signature"}
(on a function call), {"call": {"id", "name", "args"}}, {"usage": {...}} as the SDK names the
counts, {"finish"} and {"response_id"}; Bedrock's tool input pieces are joined per block, as
its documentation says to.
"""

import base64
import http.server
import json
import sys
import threading

FAMILY, FIXTURE = sys.argv[1], sys.argv[2]
BODY = open(FIXTURE, "rb").read()
CONTENT_TYPE = {"gemini": "text/event-stream",
                "bedrock": "application/vnd.amazon.eventstream"}[FAMILY]
REQUESTS = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        REQUESTS.append({"path": self.path,
                         "headers": {k.lower(): v for k, v in self.headers.items()},
                         "body": base64.b64encode(body).decode()})
        self.send_response(200)
        self.send_header("content-type", CONTENT_TYPE)
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
URL = f"http://127.0.0.1:{server.server_address[1]}"


def gemini():
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="oracle-key", http_options=types.HttpOptions(base_url=URL))
    out = []
    for chunk in client.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"):
        if chunk.response_id:
            out.append({"response_id": chunk.response_id})
        cand = chunk.candidates[0]
        for part in (cand.content.parts if cand.content else None) or []:
            sig = base64.b64encode(part.thought_signature).decode() if part.thought_signature else None
            if part.thought:
                out.append({"thought": part.text})
                if sig:
                    out.append({"thought_signature": sig})
                continue
            if sig:
                out.append({"signature": sig})
            if part.function_call:
                f = part.function_call
                out.append({"call": {"id": f.id, "name": f.name, "args": f.args}})
            elif part.text:
                out.append({"text": part.text})
        if chunk.usage_metadata:
            u = chunk.usage_metadata
            out.append({"usage": {k: v for k, v in {
                "prompt_token_count": u.prompt_token_count,
                "candidates_token_count": u.candidates_token_count,
                "cached_content_token_count": u.cached_content_token_count,
                "thoughts_token_count": u.thoughts_token_count,
            }.items() if v is not None}})
        if cand.finish_reason:
            out.append({"finish": cand.finish_reason.value})
    return out


def bedrock():
    import boto3

    client = boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=URL,
                          aws_access_key_id="AKIDORACLE", aws_secret_access_key="oracle-secret")
    resp = client.converse_stream(modelId="anthropic.claude-sonnet-4-5-20250929-v1:0",
                                  messages=[{"role": "user", "content": [{"text": "hi"}]}])
    out, calls = [], {}
    for ev in resp["stream"]:
        if "contentBlockStart" in ev:
            s = ev["contentBlockStart"]
            t = s["start"].get("toolUse")
            if t:
                calls[s["contentBlockIndex"]] = {"id": t["toolUseId"], "name": t["name"], "input": ""}
        elif "contentBlockDelta" in ev:
            d = ev["contentBlockDelta"]
            delta = d["delta"]
            if "text" in delta:
                out.append({"text": delta["text"]})
            elif "toolUse" in delta:
                calls[d["contentBlockIndex"]]["input"] += delta["toolUse"]["input"]
            elif "reasoningContent" in delta:
                r = delta["reasoningContent"]
                if "text" in r:
                    out.append({"thought": r["text"]})
                if "signature" in r:
                    out.append({"thought_signature": r["signature"]})
        elif "contentBlockStop" in ev:
            c = calls.pop(ev["contentBlockStop"]["contentBlockIndex"], None)
            if c:
                out.append({"call": {"id": c["id"], "name": c["name"],
                                     "args": json.loads(c["input"])}})
        elif "messageStop" in ev:
            out.append({"finish": ev["messageStop"]["stopReason"]})
        elif "metadata" in ev:
            out.append({"usage": ev["metadata"]["usage"]})
    return out


decoded = {"gemini": gemini, "bedrock": bedrock}[FAMILY]()
print(json.dumps({"requests": REQUESTS, "decoded": decoded}))
