"""Interop check: drive an A2A v1.0 JSON-RPC agent with the official Python SDK (a2a-sdk 1.x).

Usage: python a2a_client_check.py <base-url>

Prints one JSON object per line on stdout, one per step ("step" names it), and
exits non-zero with a message on stderr as soon as a step sees something
unexpected. Only the SDK's public client API is used, so a passing run proves
that a stranger's client can talk to the server.

Run it with the venv at target/py-a2a-sdk: the tests create it on first use
(`cargo xtask py-sdk` does too), and KEEL_PYTHON overrides it.
"""

import asyncio
import json
import re
import sys
import uuid

import httpx
from a2a.client import (
    A2ACardResolver,
    A2AClientError,
    ClientConfig,
    ClientFactory,
)
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError
from google.protobuf.json_format import MessageToDict

TIMEOUT_SECONDS = 120.0


class CheckFailed(Exception):
    """A step saw something unexpected."""


def emit(step: str, **fields) -> None:
    """Prints one JSON line for a step."""
    print(json.dumps({"step": step, **fields}), flush=True)


def expect(condition: bool, message: str) -> None:
    """Fails the check unless condition holds."""
    if not condition:
        raise CheckFailed(message)


def state_name(task: Task) -> str:
    """The task's state as its proto enum name, e.g. TASK_STATE_COMPLETED."""
    return TaskState.Name(task.status.state)


def text_of(parts) -> str:
    """Concatenated text of the text parts."""
    return "".join(p.text for p in parts if p.HasField("text"))


def answer_of(task: Task) -> str:
    """The agent's answer: the status message's text, else the artifacts' text."""
    if task.status.HasField("message"):
        text = text_of(task.status.message.parts)
        if text:
            return text
    return "".join(text_of(a.parts) for a in task.artifacts)


def error_code(exc: Exception) -> int | None:
    """The JSON-RPC error code behind an SDK exception.

    Known A2A codes surface as typed subclasses of A2AError (e.g. -32002 is
    TaskNotCancelableError) carrying no code attribute, so the code is looked
    up from the SDK's own map; unknown codes surface as A2AClientError with the
    text "JSON-RPC Error <code>: <message>".
    """
    code = JSON_RPC_ERROR_CODE_MAP.get(type(exc))
    if code is not None:
        return code
    match = re.search(r"JSON-RPC Error (-?\d+)", str(exc))
    return int(match.group(1)) if match else None


def user_message(text: str) -> Message:
    """A fresh user message with one text part."""
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
    )


async def send(client, text: str, return_immediately: bool) -> Task:
    """SendMessage (non-streaming); expects the agent to answer with a Task."""
    request = SendMessageRequest(
        message=user_message(text),
        configuration=SendMessageConfiguration(return_immediately=return_immediately),
    )
    responses = [r async for r in client.send_message(request)]
    expect(len(responses) == 1, f"expected one SendMessage response, got {len(responses)}")
    expect(responses[0].HasField("task"), f"expected a task, got {MessageToDict(responses[0])}")
    return responses[0].task


async def check(base_url: str) -> None:
    """Runs every step against the agent at base_url."""
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        # streaming=False: use SendMessage (the agent's card says streaming: false anyway).
        # The factory adds the "A2A-Version: 1.0" header to this shared httpx client.
        factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))

        # a) the agent card from /.well-known/agent-card.json
        card = await A2ACardResolver(http, base_url).get_agent_card()
        interfaces = [MessageToDict(i) for i in card.supported_interfaces]
        emit("card", name=card.name, interfaces=interfaces,
             streaming=card.capabilities.streaming)
        expect(card.name != "", "agent card has no name")
        expect(any(i.get("protocolBinding") == "JSONRPC" for i in interfaces),
               "agent card advertises no JSONRPC interface")

        client = factory.create(card)
        try:
            # b) blocking SendMessage
            done = await send(client, "hello from python", return_immediately=False)
            answer = answer_of(done)
            emit("send", taskId=done.id, contextId=done.context_id,
                 state=state_name(done), answer=answer)
            expect(done.id != "", "SendMessage returned a task without id")
            expect(done.status.state == TaskState.TASK_STATE_COMPLETED,
                   f"expected TASK_STATE_COMPLETED, got {state_name(done)}")
            expect(answer != "", "completed task carries no answer text")

            # c) GetTask
            got = await client.get_task(GetTaskRequest(id=done.id))
            emit("get", taskId=got.id, state=state_name(got))
            expect(got.id == done.id, f"GetTask returned task {got.id!r}, asked for {done.id!r}")
            expect(got.status.state == TaskState.TASK_STATE_COMPLETED,
                   f"GetTask: expected TASK_STATE_COMPLETED, got {state_name(got)}")

            # d) returnImmediately, then CancelTask
            slow = await send(client, '/sleep {"seconds": 30}', return_immediately=True)
            emit("send_immediate", taskId=slow.id, state=state_name(slow))
            expect(slow.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                         TaskState.TASK_STATE_WORKING),
                   f"returnImmediately: expected SUBMITTED or WORKING, got {state_name(slow)}")
            canceled = await client.cancel_task(CancelTaskRequest(id=slow.id))
            emit("cancel", taskId=canceled.id, state=state_name(canceled))
            expect(canceled.status.state == TaskState.TASK_STATE_CANCELED,
                   f"CancelTask: expected TASK_STATE_CANCELED, got {state_name(canceled)}")

            # e) CancelTask on the completed task must fail with -32002
            try:
                again = await client.cancel_task(CancelTaskRequest(id=done.id))
            except (A2AError, A2AClientError) as exc:
                code = error_code(exc)
                emit("cancel_completed", taskId=done.id, errorCode=code,
                     error=type(exc).__name__, message=str(exc))
                expect(code == -32002, f"expected error -32002, got {code} ({exc!r})")
            else:
                raise CheckFailed(
                    f"canceling a completed task succeeded: {state_name(again)}")
        finally:
            await client.close()


def main() -> int:
    """Entry point: exit 0 when every step passed."""
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} <base-url>", file=sys.stderr)
        return 2
    try:
        asyncio.run(check(sys.argv[1]))
    except CheckFailed as exc:
        emit("failed", message=str(exc))
        print(f"a2a_client_check: FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any SDK/transport error fails the check loudly
        emit("failed", message=f"{type(exc).__name__}: {exc}")
        print(f"a2a_client_check: FAILED: {exc!r}", file=sys.stderr)
        return 1
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
