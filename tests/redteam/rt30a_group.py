# rt30a_group.py PORT MEMBERS CLIENTS [REPEAT]
# Red team round 30a: listeners of several families/processes on one port, some served by
# images WITHOUT the library. Run under world.sh smc|tcp; compare.
#
# MEMBERS: comma list of KIND:ADDR[:r], started in order (each ready before the next).
#   ADDR: v4any 0.0.0.0 | v4lo 127.0.0.1 | v6only [::] V6ONLY | dual [::] dual-stack |
#         v6lo [::1] | mapped [::ffff:127.0.0.1] (AF_INET6)
#   :r  -> SO_REUSEPORT on that listener
#   KIND: lib   listener made and served under the library (if the world has it)
#         plain process started without LD_PRELOAD makes and serves it
#         exec  made under the library, then exec `env -u LD_PRELOAD python3` serving it
#         execk as exec but a forked library copy keeps serving it too
#         scm   made under the library, passed with SCM_RIGHTS to a plain process; the
#               sender closes its copy
#         scmk  as scm, sender keeps accepting on it too
#         scml/scmlk  as scm/scmk but the receiver runs the library too 
#         pscml a process WITHOUT the library makes it, passes it to one WITH the library
#         relib made under the library, exec into ANOTHER library image serving it
#         execstatic  made under the library, exec of a static binary (rt30a_static.c,
#               RT_STATIC=path, default /tmp/rt30a_static) keeping LD_PRELOAD in its env
#         gone  made under the library (listen) and closed at once (a past server)
# CLIENTS: comma list of FAM:LIB:N  FAM v4 (127.0.0.1) | v6 (::1) | m (::ffff:127.0.0.1 on
#   AF_INET6);  LIB lib|plain.  Each client sends "c<i>-<fam>\n", reads to EOF, expects
#   "<TAG>:c<i>-<fam>\n".
import os, sys, socket, time, array, threading, subprocess, select

PY = sys.executable
ME = os.path.abspath(__file__)


def env_plain():
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    return e


def mk(addr, port, reuse):
    if addr in ("v4any", "v4lo"):
        s = socket.socket(socket.AF_INET)
        a = ("0.0.0.0" if addr == "v4any" else "127.0.0.1", port)
    else:
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY,
                     1 if addr in ("v6only", "v6lo") else 0)
        a = {"v6only": "::", "dual": "::", "v6lo": "::1", "mapped": "::ffff:127.0.0.1"}[addr]
        a = (a, port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(a)
    s.listen(128)
    return s


def handle(c, tag):
    c.settimeout(8)
    b = b""
    try:
        while not b.endswith(b"\n") and len(b) < 8192:
            x = c.recv(8192)
            if not x:
                break
            b += x
        c.sendall(tag.encode() + b":" + b)
    except OSError as e:
        try:
            c.sendall(tag.encode() + b":ERR " + str(e).encode() + b"\n")
        except OSError:
            pass
    c.close()


def serve(l, tag):
    while True:
        try:
            c, _ = l.accept()
        except OSError:
            time.sleep(0.01)
            continue
        threading.Thread(target=handle, args=(c, tag), daemon=True).start()


def ready(rfd):
    os.write(rfd, b"r")
    os.close(rfd)


def serve_all(ls, tag):
    for l in ls[1:]:
        threading.Thread(target=serve, args=(l, tag), daemon=True).start()
    serve(ls[0], tag)


def member(kind, addr, port, reuse, tag, rfd):
    """Runs in a child process (fresh interpreter, env already chosen). ADDR may be a
    '+'-joined list: one process holds all of them."""
    ls = [mk(a, port, reuse) for a in addr.split("+")]
    fds = ",".join(str(l.fileno()) for l in ls)
    if kind == "gone":
        for l in ls:
            l.close()
        ready(rfd)
        os._exit(0)
    if kind in ("lib", "plain"):
        ready(rfd)
        serve_all(ls, tag)
    elif kind == "execstatic":
        for l in ls:
            l.set_inheritable(True)
        os.set_inheritable(rfd, True)
        st = os.environ.get("RT_STATIC", "/tmp/rt30a_static")
        os.execve(st, [st, tag, str(rfd), fds], dict(os.environ))
    elif kind in ("exec", "execk", "relib"):
        for l in ls:
            l.set_inheritable(True)
        os.set_inheritable(rfd, True)
        if kind == "execk" and os.fork() == 0:
            serve_all(ls, tag + "k")
        env = env_plain() if kind != "relib" else dict(os.environ)
        os.execve(PY, [PY, ME, "srvfd", fds, tag, str(rfd)], env)
    elif kind in ("scm", "scmk", "scml", "scmlk", "pscml"):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        b.set_inheritable(True)
        os.set_inheritable(rfd, True)
        renv = env_plain() if kind in ("scm", "scmk") else dict(os.environ)
        if kind == "pscml" and os.environ.get("RT_LIB"):
            renv["LD_PRELOAD"] = os.environ["RT_LIB"]
        p = subprocess.Popen([PY, ME, "srvscm", str(b.fileno()), tag, str(rfd), str(len(ls))],
                             env=renv, pass_fds=(b.fileno(), rfd))
        b.close()
        os.close(rfd)
        a.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [l.fileno() for l in ls]))])
        a.recv(1)
        if kind in ("scm", "scml", "pscml"):
            for l in ls:
                l.close()
            p.wait()
            os._exit(0)
        serve_all(ls, tag + "k")


def client(fam, i, port, out):
    msg = ("c%d-%s\n" % (i, fam)).encode()
    try:
        if fam == "v4":
            c = socket.socket(socket.AF_INET); dst = ("127.0.0.1", port)
        else:
            c = socket.socket(socket.AF_INET6); dst = ("::1" if fam == "v6" else "::ffff:127.0.0.1", port)
        c.settimeout(10)
        t0 = time.time()
        c.connect(dst)
        c.sendall(msg)
        b = b""
        while True:
            x = c.recv(8192)
            if not x:
                break
            b += x
        dt = time.time() - t0
        c.close()
        tag, _, rest = b.partition(b":")
        if rest == msg:
            out.append(("ok", tag.decode(errors="replace"), dt, ""))
        else:
            out.append(("BAD", tag.decode(errors="replace"), dt, "len=%d/%d " % (len(b), len(tag) + 1 + len(msg)) + b[:40].hex()))
    except Exception as e:
        out.append(("ERR", "-", 0, repr(e)))


def clients_main(spec, port):
    out = []
    ths = []
    i = 0
    for part in spec.split(","):
        fam, _, n = part.split(":")
        for _ in range(int(n)):
            th = threading.Thread(target=client, args=(fam, i, port, out))
            ths.append(th)
            i += 1
    # a few at a time
    for k in range(0, len(ths), 4):
        for th in ths[k:k + 4]:
            th.start()
        for th in ths[k:k + 4]:
            th.join()
    return out


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "srvfd":
        ls = [socket.socket(fileno=int(f)) for f in a[2].split(",")]
        ready(int(a[4]))
        serve_all(ls, a[3])
    if a[1] == "srvscm":
        u = socket.socket(fileno=int(a[2]))
        n = int(a[5])
        msg, anc, _, _ = u.recvmsg(1, socket.CMSG_SPACE(4 * n))
        fds = array.array("i", anc[0][2][:4 * n])
        ls = [socket.socket(fileno=fd) for fd in fds]
        u.send(b"k")
        ready(int(a[4]))
        serve_all(ls, a[3])
    if a[1] == "member":
        member(a[2], a[3], int(a[4]), a[5] == "1", a[6], int(a[7]))
        os._exit(0)
    if a[1] == "client":
        out = clients_main(a[2], int(a[3]))
        for o in out:
            print("R", *o)
        sys.stdout.flush()
        os._exit(0)
    port = int(a[1])
    members = a[2].split(",")
    cspec = a[3]
    repeat = int(a[4]) if len(a) > 4 else 1
    lib = "LD_PRELOAD" in os.environ
    procs = []
    for j, m in enumerate(members):
        p = m.split(":")
        kind, addr = p[0], p[1]
        reuse = len(p) > 2 and p[2] == "r"
        tag = "M%d%s" % (j, kind)
        r, w = os.pipe()
        env = env_plain() if kind in ("plain", "pscml") else dict(os.environ)
        env["RT_LIB"] = os.environ.get("LD_PRELOAD", "")
        pr = subprocess.Popen([PY, ME, "member", kind, addr, str(port), "1" if reuse else "0", tag, str(w)],
                              env=env, pass_fds=(w,))
        os.close(w)
        rr, _, _ = select.select([r], [], [], 10)
        got = os.read(r, 1) if rr else b""
        os.close(r)
        if got != b"r":
            print("member %s failed to get ready (rc=%s)" % (m, pr.poll()))
            for q in procs + [pr]:
                q.kill()
            sys.exit(3)
        procs.append(pr)
    time.sleep(0.3)
    allres = []
    for rep in range(repeat):
        for part in cspec.split(","):
            fam, cl, n = part.split(":")
            env = env_plain() if cl == "plain" else dict(os.environ)
            o = subprocess.run([PY, ME, "client", "%s:%s:%s" % (fam, cl, n), str(port)], env=env,
                               capture_output=True, timeout=120)
            for line in o.stdout.decode().splitlines():
                if line.startswith("R "):
                    allres.append((fam + "/" + cl,) + tuple(line.split(" ", 4)[1:]))
            if o.returncode != 0:
                print("client rc", o.returncode, o.stderr.decode()[-400:])
    for q in procs:
        q.kill()
    # summary
    summ = {}
    bad = 0
    for r in allres:
        key = (r[0], r[1], r[2])
        summ[key] = summ.get(key, 0) + 1
        if r[1] != "ok":
            bad += 1
    for k in sorted(summ):
        print("  %-10s %-4s %-10s %d" % (k[0], k[1], k[2], summ[k]))
    shown = 0
    for r in allres:
        if r[1] != "ok" and shown < 4:
            print("  e.g.", r)
            shown += 1
    print("RESULT members=%s clients=%s bad=%d of %d lib=%s" % (a[2], cspec, bad, len(allres), lib))
    sys.exit(1 if bad else 0)
