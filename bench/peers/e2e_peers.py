#!/usr/bin/env python3
"""The end-to-end bench's peers: the same tool-calling loop as broca's, in LangGraph (its SQLite
checkpointer) and in DBOS Transact (SQLite), against the same loopback provider.

Started by bench/benches/e2e.rs; prints one JSON line when its window ends, then exits.

  e2e_peers.py PEER SESSIONS SECS PROVIDER_URL STATE_DIR

PEER is langgraph-sync (checkpoint saved before the next step), langgraph-async (LangGraph's
default: the checkpoint is written while the next step runs) or dbos (every step's output
committed before the next step starts). SESSIONS sessions run sends back to back for SECS
seconds; each send is a loop of model steps (the provider asks for the no-op tool 9 times, then
answers), and a session moves to a fresh thread after SENDS_PER_SESSION sends, as broca's
generator does. Model steps are counted when they start within the window; a step's latency is
from its start to the start of the next step of the same send.
"""

import asyncio
import json
import operator
import os
import re
import resource
import sys
import time
from typing import Annotated, TypedDict

import httpx

SENDS_PER_SESSION = 5
TOOL = {"name": "noop", "description": "Does nothing.",
        "input_schema": {"type": "object", "properties": {}}}
TOOL_ID = re.compile(rb'"id":"(toolu_[0-9]+)"')


class Window:
    """Step starts inside [start, end], and the latencies between them. When it ends it prints
    the figures and ends the process: sends still running then are not waited for (at a peer's
    pace, a thousand sessions' last sends take a minute)."""

    def __init__(self, peer, sessions, secs, config, starts):
        self.peer, self.sessions, self.secs, self.config = peer, sessions, secs, config
        self.starts = starts
        self.start = time.monotonic()
        self.end = self.start + secs
        self.steps = 0
        self.gaps = []
        self.errors = 0
        self.sends = 0
        self.cpu_start = cpu_secs()
        asyncio.get_running_loop().create_task(self.close_later())

    async def close_later(self):
        await asyncio.sleep(self.secs)
        cpu = cpu_secs() - self.cpu_start
        for starts in self.starts.values():  # the sends still running
            self.record(starts)
        gaps = sorted(self.gaps)
        out = {
            "peer": self.peer, "sessions": self.sessions, "window_s": self.secs,
            "steps": self.steps, "sends": self.sends, "errors": self.errors,
            "steps_per_s": self.steps / self.secs,
            "step_p50_ms": percentile(gaps, 50) * 1e3, "step_p99_ms": percentile(gaps, 99) * 1e3,
            "cpu_s": cpu, "peak_rss_kib": peak_rss_kib(),
            "config": self.config,
        }
        print(json.dumps(out), flush=True)
        os._exit(0)

    def open(self):
        return time.monotonic() < self.end

    def record(self, starts):
        inside = [t for t in starts if self.start <= t <= self.end]
        self.steps += len(inside)
        self.gaps.extend(b - a for a, b in zip(inside, inside[1:]))


class Model:
    """The provider over one keep-alive pool; a step's request in Anthropic's shape."""

    def __init__(self, url, sessions):
        limits = httpx.Limits(max_connections=max(sessions, 1), max_keepalive_connections=max(sessions, 1))
        self.client = httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0)
        self.headers = {"x-api-key": "sk-bench-0123456789", "anthropic-version": "2023-06-01"}

    async def step(self, messages):
        body = {"model": "bench", "max_tokens": 1024, "stream": True, "tools": [TOOL],
                "messages": messages}
        r = await self.client.post("/v1/messages", json=body, headers=self.headers)
        r.raise_for_status()
        text = r.content
        if b'"stop_reason":"tool_use"' in text:
            call_id = TOOL_ID.search(text).group(1).decode()
            return {"role": "assistant",
                    "content": [{"type": "tool_use", "id": call_id, "name": "noop", "input": {}}]}
        return {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}


def noop_tool(assistant):
    call = assistant["content"][0]
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": "ok"}]}


def wants_tool(assistant):
    return assistant["content"][0]["type"] == "tool_use"


async def drive(window, sessions, starts, send, name):
    """Each session sends (`send(thread, k)`) back to back until the window ends, moving to a
    fresh thread every SENDS_PER_SESSION sends; the window then ends the process."""

    async def session(i):
        gen = 0
        while window.open():
            thread = f"s{i}-{gen}"
            for k in range(SENDS_PER_SESSION):
                if not window.open():
                    return
                starts[thread] = []
                try:
                    await send(thread, k)
                    window.sends += 1
                except Exception as e:  # counted, and the first one shown
                    if window.errors == 0:
                        print(f"{name}: {e!r}", file=sys.stderr)
                    window.errors += 1
                window.record(starts.pop(thread))
            gen += 1

    await asyncio.gather(*(session(i) for i in range(sessions)))
    await asyncio.sleep(3600)


def prompt(session, k):
    return {"role": "user", "content": [{"type": "text", "text": f"bench-prompt {session} {k}"}]}


async def langgraph_peer(sessions, secs, url, state_dir, durability):
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        messages: Annotated[list, operator.add]

    model = Model(url, sessions)
    starts = {}

    async def call_model(state, config):
        starts[config["configurable"]["thread_id"]].append(time.monotonic())
        return {"messages": [await model.step(state["messages"])]}

    async def call_tool(state):
        return {"messages": [noop_tool(state["messages"][-1])]}

    g = StateGraph(State)
    g.add_node("model", call_model)
    g.add_node("tool", call_tool)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tool" if wants_tool(s["messages"][-1]) else END)
    g.add_edge("tool", "model")
    path = os.path.join(state_dir, "langgraph.sqlite")
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = g.compile(checkpointer=saver)
        await saver.setup()
        async with saver.conn.execute("PRAGMA journal_mode") as c:
            journal = (await c.fetchone())[0]
        async with saver.conn.execute("PRAGMA synchronous") as c:
            synchronous = (await c.fetchone())[0]
        config = {"durability": durability, "journal_mode": journal, "synchronous": synchronous}
        window = Window(f"langgraph-{durability}", sessions, secs, config, starts)

        async def send(thread, k):
            await graph.ainvoke({"messages": [prompt(thread, k)]},
                                {"configurable": {"thread_id": thread}},
                                durability=durability)

        await drive(window, sessions, starts, send, "langgraph")


async def dbos_peer(sessions, secs, url, state_dir):
    from dbos import DBOS

    path = os.path.join(state_dir, "dbos.sqlite")
    DBOS(config={"name": "e2e-bench", "system_database_url": f"sqlite:///{path}",
                 "log_level": "WARNING"})
    model = Model(url, sessions)

    @DBOS.step()
    async def model_step(messages):
        return await model.step(messages)

    @DBOS.step()
    async def tool_step(assistant):
        return noop_tool(assistant)

    @DBOS.workflow()
    async def agent_run(history, starts_key):
        messages = list(history)
        while True:
            STARTS[starts_key].append(time.monotonic())
            assistant = await model_step(messages)
            messages.append(assistant)
            if not wants_tool(assistant):
                return messages
            messages.append(await tool_step(assistant))

    STARTS = {}
    DBOS.launch()
    import sqlite3
    c = sqlite3.connect(path)
    journal = c.execute("PRAGMA journal_mode").fetchone()[0]
    c.close()
    config = {"journal_mode": journal, "checkpoints": "each step's output, committed before the next step"}
    window = Window("dbos", sessions, secs, config, STARTS)

    histories = {}

    async def send(thread, k):
        history = histories.pop(thread, [])
        history = await agent_run(history + [prompt(thread, k)], thread)
        if k + 1 < SENDS_PER_SESSION:
            histories[thread] = history

    await drive(window, sessions, STARTS, send, "dbos")


def peak_rss_kib():
    """VmHWM: this process's own peak (ru_maxrss would carry the parent's over fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def cpu_secs():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-p / 100.0 * len(sorted_values) // 1))))
    return sorted_values[rank - 1]


def main():
    peer, sessions, secs, url, state_dir = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    if peer in ("langgraph-sync", "langgraph-async"):
        asyncio.run(langgraph_peer(sessions, secs, url, state_dir, peer.split("-")[1]))
    elif peer == "dbos":
        asyncio.run(dbos_peer(sessions, secs, url, state_dir))
    else:
        sys.exit(f"unknown peer {peer!r}: langgraph-sync, langgraph-async or dbos")


if __name__ == "__main__":
    main()
