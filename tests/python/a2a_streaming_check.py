"""Interop check: streaming, resubscribe and ListTasks with the official Python SDK (a2a-sdk
1.x), over the JSON-RPC and the HTTP+JSON bindings of an A2A v1.0 agent.

Usage: python a2a_streaming_check.py <base-url>

Prints one JSON object per line on stdout ("step" names it, "binding" the binding used) and
exits non-zero with a message on stderr as soon as a step sees something unexpected. Only the
SDK's public client API is used.
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError

TIMEOUT_SECONDS = 120.0
BINDINGS = ("JSONRPC", "HTTP+JSON")


class CheckFailed(Exception):
    """A step saw something unexpected."""


def emit(step: str, **fields) -> None:
    print(json.dumps({"step": step, **fields}), flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def user_message(text: str, context_id: str = "") -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=context_id,
    )


def kind(event) -> str:
    """Which StreamResponse payload an event carries."""
    return event.WhichOneof("payload")


def state_of(event) -> str:
    if kind(event) == "task":
        return TaskState.Name(event.task.status.state)
    if kind(event) == "status_update":
        return TaskState.Name(event.status_update.status.state)
    return ""


async def check_binding(http: httpx.AsyncClient, card, binding: str) -> None:
    factory = ClientFactory(
        ClientConfig(
            streaming=True,
            httpx_client=http,
            supported_protocol_bindings=[binding],
            use_client_preference=True,
        )
    )
    client = factory.create(card)
    context_id = f"py-{binding}-{uuid.uuid4()}"
    try:
        # a) SendStreamingMessage: task first, updates, ends after the final status.
        events = [e async for e in client.send_message(
            SendMessageRequest(message=user_message("hello stream", context_id)))]
        kinds = [kind(e) for e in events]
        emit("stream", binding=binding, kinds=kinds, last=state_of(events[-1]))
        expect(kinds[0] == "task", f"first event is {kinds[0]}")
        expect("artifact_update" in kinds, f"no artifact update in {kinds}")
        expect(state_of(events[-1]) == "TASK_STATE_COMPLETED",
               f"last event state {state_of(events[-1])}")
        done_id = events[0].task.id

        # b) A slow task: read its first event, hang up, resubscribe, cancel, see the end.
        stream = client.send_message(SendMessageRequest(
            message=user_message('/sleep {"seconds": 30}', context_id)))
        first = await stream.__anext__()
        await stream.aclose()
        expect(kind(first) == "task", f"first event is {kind(first)}")
        slow_id = first.task.id
        subscription = client.subscribe(SubscribeToTaskRequest(id=slow_id))
        sub_first = await subscription.__anext__()
        expect(kind(sub_first) == "task" and sub_first.task.id == slow_id,
               f"resubscribe starts with {kind(sub_first)}")
        expect(state_of(sub_first) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"),
               f"resubscribed task is {state_of(sub_first)}")
        canceled = await client.cancel_task(CancelTaskRequest(id=slow_id))
        rest = [e async for e in subscription]
        finals = [state_of(e) for e in rest if state_of(e) == "TASK_STATE_CANCELED"]
        emit("resubscribe", binding=binding, first=state_of(sub_first),
             cancel=TaskState.Name(canceled.status.state), finals=finals)
        expect(finals == ["TASK_STATE_CANCELED"], f"expected one canceled event, got {finals}")

        # c) ListTasks: both tasks of this context, most recent first.
        listed = await client.list_tasks(ListTasksRequest(context_id=context_id, page_size=10))
        ids = [t.id for t in listed.tasks]
        emit("list", binding=binding, ids=ids, total=listed.total_size,
             next=listed.next_page_token)
        expect(ids == [slow_id, done_id], f"ListTasks answered {ids}")
        expect(listed.next_page_token == "", "a single page has no next token")

        # d) SubscribeToTask on a finished task fails with UnsupportedOperationError.
        try:
            _ = [e async for e in client.subscribe(SubscribeToTaskRequest(id=done_id))]
        except (A2AError, A2AClientError) as exc:
            code = JSON_RPC_ERROR_CODE_MAP.get(type(exc))
            emit("subscribe_finished", binding=binding, error=type(exc).__name__, code=code)
            expect(code == -32004, f"expected -32004, got {code} ({exc!r})")
        else:
            raise CheckFailed("subscribing to a finished task succeeded")
    finally:
        await client.close()


async def check(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        emit("card", streaming=card.capabilities.streaming,
             bindings=[i.protocol_binding for i in card.supported_interfaces])
        expect(card.capabilities.streaming, "the card does not offer streaming")
        for binding in BINDINGS:
            await check_binding(http, card, binding)


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} <base-url>", file=sys.stderr)
        return 2
    try:
        asyncio.run(check(sys.argv[1]))
    except CheckFailed as exc:
        emit("failed", message=str(exc))
        print(f"a2a_streaming_check: FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any SDK/transport error fails the check loudly
        emit("failed", message=f"{type(exc).__name__}: {exc}")
        print(f"a2a_streaming_check: FAILED: {exc!r}", file=sys.stderr)
        return 1
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
