"""Interop check: which of the cards a server hands out are valid protobuf JSON of A2A's AgentCard?

Usage: python a2a_card_strict_check.py <base-url>

A2A v1.0's SDKs generate their types from a2a.proto; a client that parses the card with
`google.protobuf.json_format.Parse` (without `ignore_unknown_fields`) refuses any field the
proto does not define, such as the v0.3 fields (`url`, `preferredTransport`, ...). The SDK's
own card resolver parses leniently, so a passing SDK round trip does not prove this.

Prints one JSON object per line on stdout, one per card ("step" names it): whether the card
parses strictly ("strict"), the parser's complaint if not ("error"), whether it parses with
`ignore_unknown_fields` ("lenient"), and its top-level keys the proto does not define
("unknown"). It judges nothing itself: the test that runs it asserts which card must parse.
Exits non-zero only when a card cannot be fetched.

Run it with the A2A SDK 1.x venv (KEEL_PYTHON, see a2a_client_check.py).
"""

import json
import sys
import uuid

import httpx
from a2a.types.a2a_pb2 import AgentCard
from google.protobuf.json_format import Parse, ParseError

TIMEOUT_SECONDS = 60.0
V1 = {"A2A-Version": "1.0"}


def emit(step: str, **fields) -> None:
    """Prints one JSON line for a step."""
    print(json.dumps({"step": step, **fields}), flush=True)


def judge(step: str, text: str) -> None:
    """Parses `text` strictly and leniently as an AgentCard and reports both."""
    try:
        Parse(text, AgentCard())
        strict, error = True, None
    except ParseError as exc:
        strict, error = False, str(exc)
    try:
        Parse(text, AgentCard(), ignore_unknown_fields=True)
        lenient = True
    except ParseError:
        lenient = False
    known = {field.json_name for field in AgentCard.DESCRIPTOR.fields}
    unknown = sorted(set(json.loads(text)) - known)
    emit(step, strict=strict, error=error, lenient=lenient, unknown=unknown)


def main() -> int:
    """Entry point: fetches each card and judges it."""
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} <base-url>", file=sys.stderr)
        return 2
    base = sys.argv[1].rstrip("/")
    with httpx.Client(timeout=TIMEOUT_SECONDS) as http:
        gets = [
            ("card", "/.well-known/agent-card.json", {}),
            ("card_v1", "/.well-known/agent-card.json", V1),
            ("card_v03", "/.well-known/agent-card.json", {"A2A-Version": "0.3"}),
            ("legacy", "/.well-known/agent.json", {}),
            ("extended_rest", "/extendedAgentCard", V1),
        ]
        for step, path, headers in gets:
            response = http.get(base + path, headers=headers)
            response.raise_for_status()
            judge(step, response.text)
        rpc = http.post(
            base + "/",
            headers=V1,
            json={"jsonrpc": "2.0", "id": str(uuid.uuid4()),
                  "method": "GetExtendedAgentCard", "params": {}},
        )
        rpc.raise_for_status()
        judge("extended_jsonrpc", json.dumps(rpc.json()["result"]))
    emit("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
