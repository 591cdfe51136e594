#!/usr/bin/env python3
# Round 13: a Python supervisor with a same-host connection open: a SIGCHLD handler stops the
# worker when its helper ends; the main thread waits for the worker (Popen.wait() ->
# os.waitpid(pid, 0)). usage: rt13_watchdog.py PORT
import os, signal, socket, subprocess, sys, time
port = int(sys.argv[1])
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port)); l.listen(1)
c = socket.create_connection(("127.0.0.1", port)); s, _ = l.accept()
c.sendall(b"x"); s.recv(1)  # the connection is up (SMC-D under the library)
worker = subprocess.Popen(["sleep", "1000"])
helper = subprocess.Popen(["sleep", "0.2"])
def on_chld(sig, frm):
    if helper.poll() is not None and worker.poll() is None:
        worker.terminate()
signal.signal(signal.SIGCHLD, on_chld)
t0 = time.time()
rc = worker.wait()
print("worker rc %d after %.1f s" % (rc, time.time() - t0))
