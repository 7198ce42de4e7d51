#!/usr/bin/env python3
"""A loopback proxy that writes each request body it gets, as it got it, one JSON line per
request to $REQUESTS_FILE, then forwards the request to $UPSTREAM and answers with the
upstream's answer (read whole). Prints its port first."""

import http.server
import json
import os
import urllib.error
import urllib.request

UPSTREAM = os.environ["UPSTREAM"]
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with open(os.environ["REQUESTS_FILE"], "a") as f:
            f.write(json.dumps({"path": self.path, "body": body.decode()}) + "\n")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        req = urllib.request.Request(UPSTREAM + self.path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req) as r:
                status, rheaders, data = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, rheaders, data = e.code, e.headers, e.read()
        self.send_response(status)
        for k, v in rheaders.items():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
