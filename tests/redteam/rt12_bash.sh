#!/bin/bash
# Round 12: a shell that holds a connection (/dev/tcp) runs 200 short commands, and Python's
# os.wait / os.waitpid(-1) / subprocess with a connection open. Prints times to stderr.
PORT=${1:-41010}
python3 -c '
import socket,sys,time
l=socket.socket(); l.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
l.bind(("127.0.0.1",int(sys.argv[1]))); l.listen(8)
for _ in range(2):
    c,_=l.accept(); c.sendall(b"hi\n"); c.recv(10); time.sleep(0.1)
' $PORT &
for i in $(seq 50); do sleep 0.1; { exec 3<>/dev/tcp/127.0.0.1/$PORT; } 2>/dev/null && break; done
read -r greet <&3
echo "greet: $greet"
s=$(date +%s%N)
for i in $(seq 200); do /bin/true; done
e=$(date +%s%N)
echo "bash: 200 commands" ; echo "bash: $(( (e-s)/1000000 )) ms for 200 commands" >&2
s=$(date +%s%N)
for i in $(seq 100); do x=$(echo $i); done
e=$(date +%s%N)
echo "bash: 100 substitutions"; echo "bash: $(( (e-s)/1000000 )) ms for 100 command substitutions" >&2
echo bye >&3
exec 3>&-
python3 - $PORT <<'PY'
import os, socket, subprocess, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.recv(10)
for name in ("os.wait", "waitpid(-1)", "subprocess.run"):
    t = time.monotonic()
    for i in range(100):
        if name == "subprocess.run":
            subprocess.run(["/bin/true"])
            continue
        p = os.fork()
        if p == 0:
            os._exit(3)
        r = os.wait() if name == "os.wait" else os.waitpid(-1, 0)
        assert r[0] == p and os.WEXITSTATUS(r[1]) == 3
    print(name, "100 ok")
    print(name, "%.1f ms" % ((time.monotonic() - t) * 1e3), file=sys.stderr)
c.sendall(b"bye")
PY
wait
