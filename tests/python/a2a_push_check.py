"""Interop check: the push notification config operations with the official Python SDK
(a2a-sdk 1.x), over the JSON-RPC and the HTTP+JSON bindings of an A2A v1.0 agent.

Usage: python a2a_push_check.py <base-url>

Prints one JSON object per line on stdout and exits non-zero with a message on stderr as soon
as a step sees something unexpected. Only the SDK's public client API is used. The webhook is
a public address that is never reached before the config is deleted.
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskPushNotificationConfig,
)

TIMEOUT_SECONDS = 60.0
BINDINGS = ("JSONRPC", "HTTP+JSON")
WEBHOOK = "http://8.8.8.8/keel-push-check"


class CheckFailed(Exception):
    """A step saw something unexpected."""


def emit(step: str, **fields) -> None:
    print(json.dumps({"step": step, **fields}), flush=True)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def check_binding(http: httpx.AsyncClient, card, binding: str) -> None:
    factory = ClientFactory(
        ClientConfig(
            streaming=False,
            httpx_client=http,
            supported_protocol_bindings=[binding],
            use_client_preference=True,
        )
    )
    client = factory.create(card)
    try:
        message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                          parts=[Part(text='/sleep {"seconds": 30}')])
        events = [e async for e in client.send_message(SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)))]
        task = events[0].task
        expect(task.id != "", "no task")
        config_id = f"hook-{binding}"
        created = await client.create_task_push_notification_config(TaskPushNotificationConfig(
            task_id=task.id, id=config_id, url=WEBHOOK, token="tok",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="secret")))
        emit("create", binding=binding, id=created.id, url=created.url)
        expect(created.id == config_id and created.url == WEBHOOK, f"created {created}")
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id=config_id))
        expect(got.token == "tok" and got.authentication.scheme == "Bearer", f"got {got}")
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id))
        emit("list", binding=binding, ids=[c.id for c in listed.configs])
        expect([c.id for c in listed.configs] == [config_id], f"listed {listed}")
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=config_id))
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id))
        emit("deleted", binding=binding, left=len(listed.configs))
        expect(len(listed.configs) == 0, f"still listed {listed}")
        await client.cancel_task(CancelTaskRequest(id=task.id))
    finally:
        await client.close()


async def check(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        emit("card", push=card.capabilities.push_notifications)
        expect(card.capabilities.push_notifications, "the card does not offer push")
        for binding in BINDINGS:
            await check_binding(http, card, binding)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        asyncio.run(asyncio.wait_for(check(sys.argv[1]), TIMEOUT_SECONDS))
    except CheckFailed as exc:
        print(f"check failed: {exc}", file=sys.stderr)
        return 1
    emit("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
