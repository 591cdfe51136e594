//! The `poll`/`select` emulation over the readiness of SMC connections ([`crate::ready`]).
//!
//! The TCP socket of an SMC connection carries only doorbells, so the kernel's view of it is
//! only a wakeup hint. Readiness is computed from the rings: readable only when data or EOF is
//! there, writable only when there is room. Before sleeping in the real `poll`, every SMC fd
//! announces itself (wait bit in shared memory, rechecked afterwards), so a peer that changes
//! the ring rings the doorbell and wakes us.

use crate::fdtable;
use crate::fdtable::InCall;
use crate::obj::Obj;
use crate::ready::{
    arm, conn_mask_at, deadline_ms, remaining_ms, settle, spin_budget, spin_result, ERR,
    HS_TICK_MS, HUP,
};
use crate::real;
use crate::util::unwound;
use std::sync::Arc;
use std::time::Instant;

/// What one pollfd is for us.
enum Kind {
    Plain,
    /// An SMC connection; the wait holds it as a call in flight (as the kernel's poll holds the
    /// files it sleeps on): a close of the number meanwhile leaves it open until the wait ends,
    /// and moves its I/O off the number.
    Smc(InCall),
    /// Connect (`true`: not established yet) or handshake under way: the kernel's events on it
    /// (connect completion, the peer's CLC message) drive it. The application sees `POLLOUT`
    /// once the TCP connection is established (as TCP says; a write then waits for the
    /// decision with `EAGAIN`), never `POLLIN`: CLC bytes are not data.
    Undecided(Und),
}

/// Which step of its setup an undecided fd is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Und {
    /// The TCP connect is not complete.
    Connecting,
    /// The handshake is under way.
    Handshake,
    /// The handshake is under way and the fd is not writable until it is decided (a client's
    /// connect completes then; see [`crate::obj::Handshake::out_while_undecided`]).
    WriteWaits,
    /// A fallback whose peer may still send late CLC messages ([`Obj::Skip`]): writable as
    /// TCP says, readable only once they are skipped and data (or the end) follows.
    Skipping,
}

fn classify(fd: i32, events: i16) -> Kind {
    if fdtable::raw(fd) < 8 {
        return Kind::Plain;
    }
    let Some(o) = fdtable::get(fd) else {
        return Kind::Plain;
    };
    match &*o {
        // Continues on TCP with bytes its switch read still in our ring: a wait that is not
        // for them is the socket's (a sleep until it is writable, not a spin on our answer).
        Obj::Conn(c)
            if c.on_tcp_with_stash() && events & (libc::POLLIN | libc::POLLRDNORM) == 0 =>
        {
            return Kind::Plain
        }
        Obj::Conn(_) => return smc_kind(fd, o),
        Obj::Pending(_) => {
            drop(o);
            crate::setup::resolve_pending(fd);
        }
        // What has arrived is processed.
        Obj::Handshake(h) => {
            crate::setup::progress(fd, h, false);
            drop(o);
        }
        // Late CLC messages that are there are skipped; while more may come they are no data.
        Obj::Skip(sk) => {
            if crate::setup::skip_late_clc(fd, fd, &o, sk) {
                return Kind::Plain;
            }
            return Kind::Undecided(Und::Skipping);
        }
        // An epoll set of ours: the kernel's answer for it must include its emulated entries.
        Obj::Epoll(_) => {
            drop(o);
            crate::epoll::prepare_indirect(fd, 0);
            return Kind::Plain;
        }
        _ => return Kind::Plain,
    }
    let Some(o) = fdtable::get(fd) else {
        return Kind::Plain;
    };
    if o.conn().is_some() {
        return smc_kind(fd, o);
    }
    match &*o {
        Obj::Pending(_) => Kind::Undecided(Und::Connecting),
        Obj::Handshake(h) if !h.out_while_undecided() => Kind::Undecided(Und::WriteWaits),
        Obj::Handshake(_) => Kind::Undecided(Und::Handshake),
        // Just fallen back with late CLC messages to skip (the handshake timed out above): as
        // a `Skip` found at the start. Taken for plain, the kernel reported the late message as
        // data to read, and the read that followed skipped it and said `EAGAIN`.
        Obj::Skip(sk) => {
            if crate::setup::skip_late_clc(fd, fd, &o, sk) {
                Kind::Plain
            } else {
                Kind::Undecided(Und::Skipping)
            }
        }
        _ => Kind::Plain,
    }
}

/// An SMC connection held for the wait; plain when its number was closed meanwhile (the
/// kernel's poll then answers for what the number names now).
fn smc_kind(fd: i32, o: Arc<Obj>) -> Kind {
    match InCall::enter(fd, o) {
        Some(call) => Kind::Smc(call),
        None => Kind::Plain,
    }
}

/// What the kernel is asked about an undecided fd: connect completion, then the peer's CLC
/// messages (and writability, when the application asks for it).
fn undecided_events(und: Und, app: i16) -> i16 {
    match und {
        Und::Connecting => libc::POLLOUT,
        Und::Handshake => libc::POLLIN | (app & libc::POLLOUT),
        // A fallback: urgent data (out of band) is TCP's, whatever is still to skip in band.
        Und::Skipping => libc::POLLIN | (app & (libc::POLLOUT | libc::POLLPRI)),
        Und::WriteWaits => libc::POLLIN,
    }
}

/// A change this process makes to a connection without its peer (`shutdown` in another
/// thread, a lower `SO_RCVLOWAT`) rings no doorbell, and the kernel wakes a `poll` only for
/// the socket's own events: a poll sleeping on SMC fds checks their rings again at least this
/// often (TCP wakes it at once; an epoll wait is kicked instead).
const LOCAL_TICK_MS: i32 = 200;

/// Whether any of `fds` is an SMC connection (or may become one).
pub fn any_smc(fds: &[libc::pollfd]) -> bool {
    fds.iter().any(|p| fdtable::raw(p.fd) >= 8)
}

/// `poll` over a set that contains SMC fds. `sigmask` is applied during the sleep (ppoll).
///
/// # Safety
/// `fds` is the caller's array.
pub unsafe fn poll_emul(
    fds: &mut [libc::pollfd],
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    let deadline = deadline_ms(timeout);
    let mut t = timeout;
    loop {
        // SAFETY: the caller's array, as passed.
        if let Some(n) = unsafe { poll_once(fds, t, sigmask) } {
            return n;
        }
        // A handshake moved: classify again, with what is left of the timeout (0 at the end,
        // which never asks for another round).
        t = remaining_ms(deadline);
    }
}

/// One round of [`poll_emul`]; `None` when a connect or handshake of the set moved while it
/// waited (the fds are to be classified again).
unsafe fn poll_once(
    fds: &mut [libc::pollfd],
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> Option<i32> {
    let kinds: Vec<Kind> = fds.iter().map(|p| classify(p.fd, p.events)).collect();
    if kinds.iter().all(|k| matches!(k, Kind::Plain)) {
        // SAFETY: `fds` is the caller's pollfd array (a live slice); `sigmask` is the caller's mask
        // or None.
        return Some(unsafe { real_poll(fds, timeout, sigmask) });
    }
    let deadline = deadline_ms(timeout);
    let mut tmp: Vec<libc::pollfd> = fds.to_vec();
    for ((t, k), p) in tmp.iter_mut().zip(&kinds).zip(fds.iter_mut()) {
        match k {
            // The kernel only wakes us on doorbells (and EOF/reset of the channel).
            Kind::Smc(_) => t.events = libc::POLLIN,
            Kind::Undecided(und) => {
                t.events = undecided_events(*und, p.events);
                p.revents = 0;
            }
            Kind::Plain => {}
        }
    }
    // (A skip has no timer: the kernel's event for its socket drives it.)
    let ticking = kinds
        .iter()
        .any(|k| matches!(k, Kind::Undecided(u) if *u != Und::Skipping));
    let user_ready = |fds: &mut [libc::pollfd], arm_too: bool| -> i32 {
        let mut n = 0;
        for (p, k) in fds.iter_mut().zip(&kinds) {
            if let Some(c) = match k {
                Kind::Smc(call) => Some(call.conn()),
                _ => None,
            } {
                let want = p.events as u32 | ERR | HUP;
                let m = if arm_too {
                    arm(c, p.fd, p.events as u32)
                } else {
                    conn_mask_at(c, p.fd)
                } & want;
                p.revents = m as i16;
                if m != 0 {
                    n += 1;
                }
            }
        }
        n
    };
    let mut spun = false;
    loop {
        let mut n = user_ready(fds, false);
        if n == 0 && timeout == 0 {
            // Nothing, and no wait to read the sockets: the peers' ends may be there.
            let mut changed = false;
            for (p, k) in fds.iter().zip(&kinds) {
                if let Kind::Smc(call) = k {
                    changed |= call.conn().probe_peer_gone(p.fd);
                }
            }
            if changed {
                n = user_ready(fds, false);
            }
        }
        if n > 0 || timeout == 0 {
            // Collect the plain fds without blocking.
            // SAFETY: `fds` and `tmp` are live slices of equal length, `kinds` classifies `fds`; no
            // mask.
            return Some(n + unsafe { merge_plain(fds, &mut tmp, &kinds, 0, None) });
        }
        if !spun {
            spun = true;
            let budget = spin_budget();
            if budget > 0 {
                let start = Instant::now();
                let mut hit = false;
                let mut i = 0u32;
                while (start.elapsed().as_nanos() as u64) < budget {
                    if user_ready(fds, false) > 0 {
                        hit = true;
                        break;
                    }
                    i += 1;
                    if i & 63 == 0 {
                        // Plain fds may be ready too.
                        // SAFETY: `fds` and `tmp` are live slices of equal length, `kinds`
                        // classifies `fds`; no mask.
                        let m = unsafe { merge_plain(fds, &mut tmp, &kinds, 0, None) };
                        if m > 0 {
                            hit = true;
                            break;
                        }
                    }
                    if crate::conn::spin_pause(i) {
                        break;
                    }
                }
                spin_result(hit);
                if hit {
                    continue;
                }
            }
        }
        // Register as sleepers on the SMC sockets, arm and recheck. Each call is noted asleep
        // there (`util::unwound`: a `siglongjmp` out of a signal handler skips the leaves below,
        // its thread makes them at its next entry into the library).
        let depth = 0u8;
        let depth = std::hint::black_box(&depth) as *const u8 as usize;
        let mut naps = Vec::new();
        for k in &kinds {
            if let Kind::Smc(call) = k {
                call.conn().sleep_enter();
                if let Some(a) = unwound::asleep(call.conn() as *const _ as usize, depth) {
                    a.hold(unwound::KSLEEP);
                    naps.push(a);
                }
            }
        }
        let leave_all = || {
            for (t, k) in tmp.iter().zip(&kinds) {
                if let Kind::Smc(call) = k {
                    let _ = call.conn().sleep_leave(t.fd, false);
                }
            }
        };
        let n = user_ready(fds, true);
        if n > 0 {
            drop(naps);
            leave_all();
            // SAFETY: `fds` and `tmp` are live slices of equal length, `kinds` classifies `fds`; no
            // mask.
            return Some(n + unsafe { merge_plain(fds, &mut tmp, &kinds, 0, None) });
        }
        let rem = remaining_ms(deadline);
        if deadline.is_some() && rem == 0 {
            drop(naps);
            leave_all();
            for p in fds.iter_mut() {
                p.revents = 0;
            }
            return Some(0);
        }
        let cap = if ticking { HS_TICK_MS } else { LOCAL_TICK_MS };
        let t = if !(0..=cap).contains(&rem) { cap } else { rem };
        for t in tmp.iter_mut() {
            t.revents = 0;
        }
        // SAFETY: `tmp` is a live pollfd slice; `sigmask` is the caller's mask or None.
        let r = unsafe { real_poll(&mut tmp, t, sigmask) };
        drop(naps);
        // Leave; the last sleeper of a socket drains its doorbells. Doorbells left to other
        // sleepers must be gone before we sleep on that socket again.
        let mut pending = Vec::new();
        for (t, k) in tmp.iter().zip(&kinds) {
            if let Kind::Smc(call) = k {
                let c = call.conn();
                if c.sleep_leave(t.fd, r > 0 && t.revents != 0) {
                    pending.push((call.obj().clone(), t.fd, c.wake_seq()));
                }
            }
        }
        if r < 0 {
            return Some(r);
        }
        // Recompute everything.
        let mut moved = r == 0 && ticking;
        let mut closed = false;
        for ((t, k), p) in tmp.iter().zip(&kinds).zip(fds.iter_mut()) {
            match k {
                // The number was closed (by another thread) during the sleep: the kernel's
                // poll answers for what it names now (`POLLNVAL` when nothing), as it does for a
                // TCP socket closed under a poll; also when another file took the number, whose
                // readiness the kernel just reported (`tests/redteam/rt5.c poll_reuse`).
                Kind::Smc(call) => closed |= t.revents & libc::POLLNVAL != 0 || !call.still_named(),
                Kind::Plain => p.revents = t.revents,
                Kind::Undecided(und) => {
                    let out = libc::POLLOUT;
                    if *und == Und::Connecting || t.revents & !out != 0 {
                        // Connected, a CLC message, or the connection broke: drive it.
                        moved |= t.revents != 0;
                    } else {
                        p.revents = t.revents & p.events & out;
                    }
                }
            }
        }
        if closed {
            return None;
        }
        let plain = fds
            .iter()
            .zip(&kinds)
            .filter(|(p, k)| !matches!(k, Kind::Smc(_)) && p.revents != 0)
            .count() as i32;
        let n = user_ready(fds, false);
        if n + plain > 0 {
            return Some(n + plain);
        }
        if moved {
            return None;
        }
        if deadline.is_some() && remaining_ms(deadline) == 0 {
            return Some(0);
        }
        let ready = settle(&mut pending, || {
            user_ready(fds, false) > 0
                // SAFETY: `fds` and `tmp` are live slices of equal length, `kinds` classifies
                // `fds`; no mask.
                || unsafe { merge_plain(fds, &mut tmp, &kinds, 0, None) } > 0
                || (deadline.is_some() && remaining_ms(deadline) == 0)
        });
        if ready {
            let n = user_ready(fds, false);
            // SAFETY: `fds` and `tmp` are live slices of equal length, `kinds` classifies `fds`; no
            // mask.
            return Some(n + unsafe { merge_plain(fds, &mut tmp, &kinds, 0, None) });
        }
    }
}

/// Poll the plain fds of the set (SMC fds masked out with fd = -1), copy their revents.
unsafe fn merge_plain(
    fds: &mut [libc::pollfd],
    tmp: &mut [libc::pollfd],
    kinds: &[Kind],
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    let mut any = false;
    for ((t, k), p) in tmp.iter_mut().zip(kinds).zip(fds.iter()) {
        match k {
            Kind::Plain => {
                t.fd = p.fd;
                t.events = p.events;
                any = true;
            }
            // An established connection in its handshake (or skipping late CLC messages) is
            // writable as far as TCP goes; a fallback's urgent data is TCP's too.
            Kind::Undecided(Und::Skipping) if p.events & (libc::POLLOUT | libc::POLLPRI) != 0 => {
                t.fd = p.fd;
                t.events = p.events & (libc::POLLOUT | libc::POLLPRI);
                any = true;
            }
            Kind::Undecided(Und::Handshake) if p.events & libc::POLLOUT != 0 => {
                t.fd = p.fd;
                t.events = libc::POLLOUT;
                any = true;
            }
            Kind::Smc(_) | Kind::Undecided(_) => t.fd = -1,
        }
        t.revents = 0;
    }
    let mut n = 0;
    for (p, k) in fds.iter_mut().zip(kinds) {
        if !matches!(k, Kind::Smc(_)) {
            p.revents = 0;
        }
    }
    if any {
        // SAFETY: `tmp` is a live pollfd slice; `sigmask` is the caller's mask or None.
        let r = unsafe { real_poll(tmp, timeout, sigmask) };
        if r > 0 {
            for ((t, k), p) in tmp.iter().zip(kinds).zip(fds.iter_mut()) {
                p.revents = match k {
                    Kind::Plain => t.revents,
                    Kind::Undecided(_) if t.fd >= 0 => {
                        t.revents & (libc::POLLOUT | libc::POLLPRI) & t.events
                    }
                    _ => continue,
                };
                if p.revents != 0 {
                    n += 1;
                }
            }
        }
    }
    // Restore fds in tmp for the next blocking poll.
    for (t, p) in tmp.iter_mut().zip(fds.iter()) {
        t.fd = p.fd;
    }
    for ((t, k), p) in tmp.iter_mut().zip(kinds).zip(fds.iter()) {
        match k {
            Kind::Smc(_) => t.events = libc::POLLIN,
            Kind::Undecided(und) => t.events = undecided_events(*und, p.events),
            Kind::Plain => {}
        }
    }
    n
}

unsafe fn real_poll(
    fds: &mut [libc::pollfd],
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    match sigmask {
        // SAFETY: `fds` is a live slice: the kernel reads and writes exactly `fds.len()` pollfds.
        None => unsafe { real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) },
        Some(m) => {
            let ts;
            let tp = if timeout < 0 {
                std::ptr::null()
            } else {
                ts = libc::timespec {
                    tv_sec: (timeout / 1000) as libc::time_t,
                    tv_nsec: ((timeout % 1000) as libc::c_long) * 1_000_000,
                };
                &ts as *const libc::timespec
            };
            // SAFETY: `fds` is a live slice of `fds.len()` pollfds; `tp` is null or points to `ts`,
            // alive for the call; `m` is the caller's signal mask.
            unsafe { real::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tp, m) }
        }
    }
}

/// The numbers `select` looks at: `nfds`, at most the size of the descriptor table as the
/// kernel takes it (`core_sys_select`: `max_fds`, `FDSize` in `/proc/self/status`), asked only
/// beyond `FD_SETSIZE` (a program with more descriptors passes larger sets, as libevent does).
/// Sets of up to `FD_SETSIZE` bits are read whole whatever the table's size, as before.
fn select_range(nfds: i32) -> usize {
    let n = usize::try_from(nfds).unwrap_or(0);
    if n <= libc::FD_SETSIZE {
        return n;
    }
    n.min(fd_table_size().unwrap_or(libc::FD_SETSIZE))
        .clamp(libc::FD_SETSIZE, fdtable::MAX_FDS)
}

/// `FDSize` of `/proc/self/status`, read without allocating.
fn fd_table_size() -> Option<usize> {
    let mut buf = [0u8; 4096];
    let text = crate::util::read_small(c"/proc/self/status", &mut buf)?;
    let at = text.windows(7).position(|w| w == b"FDSize:")? + 7;
    let digits = text
        .get(at..)?
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit());
    Some(digits.fold(0usize, |n, d| {
        n.saturating_mul(10).saturating_add(usize::from(d - b'0'))
    }))
}

/// Bit `fd` of the caller's set `s` (of at least [`select_range`] bits), read as the kernel
/// does: words of `c_ulong`, not glibc's `FD_ISSET`, which stops at `FD_SETSIZE`.
///
/// # Safety
/// `s` is null or the caller's set of more than `fd` bits.
unsafe fn bit(s: *const libc::fd_set, fd: usize) -> bool {
    const W: usize = libc::c_ulong::BITS as usize;
    // SAFETY: the caller's set holds bit `fd` (the function's contract).
    !s.is_null() && unsafe { *(s as *const libc::c_ulong).add(fd / W) >> (fd % W) & 1 != 0 }
}

/// Sets bit `fd` of `s` (as [`bit`]).
///
/// # Safety
/// `s` is the caller's writable set of more than `fd` bits.
unsafe fn set_bit(s: *mut libc::fd_set, fd: usize) {
    const W: usize = libc::c_ulong::BITS as usize;
    // SAFETY: as above.
    unsafe { *(s as *mut libc::c_ulong).add(fd / W) |= 1 << (fd % W) };
}

/// `select` through `poll_emul` when an SMC fd is in the sets.
///
/// # Safety
/// The fd_set pointers are the caller's (or null), of at least `nfds` bits.
pub unsafe fn select_emul(
    nfds: i32,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout_ms: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    let n = select_range(nfds);
    let mut pfds: Vec<libc::pollfd> = Vec::new();
    for fd in 0..n {
        let mut ev = 0i16;
        // SAFETY: the caller's sets of at least `n` bits (or null).
        let (in_r, in_w, in_e) = unsafe { (bit(r, fd), bit(w, fd), bit(e, fd)) };
        if in_r {
            ev |= libc::POLLIN;
        }
        if in_w {
            ev |= libc::POLLOUT;
        }
        if in_e {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            pfds.push(libc::pollfd {
                fd: fd as i32,
                events: ev,
                revents: 0,
            });
        }
    }
    // SAFETY: `pfds` is a live Vec of pollfds; `sigmask` is the caller's mask or None.
    let ready = unsafe { poll_emul(&mut pfds, timeout_ms, sigmask) };
    if ready < 0 {
        return ready;
    }
    if pfds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        real::set_errno(libc::EBADF);
        return -1;
    }
    // The kernel writes back the words that hold the `n` bits, nothing beyond.
    let words = n.div_ceil(libc::c_ulong::BITS as usize);
    for s in [r, w, e] {
        if !s.is_null() {
            // SAFETY: the caller's writable set of at least `n` bits, `words` words.
            unsafe { std::ptr::write_bytes(s as *mut libc::c_ulong, 0, words) };
        }
    }
    let mut count = 0;
    for p in &pfds {
        let fd = p.fd as usize;
        let rd = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        let wr = p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
        let ex = p.revents & libc::POLLPRI != 0;
        if rd && p.events & libc::POLLIN != 0 {
            // SAFETY: `p` was added for POLLIN only when `r` is non-null; `fd < n`.
            unsafe { set_bit(r, fd) };
            count += 1;
        }
        if wr && p.events & libc::POLLOUT != 0 {
            // SAFETY: `p` was added for POLLOUT only when `w` is non-null; `fd < n`.
            unsafe { set_bit(w, fd) };
            count += 1;
        }
        if ex && p.events & libc::POLLPRI != 0 {
            // SAFETY: `p` was added for POLLPRI only when `e` is non-null; `fd < n`.
            unsafe { set_bit(e, fd) };
            count += 1;
        }
    }
    count
}

/// Whether an fd_set triple contains an SMC fd.
///
/// # Safety
/// The fd_set pointers are the caller's (or null).
pub unsafe fn select_has_smc(
    nfds: i32,
    r: *const libc::fd_set,
    w: *const libc::fd_set,
    e: *const libc::fd_set,
) -> bool {
    if !fdtable::any_objects() {
        return false;
    }
    // A set at a pointer the kernel cannot read (NULL is no set): the kernel's `EFAULT`.
    if [r, w, e]
        .iter()
        .any(|s| !s.is_null() && (*s as usize) < 0x1_0000)
    {
        return false;
    }
    for fd in 0..select_range(nfds) {
        if fdtable::raw(fd as i32) >= 8 {
            for s in [r, w, e] {
                // SAFETY: the caller's set of at least `select_range(nfds)` bits, or null.
                if unsafe { bit(s, fd) } {
                    return true;
                }
            }
        }
    }
    false
}
