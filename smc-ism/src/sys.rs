//! Thin libc wrappers shared by the client and the daemon: SCM_RIGHTS messaging, memfds,
//! socket inspection for the attach proof, random numbers.

// Without the daemon feature, the daemon-side helpers are unused.
#![cfg_attr(not(feature = "daemon"), allow(dead_code))]

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;

/// `SO_COOKIE` (Linux 4.12+), the same on every architecture we build for.
pub(crate) const SO_COOKIE: libc::c_int = 57;
/// `SO_BINDTOIFINDEX` (`asm-generic/socket.h`, Linux 5.0): the bound interface's index.
const SO_BINDTOIFINDEX: libc::c_int = 62;
/// `MFD_NOEXEC_SEAL` (Linux 6.3+).
const MFD_NOEXEC_SEAL: libc::c_uint = 0x0008;
/// `TCP_ESTABLISHED` in `tcp_info.tcpi_state`.
const TCP_ESTABLISHED: u8 = 1;
/// `TCP_CLOSE_WAIT` in `tcp_info.tcpi_state`.
const TCP_CLOSE_WAIT: u8 = 8;

/// Converts a `-1`-on-error return value.
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Control buffer for sending: room for a few fds, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Control buffer for receiving: room for `SCM_MAX_FD` (253) fds, so that the kernel never
/// truncates the control data. A truncated one makes the kernel drop the fds that did not fit,
/// and their final `close` (a FUSE flush, a lingering socket) would then run in the receiving
/// thread on its way back from `recvmsg`.
#[repr(C, align(8))]
struct RecvCmsgBuf([u8; 1040]);

/// Sends one record, with the fds of `pass` (at most 4) as SCM_RIGHTS. Never raises SIGPIPE.
pub(crate) fn send_record(
    sock: RawFd,
    data: &[u8],
    pass: &[RawFd],
    flags: libc::c_int,
) -> io::Result<()> {
    if pass.len() > 4 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; all pointers set below stay valid during sendmsg.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !pass.is_empty() {
        let bytes = mem::size_of_val(pass) as u32;
        // SAFETY: the buffer (64 bytes, aligned for cmsghdr) holds one cmsghdr carrying up to
        // four ints (CMSG_SPACE(16) = 32).
        unsafe {
            let space = libc::CMSG_SPACE(bytes) as usize;
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            let d = libc::CMSG_DATA(c) as *mut libc::c_int;
            for (i, fd) in pass.iter().enumerate() {
                ptr::write_unaligned(d.add(i), *fd);
            }
        }
    }
    loop {
        // The system call itself, not libc's `sendmsg`: inside the LD_PRELOAD library that
        // symbol is the library's own interposed `sendmsg`, which treats the TCP socket passed
        // here as an application's `SCM_RIGHTS` and finishes its handshake first — the very
        // handshake that is sending this request, whose lock is held: a self-deadlock
        // (redis-benchmark hung so). `syscall` passes `SYS_sendmsg` through untouched.
        // SAFETY: msg is fully initialised.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendmsg,
                sock,
                &msg as *const libc::msghdr,
                flags | libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r as usize != data.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
        }
        return Ok(());
    }
}

/// One received record.
pub(crate) struct Received {
    /// Bytes stored in the buffer (0 means end of stream).
    pub len: usize,
    /// The record was larger than the buffer (the rest was discarded).
    pub truncated: bool,
    /// The first fd passed with the record.
    pub fd: Option<OwnedFd>,
    /// Any further fds (no request takes more than one; the caller disposes of them).
    pub extra: Vec<OwnedFd>,
    /// The kernel dropped passed fds (`MSG_CTRUNC`), e.g. the receiver is at `RLIMIT_NOFILE`.
    pub fds_dropped: bool,
}

/// Waits until `fd` is readable (or has an error or hang-up), at most `timeout`; false on
/// timeout.
pub(crate) fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> bool {
    wait_for(fd, libc::POLLIN, timeout) != 0
}

/// Waits until one of `events` (or an error or hang-up) is there, at most `timeout`: the
/// `revents` (0 on timeout). The system call itself (`ppoll`), not the libc symbol: inside the
/// interposition library, `poll` is the application's emulated one.
pub(crate) fn wait_for(fd: RawFd, events: libc::c_short, timeout: std::time::Duration) -> i16 {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return 0;
        }
        let ts = libc::timespec {
            tv_sec: left.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut p as *mut libc::pollfd,
                1 as libc::nfds_t,
                &ts as *const libc::timespec,
                ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        if r > 0 {
            return p.revents;
        }
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return 0;
    }
}

/// A placeholder that holds one slot of the descriptor table: an eventfd, which refers to
/// nothing else (a copy of a socket would keep that connection open after its owner closed
/// it, also in a forked child). The system call itself: inside the interposition library
/// `eventfd` is the application's.
pub(crate) fn placeholder_fd() -> Option<OwnedFd> {
    // SAFETY: eventfd2 creates a descriptor or fails; nothing else is touched.
    let r = unsafe { libc::syscall(libc::SYS_eventfd2, 0, libc::EFD_CLOEXEC) };
    if r < 0 {
        return None;
    }
    // SAFETY: a new descriptor of ours.
    Some(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// The soft `RLIMIT_NOFILE` of this process (`u64::MAX` when unknown or unlimited).
pub(crate) fn nofile_soft_limit() -> u64 {
    // SAFETY: getrlimit into a valid struct.
    let mut rl: libc::rlimit = unsafe { mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return u64::MAX;
    }
    rl.rlim_cur as u64
}

/// Whether this process has fewer than `headroom` descriptors left below its soft
/// `RLIMIT_NOFILE` (or none at all): the lowest free descriptor number against the limit
/// (the table below it is full; a daemon's table has few holes).
pub(crate) fn near_fd_limit(headroom: u64) -> bool {
    // SAFETY: getrlimit into a valid struct.
    let mut rl: libc::rlimit = unsafe { mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return false;
    }
    let Some(probe) = placeholder_fd() else {
        return true;
    };
    let lowest = probe.as_raw_fd() as u64;
    drop(probe);
    lowest + headroom >= rl.rlim_cur as u64
}

/// The sequence number of the next record on `fd`, peeked (`MSG_PEEK`) without control
/// buffer: nothing is consumed and no fd passed with it is installed (they stay queued with
/// it). `None` when nothing is there. The system call itself, as [`recv_record`].
pub(crate) fn peek_seq(fd: RawFd) -> Option<u32> {
    let mut hdr = [0u8; crate::proto::HEADER_LEN];
    // SAFETY: a valid buffer of its length, no address, no control buffer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            hdr.as_mut_ptr(),
            hdr.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        )
    };
    if r < hdr.len() as libc::c_long {
        return None;
    }
    crate::proto::Header::decode(&hdr).map(|h| h.seq)
}

/// Receives one record; fds are received with `MSG_CMSG_CLOEXEC`, the first in `fd`, any others
/// in `extra` (closing them is the caller's business: the daemon does not close a client's fds
/// on its request path). `EINTR` is retried; `EAGAIN` is returned to the caller.
pub(crate) fn recv_record(sock: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = RecvCmsgBuf([0; 1040]);
    loop {
        // SAFETY: plain data, pointers valid for the duration of recvmsg.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len() as _;
        // The system call itself (see `send_record`): the memfds received here are not an
        // application's `SCM_RIGHTS`.
        // SAFETY: as above.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmsg,
                sock,
                &mut msg as *mut libc::msghdr,
                flags | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut first: Option<OwnedFd> = None;
        let mut extra = Vec::new();
        // SAFETY: walking the control buffer the kernel filled, with the libc macros.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const libc::c_int;
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let n = bytes / mem::size_of::<libc::c_int>();
                    for i in 0..n {
                        let fd = ptr::read_unaligned(data.add(i));
                        let owned = OwnedFd::from_raw_fd(fd);
                        if first.is_none() {
                            first = Some(owned);
                        } else {
                            extra.push(owned);
                        }
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        return Ok(Received {
            len: r as usize,
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            fds_dropped: msg.msg_flags & libc::MSG_CTRUNC != 0,
            fd: first,
            extra,
        });
    }
}

/// Whether a passed fd is a local state page: a shmem file (`F_GET_SEALS` answers only for
/// those, without asking any filesystem) sealed against shrinking, of exactly `size` bytes, so
/// that its owner cannot truncate it under the process that adopts it (SIGBUS).
pub(crate) fn is_state_page(fd: BorrowedFd<'_>, size: u64) -> bool {
    // SAFETY: F_GET_SEALS has no argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return false;
    }
    // SAFETY: `libc::stat` is plain integers; valid out buffer; a shmem file's fstat does not
    // block.
    let mut st: libc::stat = unsafe { mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::fstat(fd.as_raw_fd(), &mut st) == 0 && st.st_size as u64 == size }
}

/// Creates a sealed memfd of `size` bytes: zero-filled, pages committed only when touched,
/// and neither shrinkable nor growable by anybody (a peer shrinking it would SIGBUS the other
/// side).
pub(crate) fn create_dmb_memfd(size: u64) -> io::Result<OwnedFd> {
    create_sealed_memfd(c"smc-dmb", size)
}

/// Creates a connection end's local state page as [`create_dmb_memfd`] does a DMB (what
/// [`is_state_page`] accepts).
pub(crate) fn create_state_memfd(size: u64) -> io::Result<OwnedFd> {
    create_sealed_memfd(c"smc-state", size)
}

fn create_sealed_memfd(name: &std::ffi::CStr, size: u64) -> io::Result<OwnedFd> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static NO_NOEXEC_SEAL: AtomicBool = AtomicBool::new(false);
    let base = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    let mut fd = -1;
    if !NO_NOEXEC_SEAL.load(Ordering::Relaxed) {
        // SAFETY: valid C string.
        fd = unsafe { libc::memfd_create(name.as_ptr(), base | MFD_NOEXEC_SEAL) };
        if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            NO_NOEXEC_SEAL.store(true, Ordering::Relaxed);
        } else if fd < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if fd < 0 {
        // SAFETY: valid C string.
        fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), base) })?;
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on an fd we own.
    unsafe {
        cvt(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t))?;
        cvt(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        ))?;
    }
    Ok(fd)
}

/// Fills `buf` from the kernel's CSPRNG (`getrandom(2)`).
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writing into the remaining part of buf.
        let r = unsafe {
            libc::getrandom(
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

/// A random u64 from the kernel's CSPRNG, drawn 32 at a time (one `getrandom` per 32
/// registrations instead of one each).
pub(crate) fn random_u64() -> io::Result<u64> {
    use std::sync::Mutex;
    static POOL: Mutex<([u64; 32], usize)> = Mutex::new(([0; 32], 32));
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if g.1 >= g.0.len() {
        let mut b = [0u8; 256];
        random_bytes(&mut b)?;
        for (w, c) in g.0.iter_mut().zip(b.as_chunks::<8>().0) {
            *w = u64::from_ne_bytes(*c);
        }
        g.1 = 0;
    }
    let i = g.1;
    g.1 += 1;
    // Not kept once used.
    Ok(std::mem::take(&mut g.0[i]))
}

/// `getsockopt` for a fixed-size value; fails if the kernel returned a different size, except
/// that a shorter answer is accepted when `allow_short` (TCP_INFO grows across kernels).
pub(crate) fn getsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    // SAFETY: T is plain data (Copy, used only for integers and C structs here).
    let mut val: T = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: val is valid for len bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut val as *mut T).cast(),
            &mut len,
        )
    })?;
    Ok(val)
}

/// Whether a refused client connection (`sock`) can be closed on this thread: its peer can
/// send nothing more (both directions are shut down here first) and no record queued on it
/// carries descriptors. A queued descriptor whose last reference is the queue's would be
/// released by this thread's close, and that release can block (a socket with `SO_LINGER`:
/// see `daemon::closer`); a connection with any is for a closer thread. Records without
/// descriptors are read and dropped (at most 64); with `SO_PASSCRED` on, every record read
/// brings credentials, so a read without them found the queue empty (a zero-length record and
/// an empty queue both read as 0 bytes).
pub(crate) fn refused_can_close_here(sock: BorrowedFd<'_>) -> bool {
    let fd = sock.as_raw_fd();
    // SAFETY: plain calls on our own socket.
    unsafe {
        if libc::shutdown(fd, libc::SHUT_RDWR) != 0 {
            return false;
        }
        let one: libc::c_int = 1;
        if libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&one as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) != 0
        {
            return false;
        }
    }
    let mut data = [0u8; 64];
    let mut cbuf = RecvCmsgBuf([0; 1040]);
    for _ in 0..64 {
        for peek in [true, false] {
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: plain data, pointers valid for the duration of recvmsg.
            let mut msg: libc::msghdr = unsafe { mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            // Room for the credentials and one descriptor: a record with any shows
            // `SCM_RIGHTS` or `MSG_CTRUNC`.
            // SAFETY: CMSG_SPACE is arithmetic.
            msg.msg_controllen = unsafe {
                libc::CMSG_SPACE(mem::size_of::<libc::ucred>() as u32)
                    + libc::CMSG_SPACE(mem::size_of::<libc::c_int>() as u32)
            } as _;
            let flags =
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC | if peek { libc::MSG_PEEK } else { 0 };
            // SAFETY: as above; the system call itself (see `recv_record`).
            let r = unsafe {
                libc::syscall(libc::SYS_recvmsg, fd, &mut msg as *mut libc::msghdr, flags)
            };
            if r < 0 {
                return false;
            }
            let (mut creds, mut fds) = (false, msg.msg_flags & libc::MSG_CTRUNC != 0);
            // SAFETY: walking the control buffer the kernel filled, with the libc macros; a
            // peeked descriptor is a copy whose close is never the file's last (the queued
            // record still holds it).
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET {
                        if (*c).cmsg_type == libc::SCM_CREDENTIALS {
                            creds = true;
                        } else if (*c).cmsg_type == libc::SCM_RIGHTS {
                            fds = true;
                            let p = libc::CMSG_DATA(c) as *const libc::c_int;
                            let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                                / mem::size_of::<libc::c_int>();
                            for i in 0..n {
                                libc::close(p.add(i).read_unaligned());
                            }
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            if fds {
                return false;
            }
            if !creds {
                return peek; // empty (a read without credentials after a peek with: no)
            }
        }
    }
    false
}

/// Credentials of the peer of a Unix socket.
pub(crate) fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    getsockopt::<libc::ucred>(fd, libc::SOL_SOCKET, libc::SO_PEERCRED)
}

/// What the daemon records about a TCP socket passed as proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcpIdentity {
    /// `getsockname`, IPv4-mapped IPv6 normalised to IPv4.
    pub local: SocketAddr,
    /// `getpeername`, normalised likewise.
    pub peer: SocketAddr,
    /// `SO_COOKIE`, when the kernel has it.
    pub cookie: Option<u64>,
    /// `SO_NETNS_COOKIE`, when the kernel has it.
    pub netns_cookie: Option<u64>,
    /// The interface the socket is bound to (`SO_BINDTOIFINDEX`: `SO_BINDTODEVICE`, a link-local
    /// IPv6 address's scope), 0 when none: the kernel's exact lookup of such a socket
    /// (sock_diag) matches only with it.
    pub bound_if: u32,
}

/// Why a passed fd is not acceptable as proof.
#[derive(Debug)]
pub(crate) enum SocketCheck {
    NotTcp,
    NotEstablished,
}

/// Inspects a passed fd: must be an AF_INET/AF_INET6 TCP stream socket in ESTABLISHED state.
///
/// The type is checked first, with socket options only: `SO_TYPE` fails with `ENOTSOCK` for
/// anything that is not a socket without asking its filesystem (an `fstat` of a FUSE file is a
/// GETATTR request that its server may never answer), then it must be a stream and
/// `SO_PROTOCOL` TCP (MPTCP and others refused): only an `AF_INET`/`AF_INET6` socket is both
/// (the addresses below are read as those families only). Then `TCP_INFO` (state), the
/// addresses, the cookies. Every call here is on the critical path of a connection's setup.
pub(crate) fn inspect_tcp(fd: BorrowedFd<'_>) -> Result<TcpIdentity, SocketCheck> {
    inspect_tcp_in(fd, false)
}

/// [`inspect_tcp`] for a socket that moved to another process (`OP_ADOPT`): also in
/// `CLOSE_WAIT` (its peer closed after sending; the bytes it sent are still to be read, as
/// TCP delivers them, and the socket is still the very one, by its cookie).
pub(crate) fn inspect_tcp_moved(fd: BorrowedFd<'_>) -> Result<TcpIdentity, SocketCheck> {
    inspect_tcp_in(fd, true)
}

fn inspect_tcp_in(fd: BorrowedFd<'_>, close_wait: bool) -> Result<TcpIdentity, SocketCheck> {
    let ty = getsockopt::<libc::c_int>(fd, libc::SOL_SOCKET, libc::SO_TYPE)
        .map_err(|_| SocketCheck::NotTcp)?;
    let proto = getsockopt::<libc::c_int>(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)
        .map_err(|_| SocketCheck::NotTcp)?;
    if ty != libc::SOCK_STREAM || proto != libc::IPPROTO_TCP {
        return Err(SocketCheck::NotTcp);
    }
    // tcp_info starts with tcpi_state; asking for 8 bytes is enough and works on every kernel.
    let info = getsockopt::<[u8; 8]>(fd, libc::IPPROTO_TCP, libc::TCP_INFO)
        .map_err(|_| SocketCheck::NotTcp)?;
    if info[0] != TCP_ESTABLISHED && !(close_wait && info[0] == TCP_CLOSE_WAIT) {
        return Err(SocketCheck::NotEstablished);
    }
    // sock_name accepts AF_INET/AF_INET6 addresses only.
    let local = sock_name(fd, false).ok_or(SocketCheck::NotTcp)?;
    let peer = sock_name(fd, true).ok_or(SocketCheck::NotEstablished)?;
    Ok(TcpIdentity {
        local,
        peer,
        cookie: getsockopt::<u64>(fd, libc::SOL_SOCKET, SO_COOKIE).ok(),
        netns_cookie: smc_common::bpf::netns_cookie(fd).ok(),
        bound_if: getsockopt::<libc::c_int>(fd, libc::SOL_SOCKET, SO_BINDTOIFINDEX)
            .ok()
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or(0),
    })
}

/// Whether a socket that [`inspect_tcp`] accepted is still an established TCP socket.
#[cfg(feature = "daemon")]
pub(crate) fn still_established(fd: BorrowedFd<'_>) -> bool {
    getsockopt::<[u8; 8]>(fd, libc::IPPROTO_TCP, libc::TCP_INFO)
        .is_ok_and(|info| info[0] == TCP_ESTABLISHED)
}

fn sock_name(fd: BorrowedFd<'_>, peer: bool) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data large enough for any address.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: ss is valid for len bytes.
    let r = unsafe {
        if peer {
            libc::getpeername(fd.as_raw_fd(), p, &mut len)
        } else {
            libc::getsockname(fd.as_raw_fd(), p, &mut len)
        }
    };
    if r < 0 {
        return None;
    }
    sockaddr_to_std(&ss)
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip6 = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let ip = match ip6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(ip6),
            };
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn inspect_connected_pair() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let ia = inspect_tcp(a.as_fd()).unwrap();
        let ib = inspect_tcp(b.as_fd()).unwrap();
        assert_eq!(ia.local, ib.peer);
        assert_eq!(ia.peer, ib.local);
        assert_ne!(ia.cookie, ib.cookie);
        assert_eq!(ia.netns_cookie, ib.netns_cookie);
        assert!(matches!(
            inspect_tcp(l.as_fd()),
            Err(SocketCheck::NotEstablished)
        ));
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(matches!(inspect_tcp(f.as_fd()), Err(SocketCheck::NotTcp)));
    }

    #[test]
    fn memfd_is_sealed() {
        let fd = create_dmb_memfd(16384).unwrap();
        // SAFETY: plain syscalls.
        unsafe {
            let mut st: libc::stat = mem::zeroed();
            assert_eq!(libc::fstat(fd.as_raw_fd(), &mut st), 0);
            assert_eq!(st.st_size, 16384);
            assert!(libc::ftruncate(fd.as_raw_fd(), 0) < 0);
            assert!(libc::ftruncate(fd.as_raw_fd(), 1 << 20) < 0);
        }
    }
}
