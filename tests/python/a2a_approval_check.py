"""Interop check: approve and deny a waiting action with the official Python SDK (a2a-sdk 1.x).

Usage: python a2a_approval_check.py <base-url> <alice-key> <bob-key>

The agent at base-url must ask for approval before it runs `run_code` (a keel.toml agent
with `tools.run_code = true` and `policy.default = "require_approval"`), and know two
API keys of two tenants. A task waiting for approval is TASK_STATE_INPUT_REQUIRED with the
request at the metadata path the card's approval extension names (`pendingMetadataPath`:
`metadata.keel.pendingApproval`, in camelCase); a message to it whose one part is the data part
{"approval": {"requestId", "decision", "reason"}} answers it (docs/approvals.md).

Prints one JSON object per line on stdout, one per step ("step" names it), and exits
non-zero with a message on stderr as soon as a step sees something unexpected. Only the
SDK's public client API is used.
"""

import asyncio
import json
import re
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, A2AError
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

TIMEOUT_SECONDS = 120.0
APPROVAL_EXTENSION = "https://keel.dev/extensions/approval/v1"
ASK = '/run_code {"source": "export default 6 * 7", "language": "javascript"}'


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
    return TaskState.Name(task.status.state)


def error_code(exc: Exception) -> int | None:
    """The JSON-RPC error code behind an SDK exception (typed, or in the text)."""
    code = JSON_RPC_ERROR_CODE_MAP.get(type(exc))
    if code is not None:
        return code
    match = re.search(r"JSON-RPC Error (-?\d+)", str(exc))
    return int(match.group(1)) if match else None


def text_message(text: str) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])


def approval_message(task_id: str, request_id: str, decision: str, reason: str) -> Message:
    """The message that answers the task's pending request."""
    data = ParseDict(
        {"approval": {"requestId": request_id, "decision": decision, "reason": reason}},
        struct_pb2.Value(),
    )
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        task_id=task_id,
        parts=[Part(data=data)],
    )


async def send_one(client, message: Message) -> Task:
    """Blocking SendMessage; expects one task back."""
    responses = [r async for r in client.send_message(SendMessageRequest(message=message))]
    expect(len(responses) == 1, f"expected one response, got {len(responses)}")
    expect(responses[0].HasField("task"), f"expected a task, got {MessageToDict(responses[0])}")
    return responses[0].task


async def expect_error(client, message: Message, code: int, step: str, contains: str = "") -> None:
    try:
        task = await send_one(client, message)
    except (A2AError, A2AClientError) as exc:
        got = error_code(exc)
        emit(step, errorCode=got, error=type(exc).__name__, message=str(exc))
        expect(got == code, f"{step}: expected error {code}, got {got} ({exc!r})")
        expect(contains in str(exc), f"{step}: `{contains}` not in {exc}")
    else:
        raise CheckFailed(f"{step}: expected error {code}, got a task in {state_name(task)}")


def pending_path(card) -> list[str]:
    """Where the approval extension says a task keeps its pending request."""
    for extension in card.capabilities.extensions:
        if extension.uri == APPROVAL_EXTENSION:
            path = MessageToDict(extension.params).get("pendingMetadataPath", [])
            expect(isinstance(path, list) and len(path) > 0,
                   f"the approval extension names no pendingMetadataPath: {extension}")
            return path
    raise CheckFailed(f"the card does not declare {APPROVAL_EXTENSION}")


async def waiting_task(client, path: list[str]) -> tuple[str, str]:
    """A new task that waits for approval, and its pending request id."""
    task = await send_one(client, text_message(ASK))
    expect(task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED,
           f"expected TASK_STATE_INPUT_REQUIRED, got {state_name(task)}")
    metadata = MessageToDict(task.metadata)
    # Keel's own fields are in one namespaced object, none in snake_case at the top level.
    snake = [key for key in metadata if "_" in key]
    expect(snake == [], f"snake_case keys at the top of the task's metadata: {snake}")
    pending = metadata
    for key in path:
        pending = pending.get(key, {}) if isinstance(pending, dict) else {}
    request_id = pending.get("requestId", "")
    expect(request_id != "", f"no requestId at metadata.{'.'.join(path)} in {metadata}")
    return task.id, request_id


def client_for(http: httpx.AsyncClient, card, streaming: bool):
    return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)


async def check(base_url: str, alice_key: str, bob_key: str) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS, headers={"X-API-Key": alice_key}) as alice_http, \
            httpx.AsyncClient(timeout=TIMEOUT_SECONDS, headers={"X-API-Key": bob_key}) as bob_http:
        card = await A2ACardResolver(alice_http, base_url).get_agent_card()
        uris = [e.uri for e in card.capabilities.extensions]
        emit("card", extensions=uris)
        expect(APPROVAL_EXTENSION in uris, f"the card does not declare {APPROVAL_EXTENSION}")
        path = pending_path(card)

        alice = client_for(alice_http, card, streaming=False)
        bob = client_for(bob_http, card, streaming=False)
        try:
            task_id, request_id = await waiting_task(alice, path)
            emit("waiting", taskId=task_id, requestId=request_id)

            # Another tenant's task does not exist for Bob.
            await expect_error(bob, approval_message(task_id, request_id, "approve", "mine now"),
                               -32001, "other_tenant")
            # A decision for another request is invalid.
            await expect_error(alice, approval_message(task_id, "no-such-request", "approve", ""),
                               -32602, "wrong_request", "no-such-request")

            done = await send_one(alice, approval_message(task_id, request_id, "approve", "ok"))
            emit("approve", taskId=done.id, state=state_name(done))
            expect(done.status.state == TaskState.TASK_STATE_COMPLETED,
                   f"approve: expected TASK_STATE_COMPLETED, got {state_name(done)}")
            ran = json.dumps([MessageToDict(m) for m in done.history])
            expect("42" in ran, "the approved code did not run")

            # The task waits no more: a second decision names its state.
            await expect_error(alice, approval_message(task_id, request_id, "approve", ""),
                               -32602, "not_waiting", "completed")

            # Deny over streaming: the stream follows the resumed turn to its end.
            streaming = client_for(alice_http, card, streaming=True)
            try:
                denied_id, denied_request = await waiting_task(alice, path)
                events = [e async for e in streaming.send_message(SendMessageRequest(
                    message=approval_message(denied_id, denied_request, "deny", "not today")))]
                states = []
                for e in events:
                    kind = e.WhichOneof("payload")
                    if kind == "task":
                        states.append(TaskState.Name(e.task.status.state))
                    elif kind == "status_update":
                        states.append(TaskState.Name(e.status_update.status.state))
                emit("deny_stream", taskId=denied_id, states=states)
                expect(states and states[-1] == "TASK_STATE_COMPLETED",
                       f"deny: the stream ended at {states}")
                got = await streaming.get_task(GetTaskRequest(id=denied_id))
                history = json.dumps([MessageToDict(m) for m in got.history])
                expect("denied: not today" in history,
                       "the model did not see the denial as the tool's result")
            finally:
                await streaming.close()
        finally:
            await alice.close()
            await bob.close()


def main() -> int:
    if len(sys.argv) != 4:
        print(f"usage: {sys.argv[0]} <base-url> <alice-key> <bob-key>", file=sys.stderr)
        return 2
    try:
        asyncio.run(check(*sys.argv[1:]))
    except CheckFailed as exc:
        emit("failed", message=str(exc))
        print(f"a2a_approval_check: FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any SDK/transport error fails the check loudly
        emit("failed", message=f"{type(exc).__name__}: {exc}")
        print(f"a2a_approval_check: FAILED: {exc!r}", file=sys.stderr)
        return 1
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
