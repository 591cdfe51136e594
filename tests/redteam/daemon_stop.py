#!/usr/bin/env python3
"""red4: many short checked connections while the world's daemon is stopped (SIGSTOP) at
random moments for random spans (0.05-3 s, around the CLC and daemon timeouts).

usage: world.sh smc|tcp python3 daemon_stop.py [SECONDS] [SEED]  (connections for SECONDS)
Every connection: the server greets first (6 bytes) on odd connections, the client sends
4000 patterned bytes, shuts down its write side, the server echoes all and closes; both sides
check every byte. Prints a summary line per kind of failure (none under TCP)."""
import os, random, signal, socket, subprocess, sys, threading, time

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 20
rnd = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
PAR = 6
fails = []
lock = threading.Lock()


def fail(msg):
    with lock:
        fails.append(msg)


def daemon_pid():
    sock = os.environ["RT_DIR"] + "/ctl.sock"
    out = subprocess.run(["pgrep", "-f", "--", "--socket " + sock], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def payload(i):
    return bytes((i * 31 + j * 7 + j // 253) % 256 for j in range(4000))


def serve(l):
    def one(c):
        try:
            c.settimeout(30)
            i = int.from_bytes(c.recv(4, socket.MSG_WAITALL), "big")
            if i % 2:
                c.sendall(b"HELLO\n")
            want = payload(i)
            got = b""
            while True:
                d = c.recv(65536)
                if not d:
                    break
                got += d
            if got != want:
                fail(f"server conn {i}: {len(got)} bytes, {'prefix ok' if want.startswith(got) else 'differ'}")
            c.sendall(got)
        except Exception as e:
            fail(f"server: {type(e).__name__} {e}")
        finally:
            c.close()

    while True:
        c, _ = l.accept()
        threading.Thread(target=one, args=(c,), daemon=True).start()


def client(i, port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        # The index first, then (odd) the greeting, then the payload.
        s.sendall(i.to_bytes(4, "big"))
        if i % 2:
            g = s.recv(6, socket.MSG_WAITALL)
            if g != b"HELLO\n":
                fail(f"client conn {i}: greeting {g!r}")
                s.close()
                return
        w = payload(i)
        s.sendall(w)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        if got != w:
            fail(f"client conn {i}: echo {len(got)} bytes, {'prefix ok' if w.startswith(got) else 'differ'}")
        s.close()
    except Exception as e:
        fail(f"client conn {i}: {type(e).__name__} {e}")


def stopper(pid, stop):
    while not stop.is_set():
        time.sleep(rnd.uniform(0.05, 1.0))
        os.kill(pid, signal.SIGSTOP)
        time.sleep(rnd.choice([0.05, 0.3, 1.0, 1.9, 2.1, 3.0]))
        os.kill(pid, signal.SIGCONT)
        stops[0] += 1


stops = [0]


def main():
    pid = daemon_pid()
    print("daemon pid", pid, flush=True)
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(128)
    port = l.getsockname()[1]
    if os.fork() == 0:
        serve(l)
    l.close()
    stop = threading.Event()
    st = threading.Thread(target=stopper, args=(pid, stop)) if pid else None
    if st:
        st.start()
    sem = threading.Semaphore(PAR)
    ts = []
    end = time.time() + SECS
    i = 0
    while time.time() < end:
        i += 1
        sem.acquire()
        t = threading.Thread(target=lambda i=i: (client(i, port), sem.release()))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()
    stop.set()
    if st:
        st.join()
        os.kill(pid, signal.SIGCONT)
    kinds = {}
    for f in fails:
        k = f.split(":", 1)[1].strip().split(" ")[0] if ":" in f else f
        kinds.setdefault(k, []).append(f)
    print(f"{i} connections, {len(fails)} failures, {stops[0]} daemon stops")
    for k, v in kinds.items():
        print(f"  {len(v)} x {v[0]}")
    sys.stdout.flush()
    os._exit(0)


main()
