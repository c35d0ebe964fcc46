"""Interop check: drive an agent with the official Python SDK 0.3.x (a2a-sdk<0.4), a v0.3 client.

Usage: python a2a_v03_client_check.py <base-url>

Prints one JSON object per line on stdout, one per step ("step" names it), and
exits non-zero with a message on stderr as soon as a step sees something
unexpected. Only the SDK's public client API is used: the card is fetched and
validated by the SDK's own pydantic types (so it must be a complete v0.3 card),
and the client speaks v0.3 JSON-RPC (`message/send`, `tasks/get`,
`tasks/cancel`) with no A2A-Version header.

Run it with the venv at target/py-a2a-sdk-v03: the tests create it on first use
(`cargo xtask py-sdk` does too), and KEEL_PYTHON_V03 overrides it.
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    Message,
    MessageSendConfiguration,
    Part,
    Role,
    Task,
    TaskIdParams,
    TaskQueryParams,
    TaskState,
    TextPart,
    TransportProtocol,
)

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


def text_of(parts) -> str:
    """Concatenated text of the text parts."""
    return "".join(p.root.text for p in parts or [] if isinstance(p.root, TextPart))


def answer_of(task: Task) -> str:
    """The agent's answer: the status message's text, else the artifacts' text."""
    if task.status.message is not None:
        text = text_of(task.status.message.parts)
        if text:
            return text
    return "".join(text_of(a.parts) for a in task.artifacts or [])


def user_message(text: str) -> Message:
    """A fresh user message with one text part."""
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
    )


async def send(client, text: str, blocking: bool) -> Task:
    """message/send (non-streaming); expects the agent to answer with a Task."""
    events = [
        e
        async for e in client.send_message(
            user_message(text),
            configuration=MessageSendConfiguration(blocking=blocking),
        )
    ]
    expect(len(events) == 1, f"expected one message/send result, got {len(events)}")
    event = events[0]
    expect(isinstance(event, tuple), f"expected a task, got {event!r}")
    return event[0]


async def check(base_url: str) -> None:
    """Runs every step against the agent at base_url."""
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        # a) the card where the 0.3 SDK looks by default (/.well-known/agent-card.json, no
        #    A2A-Version), parsed by its pydantic AgentCard (a missing `url`,
        #    `capabilities` or a 1.0-shaped field it validates would fail here); the
        #    legacy path /.well-known/agent.json serves the same v0.3 form
        card = await A2ACardResolver(http, base_url).get_agent_card()
        legacy = await A2ACardResolver(
            http, base_url, agent_card_path="/.well-known/agent.json"
        ).get_agent_card()
        expect(legacy == card, f"the legacy path serves another card: {legacy} != {card}")
        emit(
            "card",
            name=card.name,
            url=card.url,
            protocolVersion=card.protocol_version,
            preferredTransport=card.preferred_transport,
            additionalInterfaces=[i.model_dump(mode="json") for i in card.additional_interfaces or []],
            streaming=card.capabilities.streaming,
            pushNotifications=card.capabilities.push_notifications,
        )
        expect(card.name != "", "agent card has no name")
        expect((card.protocol_version or "").startswith("0.3"),
               f"card protocolVersion is {card.protocol_version!r}, not 0.3")

        factory = ClientFactory(ClientConfig(
            streaming=False,
            httpx_client=http,
            supported_transports=[TransportProtocol.jsonrpc],
        ))
        client = factory.create(card)
        try:
            # b) blocking message/send
            done = await send(client, "hello from python 0.3", blocking=True)
            answer = answer_of(done)
            emit("send", taskId=done.id, contextId=done.context_id,
                 state=done.status.state.value, answer=answer)
            expect(done.status.state == TaskState.completed,
                   f"expected completed, got {done.status.state}")
            expect(answer != "", "completed task carries no answer text")

            # c) tasks/get
            got = await client.get_task(TaskQueryParams(id=done.id))
            emit("get", taskId=got.id, state=got.status.state.value,
                 history=len(got.history or []))
            expect(got.id == done.id, f"tasks/get returned {got.id!r}, asked for {done.id!r}")
            expect(got.status.state == TaskState.completed,
                   f"tasks/get: expected completed, got {got.status.state}")

            # d) non-blocking message/send, then tasks/cancel
            slow = await send(client, '/sleep {"seconds": 30}', blocking=False)
            emit("send_immediate", taskId=slow.id, state=slow.status.state.value)
            expect(slow.status.state in (TaskState.submitted, TaskState.working),
                   f"blocking=false: expected submitted or working, got {slow.status.state}")
            canceled = await client.cancel_task(TaskIdParams(id=slow.id))
            emit("cancel", taskId=canceled.id, state=canceled.status.state.value)
            expect(canceled.status.state == TaskState.canceled,
                   f"tasks/cancel: expected canceled, got {canceled.status.state}")
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
        print(f"a2a_v03_client_check: FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any SDK/transport error fails the check loudly
        emit("failed", message=f"{type(exc).__name__}: {exc}")
        print(f"a2a_v03_client_check: FAILED: {exc!r}", file=sys.stderr)
        return 1
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
