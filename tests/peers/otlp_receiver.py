#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver on loopback: decodes each POST /v1/traces body with
OpenTelemetry's own protobuf classes (opentelemetry-proto) and appends every span it holds to
$REQUESTS_FILE as one JSON line (ids in hex, attributes by key, the resource's attributes and
the request's headers beside it). A body that does not decode is answered 400 and logged as
{"error": ...}. Prints its port first."""

import http.server
import json
import os
import sys

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

OUT = os.environ["REQUESTS_FILE"]


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        lines = []
        try:
            if self.path != "/v1/traces":
                raise ValueError(f"unexpected path {self.path}")
            if self.headers.get("content-type") != "application/x-protobuf":
                raise ValueError(f"unexpected content-type {self.headers.get('content-type')}")
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            for rs in req.resource_spans:
                resource = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        lines.append({
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attributes": attrs(s.attributes),
                            "status": {"code": s.status.code, "message": s.status.message},
                            "scope": ss.scope.name,
                            "resource": resource,
                            "authorization": self.headers.get("authorization"),
                        })
            status, answer = 200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure is the test's evidence
            lines = [{"error": str(e)}]
            status, answer = 400, b""
        with open(OUT, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
sys.stdout.close()
server.serve_forever()
