#!/usr/bin/env python3
# activate.py SOCKET OWNER GROUP MODE COMMAND...: socket activation as
# systemd does it for keyfence-agent.socket (deployed.sh stands it in for
# PID 1). This process, not the agent, makes SOCKET (SocketUser=OWNER,
# SocketGroup=GROUP, SocketMode=MODE, in octal), listens on it, and starts
# COMMAND with the listening socket at descriptor 3, LISTEN_FDS=1 and
# LISTEN_PID set to the started process's own pid (through `sh -c '...
# exec'`, so that the pid is the agent's once COMMAND execs it). It keeps
# its own copy of the socket open while COMMAND runs and after it ends, as
# PID 1 does. It prints `agent PID` first; on SIGTERM (systemd stopping the
# socket unit) it removes the socket file (RemoveOnStop=yes) and exits.
# It never kills the agent: its caller does, by the printed pid.
import grp
import os
import pwd
import signal
import socket
import subprocess
import sys

path, owner, group, mode = sys.argv[1:5]
command = sys.argv[5:]
if os.path.lexists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
made = os.stat(path)
os.chown(path, pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid)
os.chmod(path, int(mode, 8))
# Backlog=: systemd's default is SOMAXCONN.
s.listen(socket.SOMAXCONN)


def stop(*_):
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
            os.unlink(path)
    except OSError:
        pass
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)
agent = subprocess.Popen(["sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh"] + command, pass_fds=[3])
print("agent", agent.pid, flush=True)
agent.wait()
print("agent ended", agent.returncode, flush=True)
# Still listening, as PID 1 is, until stopped.
while True:
    signal.pause()
