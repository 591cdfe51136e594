# rt30a_plant.py PORT [ADDR]: as uid nobody and WITHOUT the library (run it with env -u
# LD_PRELOAD inside world.sh's attached cgroup), listen on ADDR:PORT (default 127.0.0.1),
# opt in by hand (setsockopt SOL_SMC_BPF/SMC_SO_ENABLE 1: the eBPF program records the key
# (netns, addr, port) = announcing), close and exit. The entry stays behind.
import os, socket, sys, pwd
port = int(sys.argv[1]); addr = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
pw = pwd.getpwnam("nobody"); os.setgid(pw.pw_gid); os.setuid(pw.pw_uid)
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.bind((addr, port)); s.listen(1)
s.setsockopt(0x534d4300, 1, 1)
s.close()
print("planted", addr, port, "as uid", os.getuid())
