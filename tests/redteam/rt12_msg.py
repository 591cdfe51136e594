#!/usr/bin/env python3
"""Round 12: recvmsg's name, control messages and flags on a connection that fell back.
usage: rt12_msg.py PORT [nolibclient]
The server end (this process) reads with recvmsg under several options; the client is a
child process (without the library with `nolibclient`: the server's handshake then declines
on the client's first bytes and the socket stays a SOCKHASH member, `member::with_msg`).
Timestamps are printed as present/absent and whether they are within 5 s of now."""
import os, socket, struct, subprocess, sys, time

SO_TIMESTAMP = 29
SO_TIMESTAMPNS = 35
SO_TIMESTAMPING = 37
TCP_INQ = 36
TCP_CM_INQ = TCP_INQ

def fmt(anc):
    out = []
    for lvl, typ, data in anc:
        if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMP and len(data) >= 16:
            s, us = struct.unpack("qq", data[:16])
            out.append("SO_TIMESTAMP(%s)" % ("fresh" if abs(s + us / 1e6 - time.time()) < 5 else "stale %r" % s))
        elif lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= 16:
            s, ns = struct.unpack("qq", data[:16])
            out.append("SO_TIMESTAMPNS(%s)" % ("fresh" if abs(s + ns / 1e9 - time.time()) < 5 else "stale"))
        elif lvl == socket.IPPROTO_TCP and typ == TCP_CM_INQ:
            out.append("TCP_CM_INQ(%d)" % struct.unpack("i", data[:4])[0])
        else:
            out.append("(%d,%d,len %d)" % (lvl, typ, len(data)))
    return out

def main():
    port = int(sys.argv[1])
    nolib = len(sys.argv) > 2 and sys.argv[2] == "nolibclient"
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(4)
    env = dict(os.environ)
    if nolib:
        env.pop("LD_PRELOAD", None)
    # The client sends 6 messages of 100 bytes, one every 50 ms, then waits for "bye".
    client = subprocess.Popen([sys.executable, "-c", """
import socket, sys, time
c = socket.create_connection(("127.0.0.1", %d))
for i in range(8):
    c.sendall(bytes([65 + i]) * 100)
    time.sleep(0.05)
c.recv(10)
""" % port], env=env)
    s, _ = l.accept()
    if os.environ.get("EARLY"):
        # timestamps asked before the bytes arrive (the kernel stamps them then)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 0)
    time.sleep(0.6)  # every message is queued
    res = []
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    d, anc, fl, addr = s.recvmsg(100, 256)
    res.append(("timestamp", len(d), fmt(anc), fl, addr))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 0)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    d, anc, fl, addr = s.recvmsg(100, 256)
    res.append(("timestampns", len(d), fmt(anc), fl, addr))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 0)
    s.setsockopt(socket.IPPROTO_TCP, TCP_INQ, 1)
    d, anc, fl, addr = s.recvmsg(100, 256)
    res.append(("inq", len(d), fmt(anc), fl, addr))
    d, anc, fl, addr = s.recvmsg(100, 2)  # too small for the cmsg: MSG_CTRUNC
    res.append(("inq ctrunc", len(d), fmt(anc), fl & socket.MSG_CTRUNC, addr))
    d, anc, fl, addr = s.recvmsg(50, 0)
    res.append(("inq no control buffer", len(d), fmt(anc), fl, addr))
    s.setsockopt(socket.IPPROTO_TCP, TCP_INQ, 0)
    d, anc, fl, addr = s.recvmsg(50, 256, socket.MSG_PEEK)
    res.append(("peek", len(d), fmt(anc), fl, addr))
    d, anc, fl, addr = s.recvmsg(2000, 256)
    res.append(("rest", len(d), fmt(anc), fl, addr))
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    s.setsockopt(socket.IPPROTO_TCP, TCP_INQ, 1)
    s.setblocking(False)
    try:
        s.recvmsg(100, 256)
        res.append(("empty", "data?"))
    except BlockingIOError:
        res.append(("empty", "EAGAIN"))
    s.setblocking(True)
    s.sendall(b"bye")
    client.wait()
    d, anc, fl, addr = s.recvmsg(100, 256)
    res.append(("eof", len(d), fmt(anc), fl, addr))
    for r in res:
        print(*r)

main()
