#!/bin/bash
# rt18_nagle.sh OUTDIR [INETD-FLAGS]: inetd runs rt18_w3.py (3 small writes, stdin never read)
# on 43096, with TCP_NODELAY on 43097; a socat client that sends a line first ("send": the
# service closes with unread bytes, so the kernel resets) or nothing ("nosend").
# TCP: "a1 b2 c3" every time.
OUT=$1; FL=${2:-}; W=$(cd "$(dirname "$0")" && pwd)/rt18_w3.py; mkdir -p $OUT
cat > $OUT/inetd4.conf <<EOC
127.0.0.1:43096 stream tcp nowait root $W w3.py
127.0.0.1:43097 stream tcp nowait root $W w3.py nodelay
EOC
/usr/sbin/inetd -i $FL $OUT/inetd4.conf > $OUT/inetd.log 2>&1 & IP=$!
for i in $(seq 50); do [ $(ss -ltn | grep -c '127.0.0.1:4309[67]') = 2 ] && break; sleep 0.1; done
for p in 43096 43097; do for i in 1 2 3; do
  echo "$p send: $(echo hello$i | socat -t 10 -T 20 - TCP:127.0.0.1:$p 2>&1 | tr '\n' ' ')"
  echo "$p nosend: $(socat -u TCP:127.0.0.1:$p - 2>&1 | tr '\n' ' ')"
done; done
kill $IP; wait $IP
