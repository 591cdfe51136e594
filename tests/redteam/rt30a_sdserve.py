# rt30a_sdserve.py listen|accept|inetd TAG: the program systemd-socket-activate starts.
# listen: serves the LISTEN_FDS listeners (fd 3..) with rt30a_group.py's echo protocol.
# accept: fd 3 is one connection; inetd: fd 0/1 is one connection.
import os, sys, socket
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rt30a_group as g
mode, tag = sys.argv[1], sys.argv[2]
tag += "L" if "LD_PRELOAD" in os.environ else "P"
if mode == "listen":
    n = int(os.environ.get("LISTEN_FDS", "0"))
    g.serve_all([socket.socket(fileno=3 + i) for i in range(n)], tag)
elif mode == "accept":
    g.handle(socket.socket(fileno=3), tag)
else:
    g.handle(socket.socket(fileno=0), tag)
