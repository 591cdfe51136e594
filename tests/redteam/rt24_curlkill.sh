#!/bin/bash
# rt24: curl killed (SIGKILL) in the middle of a rate-limited 40 MB download from Python's
# http.server (ThreadingHTTPServer, sendfile through socket.sendfile/shutil), 5 times; then one
# whole download. What the server logs for the cut connections, and whether it still serves.
# usage: world.sh smc|tcp bash rt24_curlkill.sh
set -u
D=$(mktemp -d /tmp/rt24-curlkill.XXXX)
head -c 40000000 /dev/urandom > $D/f
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory $D $PORT > $D/log 2>&1 &
SP=$!
for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:$PORT/ && break; sleep 0.1; done
for i in 1 2 3 4 5; do
  curl -s --limit-rate 2M -o /dev/null http://127.0.0.1:$PORT/f & CP=$!
  sleep 0.7; kill -9 $CP; wait $CP 2>/dev/null
done
sleep 0.5
S=$(curl -s --max-time 20 http://127.0.0.1:$PORT/f | sha256sum | cut -c1-16)
echo "whole: $( [ "$S" = "$(sha256sum < $D/f | cut -c1-16)" ] && echo right || echo WRONG)"
kill $SP; wait $SP 2>/dev/null
echo "server errors: $(grep -oE '(BrokenPipe|ConnectionReset|ConnectionAborted|TimeoutError)[A-Za-z]*' $D/log | sort | uniq -c | tr '\n' ' ')"
echo "requests logged: $(grep -c '"GET /f' $D/log)"
rm -rf $D
