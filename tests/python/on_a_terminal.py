"""Run a command on a pseudo-terminal (stdout and stderr both on it, as in a person's
terminal) and report what the terminal showed.

Usage: on_a_terminal.py COMMAND [ARGS...]. Prints one JSON line:
{"status": exit code or null, "output": str}. Standard library only (pty).
"""

import json
import os
import pty
import select
import sys
import time

pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])

output = b""
deadline = time.time() + 60.0
while time.time() < deadline:
    ready, _, _ = select.select([fd], [], [], 0.1)
    if not ready:
        continue
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    output += chunk
status = None
for _ in range(100):
    done, code = os.waitpid(pid, os.WNOHANG)
    if done:
        status = os.waitstatus_to_exitcode(code)
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
print(json.dumps({"status": status, "output": output.decode(errors="replace")}))
