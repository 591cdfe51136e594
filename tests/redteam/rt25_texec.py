# rt25_texec.py [helper]: a process execs an image without the library (Python with LD_PRELOAD
# taken out of its environment) while another of its threads is inside a blocking connect
# whose handshake waits for the server's answer (the server accepts only once that thread is
# seen asleep in the kernel). The image gets the socket as fd 20, reads the server's line and
# answers. Over TCP: `helper read b'ping\n'`, `server got b'pong\n'`. Red team round 25
# (`rt25.c texec_during_handshake`): the image read the server's 130-byte CLC Accept instead.
import os, socket, sys, threading, time


def helper():
    s = socket.socket(fileno=20)
    s.settimeout(5)
    line = b""
    try:
        while not line.endswith(b"\n"):
            b = s.recv(256)
            if not b:
                break
            line += b
    except OSError as e:
        line += f" {type(e).__name__}".encode()
    print(f"helper read {line!r}", flush=True)
    try:
        s.sendall(b"pong\n")
    except OSError as e:
        print(f"helper send {type(e).__name__}", flush=True)


def in_poll_or_done(t, tid):
    # the thread is asleep in poll/ppoll (syscall 7/271) inside connect, or connect returned
    while t.is_alive():
        try:
            with open(f"/proc/self/task/{tid}/syscall") as f:
                if f.read().split()[0] in ("7", "271"):
                    return
        except (OSError, IndexError):
            pass
        time.sleep(0.001)


def main():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(4)
    port = l.getsockname()[1]
    r, w = os.pipe()
    srv = os.fork()
    if srv == 0:
        os.close(w)
        os.read(r, 1)
        s, _ = l.accept()
        s.settimeout(10)
        s.sendall(b"ping\n")
        got = b""
        try:
            while not got.endswith(b"\n"):
                b = s.recv(256)
                if not b:
                    break
                got += b
        except OSError as e:
            got += f" {type(e).__name__}".encode()
        print(f"server got {got!r}", flush=True)
        os._exit(0)
    os.close(r)
    l.close()
    cli = os.fork()
    if cli == 0:
        c = socket.socket()
        tid = []
        t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), c.connect(("127.0.0.1", port))))
        t.start()
        while not tid:
            time.sleep(0.001)
        in_poll_or_done(t, tid[0])
        os.write(w, b"g")
        os.dup2(c.fileno(), 20)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        os.execve(sys.executable, [sys.executable, __file__, "helper"], env)
    os.close(w)
    os.waitpid(cli, 0)
    os.waitpid(srv, 0)


if len(sys.argv) > 1 and sys.argv[1] == "helper":
    helper()
else:
    main()
