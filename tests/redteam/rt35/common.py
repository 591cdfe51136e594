import socket, struct, time, os, array

MAGIC = struct.unpack('<I', b'SMCI')[0]
OP_QUERY_GID = 1
OP_PAIR = 12


def rec(op, payload=b'', seq=1):
    return struct.pack('<IHHII', MAGIC, 1, op, len(payload), seq) + payload


def dconnect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s


def send_fds(s, data, fds):
    if fds:
        return s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', fds))])
    return s.send(data)


def recv_reply(s, timeout=2.0):
    s.settimeout(timeout)
    try:
        msg, anc, flags, _ = s.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
    except socket.timeout:
        return 'timeout', None, []
    except OSError as e:
        return 'err:%s' % e.strerror, None, []
    fds = []
    for lvl, typ, d in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            a = array.array('i'); a.frombytes(d[:len(d) - len(d) % 4]); fds += list(a)
    for f in fds:
        os.close(f)
    if not msg:
        return 'eof', None, []
    op, = struct.unpack('<H', msg[6:8])
    st, = struct.unpack('<I', msg[16:20]) if len(msg) >= 20 else (None,)
    return 'reply', (op & 0x7fff, st, len(msg)), fds


def lingering(port_listener, linger_s=3600):
    """A TCP socket whose close blocks: send buffer full, peer never reads, SO_LINGER on."""
    s = socket.create_connection(port_listener.getsockname())
    peer, _ = port_listener.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    chunk = b'Z' * 65536
    n = 0
    while True:
        try:
            n += s.send(chunk)
        except BlockingIOError:
            break
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, linger_s))
    return s, peer, n
