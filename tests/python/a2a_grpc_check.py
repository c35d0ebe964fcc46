"""Interop check: the official Python SDK (a2a-sdk 1.x with its grpc extra) over the gRPC
binding of an A2A v1.0 agent, found from the agent card: a streamed message, GetTask,
resubscribe and cancel, ListTasks, and the typed errors of an unknown task and of a
subscription to a finished one.

Usage: python a2a_grpc_check.py <base-url>

Prints one JSON object per line on stdout ("step" names it) and exits non-zero with a message
on stderr as soon as a step sees something unexpected. Only the SDK's public client API is used.
"""

import asyncio
import json
import sys
import uuid

import grpc
import httpx
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
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


class CheckFailed(Exception):
    """A step saw something unexpected."""


def emit(step: str, **fields) -> None:
    print(json.dumps({"step": step, **fields}), flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def user_message(text: str, context_id: str) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=context_id,
    )


def kind(event) -> str:
    return event.WhichOneof("payload")


def state_of(event) -> str:
    if kind(event) == "task":
        return TaskState.Name(event.task.status.state)
    if kind(event) == "status_update":
        return TaskState.Name(event.status_update.status.state)
    return ""


async def error_code(call) -> tuple[str, int | None]:
    """The SDK's error for an awaited call or a stream: its class name and JSON-RPC code."""
    try:
        result = call()
        if hasattr(result, "__aiter__"):
            _ = [e async for e in result]
        else:
            await result
    except (A2AError, A2AClientError) as exc:
        return type(exc).__name__, JSON_RPC_ERROR_CODE_MAP.get(type(exc))
    raise CheckFailed("the call succeeded")


async def check(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        grpc_urls = [i.url for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
        emit("card", bindings=[i.protocol_binding for i in card.supported_interfaces],
             grpc=grpc_urls)
        expect(len(grpc_urls) == 1, "the card lists no gRPC interface")
        factory = ClientFactory(ClientConfig(
            streaming=True,
            httpx_client=http,
            supported_protocol_bindings=["GRPC"],
            grpc_channel_factory=grpc.aio.insecure_channel,
        ))
        client = factory.create(card)
        context_id = f"py-grpc-{uuid.uuid4()}"
        try:
            events = [e async for e in client.send_message(
                SendMessageRequest(message=user_message("hello grpc", context_id)))]
            kinds = [kind(e) for e in events]
            emit("stream", kinds=kinds, last=state_of(events[-1]))
            expect(kinds[0] == "task", f"first event is {kinds[0]}")
            expect(state_of(events[-1]) == "TASK_STATE_COMPLETED",
                   f"last event state {state_of(events[-1])}")
            done_id = events[0].task.id

            task = await client.get_task(GetTaskRequest(id=done_id, history_length=1))
            emit("get", state=TaskState.Name(task.status.state), history=len(task.history))
            expect(task.id == done_id, "GetTask answered another task")

            stream = client.send_message(SendMessageRequest(
                message=user_message('/sleep {"seconds": 30}', context_id)))
            first = await stream.__anext__()
            await stream.aclose()
            slow_id = first.task.id
            subscription = client.subscribe(SubscribeToTaskRequest(id=slow_id))
            sub_first = await subscription.__anext__()
            expect(kind(sub_first) == "task", f"resubscribe starts with {kind(sub_first)}")
            canceled = await client.cancel_task(CancelTaskRequest(id=slow_id))
            rest = [e async for e in subscription]
            finals = [state_of(e) for e in rest if state_of(e) == "TASK_STATE_CANCELED"]
            emit("resubscribe", cancel=TaskState.Name(canceled.status.state), finals=finals)

            listed = await client.list_tasks(ListTasksRequest(context_id=context_id, page_size=10))
            emit("list", ids=[t.id for t in listed.tasks], total=listed.total_size)

            name, code = await error_code(
                lambda: client.get_task(GetTaskRequest(id="no-such-task")))
            emit("unknown_task", error=name, code=code)
            name, code = await error_code(
                lambda: client.subscribe(SubscribeToTaskRequest(id=done_id)))
            emit("subscribe_finished", error=name, code=code)
        finally:
            await client.close()


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} <base-url>", file=sys.stderr)
        return 2
    try:
        asyncio.run(check(sys.argv[1]))
    except CheckFailed as exc:
        emit("failed", message=str(exc))
        print(f"a2a_grpc_check: FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any SDK/transport error fails the check loudly
        emit("failed", message=f"{type(exc).__name__}: {exc}")
        print(f"a2a_grpc_check: FAILED: {exc!r}", file=sys.stderr)
        return 1
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
