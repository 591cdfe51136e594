#!/usr/bin/env python3
"""Red team round 22: the victim (root, under the library): an echo server and a client on
127.0.0.1:PORT doing checked ping-pong rounds for SECS seconds over CONNS connections.

  rt22_victim.py server PORT          echo server (threads), until killed
  rt22_victim.py client PORT SECS CONNS
      prints "TUPLE cport sport cookie" per connection once established (the attacker's
      target; cookie: the client socket's SO_COOKIE), then "VICTIM rounds=N bad=B errors=E
      maxms=M" at the end. Each round: 4000 bytes of a pattern out, the same back, compared.
      RT_GO=1: after READY, waits for a line on stdin, then does RT_ROUNDS rounds per
      connection (not SECS) and prints "REDIRECTED i before after" per connection: the
      messages its socket sent through the sk_msg shortcut (SMC_SO_STATE) before and after.
  rt22_victim.py burst PORT N          N short connections, each one checked round; prints
      "BURST ok=O bad=B errors=E maxms=M smc=S" (smc: connections whose SMC_SO_STATE-free
      check cannot be made here, so S is what `smc-ctl stats` says, printed by the driver).
"""
import os
import socket
import sys
import threading
import time


def echo(c):
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
    except OSError:
        pass
    c.close()


def server(port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Our range's ports may be other programs' ephemeral ports: the first free one from PORT.
    for p in range(port, port + 40):
        try:
            ls.bind(("127.0.0.1", p))
            break
        except OSError:
            continue
    ls.listen(512)
    print("LISTENING %d" % ls.getsockname()[1], flush=True)
    delay = float(os.environ.get("RT_ACCEPT_MS", "0")) / 1000
    while True:
        time.sleep(delay)  # a busy server: connections wait in the backlog
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def recv_exact(s, n):
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        if not b:
            raise OSError("eof after %d of %d" % (len(got), n))
        got += b
    return got


def one_round(s, i):
    msg = bytes((i + k) & 0xFF for k in range(4000))
    t0 = time.monotonic()
    s.sendall(msg)
    back = recv_exact(s, len(msg))
    return back == msg, time.monotonic() - t0


SOL_SMC_BPF = 0x534D4300
SMC_SO_STATE = 3
SO_COOKIE = 57


def redirected_msgs(s):
    """Messages this socket sent through the sk_msg shortcut (SockState.redirected_msgs)."""
    try:
        st = s.getsockopt(SOL_SMC_BPF, SMC_SO_STATE, 48)
    except OSError:
        return -1
    return int.from_bytes(st[16:24], "little") if len(st) >= 24 else -1


def client(port, secs, conns):
    socks = []
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port))
        ok, _ = one_round(s, 0)  # the handshake is done after the first round
        socks.append(s)
        cookie = int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little")
        print("TUPLE %d %d %d" % (s.getsockname()[1], port, cookie), flush=True)
    print("READY", flush=True)
    go = os.environ.get("RT_GO") == "1"
    limit = int(os.environ.get("RT_ROUNDS", "0")) if go else 0
    if go:
        sys.stdin.readline()
    first = [redirected_msgs(s) for s in socks]
    all_socks = list(socks)
    rounds = bad = errors = 0
    maxms = 0.0
    end = time.monotonic() + (1e9 if go else secs)
    i = 1
    while time.monotonic() < end and socks and not (go and i > limit):
        for s in list(socks):
            try:
                ok, dt = one_round(s, i)
            except OSError as e:
                errors += 1
                print("ERROR %s" % e, flush=True)
                socks.remove(s)
                continue
            rounds += 1
            bad += 0 if ok else 1
            maxms = max(maxms, dt * 1000)
        i += 1
        time.sleep(0.002)
    if go:
        for k, s in enumerate(all_socks):
            print("REDIRECTED %d %d %d" % (k, first[k], redirected_msgs(s)), flush=True)
    print("VICTIM rounds=%d bad=%d errors=%d maxms=%.0f" % (rounds, bad, errors, maxms),
          flush=True)


def burst(port, n):
    ok = bad = errors = 0
    maxms = 0.0
    for i in range(n):
        t0 = time.monotonic()
        try:
            s = socket.create_connection(("127.0.0.1", port))
            good, _ = one_round(s, i)
            s.close()
        except OSError:
            errors += 1
            continue
        maxms = max(maxms, (time.monotonic() - t0) * 1000)
        ok += 1 if good else 0
        bad += 0 if good else 1
    print("BURST ok=%d bad=%d errors=%d maxms=%.0f" % (ok, bad, errors, maxms), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "server":
        server(int(sys.argv[2]))
    elif mode == "client":
        client(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    elif mode == "burst":
        burst(int(sys.argv[2]), int(sys.argv[3]))
