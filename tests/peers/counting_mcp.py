#!/usr/bin/env python3
"""A small MCP tool server over stdio (newline-delimited JSON-RPC) for tests.

Every tools/call is appended to the file named by COUNT_FILE (one JSON line: the tool, its
arguments, this process's pid) and flushed to disk *before* the call does anything else, so
tests count side effects exactly, also across a kill of broca.

Tools: record (answers at once), slow (sleeps `seconds`, then answers), hang (never answers),
die (exits without answering), fail (an error result), rpc_error (a JSON-RPC error),
big (`bytes` bytes of text), pair (answers with structured content only).

MCP_MODE changes the whole server: garbage (prints non-JSON lines around every answer),
hang_init (never answers initialize), exit_at_once (exits before reading anything),
first_start_only (exits at once when STARTS_FILE shows an earlier start: a restart fails).

ENDS_FILE, when set, gets this process's pid appended when it ends on its own: its input
closed (a kill leaves no line).
"""

import json
import os
import sys
import time

MODE = os.environ.get("MCP_MODE", "")
COUNT_FILE = os.environ.get("COUNT_FILE", "")
STARTS_FILE = os.environ.get("STARTS_FILE", "")
ENDS_FILE = os.environ.get("ENDS_FILE", "")

TOOLS = [
    {"name": "record", "description": "Records a note.",
     "inputSchema": {"type": "object", "properties": {"note": {"type": "string"}},
                     "required": ["note"], "additionalProperties": False}},
    {"name": "slow", "description": "Records, then answers after `seconds`.",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "hang", "description": "Records, then never answers.",
     "inputSchema": {"type": "object"}},
    {"name": "die", "description": "Records, then exits without answering.",
     "inputSchema": {"type": "object"}},
    {"name": "fail", "description": "Answers an error result.",
     "inputSchema": {"type": "object"}},
    {"name": "rpc_error", "description": "Answers a JSON-RPC error.",
     "inputSchema": {"type": "object"}},
    {"name": "big", "description": "Answers `bytes` bytes of text.",
     "inputSchema": {"type": "object", "properties": {"bytes": {"type": "integer"}}}},
    {"name": "pair", "description": "Answers structured content only.",
     "inputSchema": {"type": "object"}},
]


def out(msg):
    if MODE == "garbage":
        sys.stdout.write("this line is not JSON-RPC\n")
    sys.stdout.write(json.dumps(msg) + "\n")
    if MODE == "garbage":
        sys.stdout.write("{\"neither\": \"is this\"}\n")
    sys.stdout.flush()


def record(name, args):
    if not COUNT_FILE:
        return
    fd = os.open(COUNT_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        line = json.dumps({"tool": name, "arguments": args, "pid": os.getpid()}) + "\n"
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def text(t, is_error=False):
    return {"content": [{"type": "text", "text": t}], "isError": is_error}


def call(msg_id, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    if name not in [t["name"] for t in TOOLS]:
        out({"jsonrpc": "2.0", "id": msg_id,
             "error": {"code": -32602, "message": f"unknown tool {name}"}})
        return
    record(name, args)
    if name == "record":
        out({"jsonrpc": "2.0", "id": msg_id, "result": text(f"recorded: {args.get('note')}")})
    elif name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        out({"jsonrpc": "2.0", "id": msg_id, "result": text("slow done")})
    elif name == "hang":
        pass
    elif name == "die":
        os._exit(3)
    elif name == "fail":
        out({"jsonrpc": "2.0", "id": msg_id, "result": text("it went wrong", True)})
    elif name == "rpc_error":
        out({"jsonrpc": "2.0", "id": msg_id,
             "error": {"code": -32000, "message": "the tool broke"}})
    elif name == "big":
        out({"jsonrpc": "2.0", "id": msg_id, "result": text("x" * int(args.get("bytes", 10)))})
    elif name == "pair":
        out({"jsonrpc": "2.0", "id": msg_id,
             "result": {"content": [], "structuredContent": {"left": 1, "right": 2}}})


def main():
    if STARTS_FILE:
        earlier = os.path.exists(STARTS_FILE) and os.path.getsize(STARTS_FILE) > 0
        with open(STARTS_FILE, "a") as f:
            f.write(f"{os.getpid()}\n")
        if MODE == "first_start_only" and earlier:
            sys.stderr.write("counting_mcp: refusing to start again, as asked\n")
            sys.exit(1)
    if MODE == "exit_at_once":
        sys.stderr.write("counting_mcp: exiting at once, as asked\n")
        sys.exit(1)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        method = msg.get("method")
        msg_id = msg.get("id")
        if method == "initialize":
            if MODE == "hang_init":
                continue
            out({"jsonrpc": "2.0", "id": msg_id, "result": {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "counting", "version": "1"}}})
        elif method == "tools/list":
            out({"jsonrpc": "2.0", "id": msg_id, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            call(msg_id, msg.get("params") or {})
        elif msg_id is not None and method is not None:
            out({"jsonrpc": "2.0", "id": msg_id,
                 "error": {"code": -32601, "message": f"no method {method}"}})
        # notifications (initialized, cancelled) need no answer
    if ENDS_FILE:
        with open(ENDS_FILE, "a") as f:
            f.write(f"{os.getpid()}\n")


if __name__ == "__main__":
    main()
