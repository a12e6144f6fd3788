"""Drives `leash mcp` with the official MCP Python SDK (PyPI `mcp`), for tests/mcp_sdk_sessions.rs.

Reads a plan (JSON, path in argv[1]): the leash binary, the state directory, the session keys
of the forest, and the server configurations to try. For each configuration it starts
`leash mcp --as REQUESTER …` through the SDK's stdio client (the high-level `Client`, which
probes `server/discover` first and falls back to the `initialize` handshake), lists the tools,
and calls every tool on every key. It prints one JSON object with everything it saw; the Rust
test holds the expectations, so this script asserts only what the SDK itself promises.
"""

import json
import os
import sys
import time

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def outcome(result):
    """A tool result as plain data: error text, or the structured content."""
    if result.is_error:
        return {"error": text_of(result)}
    # The text rendering is the structured content's JSON.
    assert json.loads(text_of(result)) == result.structured_content, "text != structuredContent"
    return {"ok": result.structured_content}


async def run_config(plan, cfg):
    params = StdioServerParameters(
        command=plan["leash"],
        args=["--state-dir", plan["state"], "mcp", *cfg["args"]],
        # The SDK passes only a few variables of its own environment on: the reports directory
        # of the test (LEASH_RUNTIME_DIR) goes with the server too, never the shared default.
        env={"LEASH_LOG": "warn", **{k: os.environ[k] for k in ("LEASH_RUNTIME_DIR",) if k in os.environ}},
    )
    seen = {"id": cfg["id"]}
    async with Client(params) as client:
        seen["protocolVersion"] = client.protocol_version
        await client.send_ping()
        tools = await client.list_tools()
        seen["tools"] = sorted(t.name for t in tools.tools)
        seen["schemas"] = {t.name: t.input_schema for t in tools.tools}
        seen["list"] = outcome(await client.call_tool("sessions_list", {}))
        seen["status"], seen["history"], seen["send"] = {}, {}, {}
        for key in plan["keys"] + [plan["missing"]]:
            seen["status"][key] = outcome(await client.call_tool("session_status", {"sessionKey": key}))
            seen["history"][key] = outcome(
                await client.call_tool("sessions_history", {"sessionKey": key, "limit": 50})
            )
            if cfg.get("send", True):
                line = f"mcp:{cfg['id']}:{key}"
                seen["send"][key] = outcome(
                    await client.call_tool("sessions_send", {"sessionKey": key, "message": line})
                )
        # An argument cannot change the requester.
        seen["override"] = outcome(
            await client.call_tool("sessions_list", {"requester": plan["keys"][-1]})
        )
        probe = cfg.get("probe_output")
        if probe:
            # A line the recorder answers: its reply must show up in the history as output.
            sent = outcome(await client.call_tool("sessions_send", {"sessionKey": probe, "message": '{"respond":1}'}))
            seen["probe_send"] = sent
            deadline = time.monotonic() + 30
            while True:
                h = outcome(await client.call_tool("sessions_history", {"sessionKey": probe}))
                outputs = [i for i in h.get("ok", {}).get("items", []) if i["type"] == "output"]
                if outputs or time.monotonic() > deadline:
                    seen["probe_history"] = h
                    break
                await anyio.sleep(0.05)
    return seen


async def main():
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    results = [await run_config(plan, cfg) for cfg in plan["configs"]]
    sys.stdout.write(json.dumps(results) + "\n")


anyio.run(main)
