# red3: Python's signal module under the preload (diff with and without it; world.sh smc|tcp).
import faulthandler, os, signal, socket, sys, threading, time, io
def P(*a): print(*a, flush=True)
def h(s, f): P("handler", s)
old = signal.signal(signal.SIGUSR1, h); P("old", old)
P("get", signal.getsignal(signal.SIGUSR1) is h)
os.kill(os.getpid(), signal.SIGUSR1)
P("int default", signal.getsignal(signal.SIGINT))
# faulthandler.register with chain=True re-installs the previous handler and re-raises
faulthandler.register(signal.SIGUSR1, file=open(os.devnull, "w"), chain=True)
os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.05); P("after chain")
faulthandler.unregister(signal.SIGUSR1)
os.kill(os.getpid(), signal.SIGUSR1)
# socket recv interrupted: handler raises
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(4)
cc = []; t = threading.Thread(target=lambda: cc.append(socket.create_connection(l.getsockname()))); t.start()
s, _ = l.accept(); t.join(); c = cc[0]
c.sendall(b"x"); s.recv(1); s.sendall(b"y"); c.recv(1)
class T(Exception): pass
def hr(sig, f): raise T()
signal.signal(signal.SIGALRM, hr); signal.setitimer(signal.ITIMER_REAL, 0.2)
try: s.recv(10); P("recv returned")
except T: P("recv interrupted by exception")
# handler that does not raise: PEP 475 retries; data arrives later
n = [0]
def hc(sig, f): n[0] += 1
signal.signal(signal.SIGALRM, hc); signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
threading.Timer(0.6, lambda: c.sendall(b"late")).start()
P("recv", s.recv(10), n[0] > 2); signal.setitimer(signal.ITIMER_REAL, 0)
# siginterrupt(False): the kernel restarts; the Python handler runs only after the recv returns
signal.signal(signal.SIGALRM, hc); signal.siginterrupt(signal.SIGALRM, False); n[0] = 0
signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
threading.Timer(0.6, lambda: c.sendall(b"late2")).start()
P("recv", s.recv(10)); signal.setitimer(signal.ITIMER_REAL, 0)
# wakeup fd
r, w = os.pipe(); os.set_blocking(w, False); signal.set_wakeup_fd(w)
signal.signal(signal.SIGUSR2, lambda s, f: None); os.kill(os.getpid(), signal.SIGUSR2); P("wakeup", os.read(r, 10))
signal.set_wakeup_fd(-1)
P("strsignal", signal.strsignal(signal.SIGUSR2), sorted(signal.valid_signals())[:3])
P("sigtimedwait"); signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2]); os.kill(os.getpid(), signal.SIGUSR2)
P(signal.sigtimedwait([signal.SIGUSR2], 1).si_signo)
P("default restored", signal.signal(signal.SIGUSR1, signal.SIG_DFL) is h, signal.getsignal(signal.SIGUSR1))
