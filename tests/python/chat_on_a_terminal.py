"""Drive `keel chat` on a pseudo-terminal as a person would: ask for a tool that needs
approval, answer the prompt with the key given, then press Ctrl-D once at `you>`.

Usage: chat_on_a_terminal.py KEEL_BINARY ANSWER_KEY. Prints one JSON line:
{"prompted": bool, "answered": bool, "ended_on_first_ctrl_d": bool, "output": str}.
Standard library only (pty), so it runs wherever python3 does.
"""

import json
import os
import pty
import select
import sys
import time

keel, answer = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(keel, [keel, "chat", "--store", "memory"])

output = b""


def read_until(done, seconds=30.0):
    """Read what the chat writes until `done(output)` or `seconds` pass."""
    global output
    deadline = time.time() + seconds
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return done(output)
            if not chunk:
                return done(output)
            output += chunk
            if done(output):
                return True
    return done(output)


def exited(seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        read_until(lambda _: False, 0.1)
    return False


read_until(lambda out: b"you>" in out)
os.write(fd, b'/weather {"city": "Oslo"}\r')
prompted = read_until(lambda out: b"Approve" in out)
os.write(fd, answer.encode())
answered = read_until(lambda out: out.count(b"you>") >= 2)
os.write(fd, b"\x04")
ended = exited(10.0)
if not ended:
    os.kill(pid, 9)
print(json.dumps({
    "prompted": prompted,
    "answered": answered,
    "ended_on_first_ctrl_d": ended,
    "output": output.decode(errors="replace")[-400:],
}))
