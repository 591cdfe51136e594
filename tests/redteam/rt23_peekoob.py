#!/usr/bin/python3
"""Red team round 23: an urgent mark ahead of the read position against a blocking peek.

usage: rt23_peekoob.py MODE   (under tests/redteam/world.sh smc|tcp)

The writer (the peer: uid nobody when run as root and RT_AS_NOBODY=1) sends 10 bytes, one
urgent byte (MSG_OOB) and 200 more. The reader (this process) then peeks for more than the
10 bytes before the mark:
  waitall  recv(100, MSG_PEEK|MSG_WAITALL)
  lowat    SO_RCVLOWAT 100, recv(1000, MSG_PEEK)
  peekoff  SO_PEEK_OFF 20 (past the mark), recv(50, MSG_PEEK|MSG_WAITALL)
  peekmark SO_PEEK_OFF 10 (at the mark), recv(50, MSG_PEEK|MSG_WAITALL)
  read     recv(100, MSG_WAITALL) (no peek: stopped at the mark before as well)
TCP (tcp_recvmsg_locked) stops a read that copied bytes at the mark: 10 bytes. Prints
`PEEK mode=M n=N cpu=S` (cpu: the reader's CPU seconds in the call), or HANG after WATCHDOG seconds
(env RT_WATCHDOG, default 5; a watchdog thread).
"""
import os
import resource
import signal
import socket
import sys
import threading
import time

MODE = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
port = srv.getsockname()[1]

rfd, wfd = os.pipe()
pid = os.fork()
if pid == 0:
    srv.close()
    os.close(rfd)
    if os.environ.get("RT_AS_NOBODY") == "1" and os.getuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    c = socket.socket()
    c.connect(("127.0.0.1", port))
    c.sendall(b"a" * 10)
    c.send(b"X", socket.MSG_OOB)
    c.sendall(b"b" * 200)
    os.write(wfd, b"s")  # all sent
    # Stay until the reader is done (its close).
    c.recv(1)
    os._exit(0)

srv.settimeout(20)
s, _ = srv.accept()
s.settimeout(None)
os.close(wfd)
# Everything is there before the reader peeks: the writer said it sent it all.
assert os.read(rfd, 1) == b"s"


def hang():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"PEEK mode={MODE} HANG cpu={ru.ru_utime + ru.ru_stime - t0:.2f} in {WATCHDOG:g} s", flush=True)
    os.kill(pid, signal.SIGKILL)
    os._exit(3)


# A watchdog thread (the call releases the GIL; a spinning call would never see a signal).
WATCHDOG = float(os.environ.get("RT_WATCHDOG", "5"))
dog = threading.Timer(WATCHDOG, hang)
dog.daemon = True
ru = resource.getrusage(resource.RUSAGE_SELF)
t0 = ru.ru_utime + ru.ru_stime
dog.start()
if MODE == "waitall":
    b = s.recv(100, socket.MSG_PEEK | socket.MSG_WAITALL)
elif MODE == "lowat":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 100)
    b = s.recv(1000, socket.MSG_PEEK)
elif MODE == "peekoff":
    s.setsockopt(socket.SOL_SOCKET, 42, 20)  # SO_PEEK_OFF
    b = s.recv(50, socket.MSG_PEEK | socket.MSG_WAITALL)
elif MODE == "peekmark":
    s.setsockopt(socket.SOL_SOCKET, 42, 10)  # SO_PEEK_OFF: at the mark
    b = s.recv(50, socket.MSG_PEEK | socket.MSG_WAITALL)
elif MODE == "read":
    b = s.recv(100, socket.MSG_WAITALL)
else:
    sys.exit(f"mode {MODE}?")
dog.cancel()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"PEEK mode={MODE} n={len(b)} head={b[:12]!r} cpu={ru.ru_utime + ru.ru_stime - t0:.2f}", flush=True)
s.close()
os.waitpid(pid, 0)
