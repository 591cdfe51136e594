#!/usr/bin/python3
# rt18 inetd service: three small writes to stdout without reading stdin, then exit
# ("nodelay": TCP_NODELAY on the socket first).
import os, socket, sys
if len(sys.argv) > 1 and sys.argv[1] == "nodelay":
    s = socket.socket(fileno=os.dup(1))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.write(1, b"a1 ")
os.write(1, b"b2 ")
os.write(1, b"c3\n")
