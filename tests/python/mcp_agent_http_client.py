"""An MCP client of `keel serve`'s `/mcp`, written with the official Python MCP SDK's streamable
HTTP client. argv: the `/mcp` URL, a valid API key (sent as a bearer token), and the directory
where the `slow` agent's MCP server writes its markers (`started` once its tool runs). Prints
one JSON object per step on stdout, as the A2A check scripts do.

Steps: `unauthorized` (the HTTP status of an `initialize` without a token, and with a wrong
one); `tools` (every tool's name); `answer` (the `helper` agent's result); `cancel` (a call of
the `slow` agent, canceled with `notifications/cancelled` once its MCP tool has started; the
test then sees its task canceled over A2A).
"""

import asyncio
import json
import pathlib
import sys

import anyio
import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client

URL, KEY, MARKERS = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def result_fields(result):
    return {
        "isError": bool(result.isError),
        "text": "\n".join(block.text for block in result.content if block.type == "text"),
        "meta": result.meta or {},
    }


async def status_without(token):
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "check", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient() as client:
        response = await client.post(URL, json=initialize, headers=headers)
        return {"status": response.status_code, "body": response.json()}


async def main():
    emit("unauthorized", none=await status_without(None), wrong=await status_without("wrong-key"))
    headers = {"Authorization": f"Bearer {KEY}"}
    async with streamablehttp_client(URL, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            emit("tools", tools=[tool.name for tool in listed.tools])
            emit("answer", **result_fields(await session.call_tool("helper", {"message": "hello over HTTP"})))

            # The next request's id: the one `notifications/cancelled` names.
            request_id = session._request_id
            outcome = {}

            async def slow_call():
                slow = {"message": '/fixture_slow {"seconds": 120}'}
                outcome["result"] = await session.call_tool("slow", slow)

            async with anyio.create_task_group() as group:
                group.start_soon(slow_call)
                while not (MARKERS / "started").exists():
                    await anyio.sleep(0.05)
                cancelled = types.CancelledNotification(
                    method="notifications/cancelled",
                    params=types.CancelledNotificationParams(requestId=request_id, reason="the test gave up"),
                )
                await session.send_notification(types.ClientNotification(cancelled))
                # A canceled request gets no answer (MCP): the client stops waiting for one.
                group.cancel_scope.cancel()
            emit("cancel", sent=True, answered="result" in outcome)
    emit("done", ok=True)


asyncio.run(main())
