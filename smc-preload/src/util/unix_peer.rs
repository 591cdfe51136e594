//! Who holds the other end of a Unix stream socket: its inode from the kernel's socket
//! diagnostics (`NETLINK_SOCK_DIAG`, `UDIAG_SHOW_PEER`, the query `ss -x` makes), then the
//! processes among our children whose descriptors name it (`/proc/<pid>/fd`).
//!
//! `SO_PEERCRED` names the process that made the pair (or connected): for a `socketpair` made
//! before a `fork`, that is this process, although the other end lives in the child, which may
//! since have become an image without the library. Asked only for that case, when a socket of
//! ours is about to be passed with `SCM_RIGHTS`.

use super::real;

/// `sock_diag.h`: `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `unix_diag.h`: `UDIAG_SHOW_PEER`, `UNIX_DIAG_PEER`.
const UDIAG_SHOW_PEER: u32 = 0x0000_0004;
const UNIX_DIAG_PEER: u16 = 2;

#[repr(C)]
struct UnixDiagReq {
    family: u8,
    protocol: u8,
    pad: u16,
    states: u32,
    ino: u32,
    show: u32,
    cookie: [u32; 2],
}

#[repr(C)]
struct Request {
    nl: libc::nlmsghdr,
    req: UnixDiagReq,
}

/// The inode of the socket at the other end of Unix socket `fd` (`None`: not connected, not
/// a Unix socket, or the diagnostics are not available). errno preserved.
pub fn peer_inode(fd: i32) -> Option<u32> {
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let e0 = real::errno();
    // SAFETY: valid out buffer.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    real::set_errno(e0);
    if !ok || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return None;
    }
    let ino = u32::try_from(st.st_ino).ok()?;
    // SAFETY: plain system call.
    let nl = unsafe {
        real::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if nl < 0 {
        real::set_errno(e0);
        return None;
    }
    let r = query(nl, ino);
    // SAFETY: our own descriptor.
    unsafe { real::close(nl) };
    real::set_errno(e0);
    r
}

fn query(nl: i32, ino: u32) -> Option<u32> {
    let req = Request {
        nl: libc::nlmsghdr {
            nlmsg_len: std::mem::size_of::<Request>() as u32,
            nlmsg_type: SOCK_DIAG_BY_FAMILY,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        req: UnixDiagReq {
            family: libc::AF_UNIX as u8,
            protocol: 0,
            pad: 0,
            states: u32::MAX,
            ino,
            show: UDIAG_SHOW_PEER,
            // INET_DIAG_NOCOOKIE: any socket with this inode.
            cookie: [u32::MAX, u32::MAX],
        },
    };
    // SAFETY: a valid buffer of its length.
    let n = unsafe {
        real::send(
            nl,
            (&req as *const Request).cast::<libc::c_void>(),
            std::mem::size_of::<Request>(),
            0,
        )
    };
    if n < 0 {
        return None;
    }
    let mut buf = [0u8; 1024];
    let mut p = libc::pollfd {
        fd: nl,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd. The kernel answers at once; a second is a bound, never a wait.
    if unsafe { real::poll(&mut p, 1, 1000) } != 1 {
        return None;
    }
    // SAFETY: a valid buffer of its length.
    let n = unsafe { real::recv(nl, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    let msg = buf.get(..usize::try_from(n).ok()?)?;
    parse_peer(msg)
}

/// The `UNIX_DIAG_PEER` attribute of the first message of a diagnostics answer. Every length is
/// the kernel's, checked against the buffer.
fn parse_peer(msg: &[u8]) -> Option<u32> {
    let u16_at = |b: &[u8], i: usize| Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], i: usize| Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let len = u32_at(msg, 0)? as usize;
    let ty = u16_at(msg, 4)?;
    if ty != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    let msg = msg.get(..len)?;
    // nlmsghdr (16) + unix_diag_msg (16), then attributes aligned to 4.
    let mut i = 32;
    while i + 4 <= msg.len() {
        let alen = u16_at(msg, i)? as usize;
        let aty = u16_at(msg, i + 2)?;
        if alen < 4 {
            return None;
        }
        if aty == UNIX_DIAG_PEER && alen >= 8 {
            return u32_at(msg, i + 4);
        }
        i += (alen + 3) & !3;
    }
    None
}

/// Our children (of every thread of this process) for which `consider` holds, with a
/// descriptor that names socket inode `ino` (only their descriptors are read: a pre-fork
/// server's many workers cost one `consider` each, not a scan of their tables).
pub fn children_holding(ino: u32, consider: impl Fn(u32) -> bool) -> Vec<u32> {
    let want = format!("socket:[{ino}]");
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(list) = std::fs::read_to_string(t.path().join("children")) else {
            continue;
        };
        for pid in list
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            if !consider(pid) {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            let holds = fds.flatten().any(|f| {
                std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == want.as_str())
            });
            if holds && !out.contains(&pid) {
                out.push(pid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_peer_reads_the_attribute_and_refuses_short_or_bad_lengths() {
        let mut m = vec![0u8; 32];
        m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        // An unrelated attribute, then the peer.
        m.extend_from_slice(&6u16.to_ne_bytes());
        m.extend_from_slice(&1u16.to_ne_bytes());
        m.extend_from_slice(&[9, 9, 0, 0]);
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&UNIX_DIAG_PEER.to_ne_bytes());
        m.extend_from_slice(&4242u32.to_ne_bytes());
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(parse_peer(&m), Some(4242));
        // Cut short: the length says more than there is.
        assert_eq!(parse_peer(&m[..m.len() - 2]), None);
        // An attribute length below its header.
        let mut bad = m.clone();
        bad[32..34].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(parse_peer(&bad), None);
        assert_eq!(parse_peer(&[]), None);
    }

    #[test]
    fn peer_inode_of_a_socketpair_is_the_other_end() {
        let mut sv = [0i32; 2];
        // SAFETY: valid out array of two.
        let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) };
        assert_eq!(r, 0);
        // SAFETY: plain zeroed out buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid out buffer.
        assert_eq!(unsafe { libc::fstat(sv[1], &mut st) }, 0);
        assert_eq!(peer_inode(sv[0]), Some(st.st_ino as u32));
        // SAFETY: our descriptors.
        unsafe {
            libc::close(sv[0]);
            libc::close(sv[1]);
        }
    }
}
