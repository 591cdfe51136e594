#!/bin/bash
# Round 14: bash /dev/tcp with an image without the library on the connection (env -i).
# usage: rt14_bash.sh PORT N MODE
#   closed: the server replies one line and closes; bash reads the line with `read`, then
#           `env -i cat <&3` reads the rest (nothing: EOF)
#   more:   the server replies two lines and closes; bash reads one, env -i cat the other
#   open:   the server replies one line and keeps the connection open 1 s, then closes
P=$1; N=$2; M=$3
python3 - "$P" "$N" "$M" <<'PY' &
import socket, sys, time
p, n, m = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", p)); l.listen(8)
for i in range(n):
    s, _ = l.accept()
    s.recv(100)
    s.sendall(b"line1\n" + (b"line2\n" if m == "more" else b""))
    if m == "open":
        time.sleep(1)
    s.close()
PY
sleep 0.5
for i in $(seq $N); do
  exec 3<>/dev/tcp/127.0.0.1/$P
  echo req >&3
  read -r a <&3
  sleep 0.1
  b=$(env -i /bin/cat <&3 2>&1); rc=$?
  exec 3<&-
  echo "$M: read [$a] cat [$b] rc=$rc"
done | sort | uniq -c
wait
