#!/usr/bin/env python3
"""rt24: clients killed with SIGKILL while their server end is still unclaimed (queued at the
listener, not accepted yet): what does the server's program read once it accepts?

usage: rt24_kill.py CLIENT SERVER [N]   (run under world.sh smc|tcp)
 CLIENT  conn     connect, then killed (nothing written)
         write    connect, sendall(b'hello\\n') returned, then killed
         write2   as write, with 64 KiB written in 4 sendalls
         shut     write, shutdown(SHUT_WR), then killed
         wait     connect, write, then killed 0.3 s later (after its 100 ms accept wait)
         nbconn   non-blocking connect (the Proposal goes, the handshake continues at the
                  next call), killed 50 ms later without another call
 SERVER  lib      the server (library if the world has it) accepts after the kills, reads to EOF
         greet    as lib, but first sends 'hi\\n' and then reads to EOF
         greetsig as greet with SIGPIPE at its default action (a C server's): 'killed' if it dies
         nolib    the listener's process execs itself without the library (LD_PRELOAD
                  removed) after the kills, then accepts and reads (the peer-sweep residual)
One summary line per server: the outcomes and the bytes read, per connection."""
import collections, os, signal, socket, subprocess, sys, time


def serve(fd, n, greet):
    ls = socket.socket(fileno=fd)
    res = collections.Counter()
    for _ in range(n):
        c, _ = ls.accept()
        c.settimeout(3)
        got = b""
        t0 = time.time()
        try:
            if greet:
                c.sendall(b"hi\n")
                time.sleep(0.05)
            while True:
                d = c.recv(65536)
                if not d:
                    end = "eof"
                    break
                got += d
        except socket.timeout:
            end = "TIMEOUT"
        except OSError as e:
            end = f"{type(e).__name__}"
        head = got[:6].hex() if got and not got.startswith(b"hello") else ""
        res[f"{end} bytes={len(got)}{' head=' + head if head else ''}{' slow' if time.time() - t0 > 1 else ''}"] += 1
        c.close()
    print("server:", ", ".join(f"{v}x {k}" for k, v in sorted(res.items())), flush=True)


def main():
    if sys.argv[1] == "serve":  # exec'd image: serve FD N GREET
        return serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")
    if sys.argv[1] == "client":
        mode, port = sys.argv[2], int(sys.argv[3])
        if mode == "nbconn":
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            time.sleep(0.05)
        else:
            s = socket.create_connection(("127.0.0.1", port))
        if mode in ("write", "shut", "wait"):
            s.sendall(b"hello\n")
        if mode == "write2":
            for _ in range(4):
                s.sendall(b"h" * 16384)
        if mode == "shut":
            s.shutdown(socket.SHUT_WR)
        print("ready", flush=True)
        if mode == "wait":
            time.sleep(0.3)
            print("waited", flush=True)
        time.sleep(60)
        return
    cmode, smode = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    for _ in range(n):
        c = subprocess.Popen([sys.executable, __file__, "client", cmode, str(port)], stdout=subprocess.PIPE, text=True)
        c.stdout.readline()
        if cmode == "wait":
            c.stdout.readline()
        c.send_signal(signal.SIGKILL)
        c.wait()
    time.sleep(0.2)
    if smode == "nolib":
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        fd = ls.fileno()
        os.set_inheritable(fd, True)
        os.execve(sys.executable, [sys.executable, __file__, "serve", str(fd), str(n), "0"], env)
    if smode == "greetsig":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            serve(ls.detach(), n, True)
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        if os.WIFSIGNALED(st):
            print("server: killed by signal", os.WTERMSIG(st), flush=True)
        return
    serve(ls.detach(), n, smode == "greet")


if __name__ == "__main__":
    main()
