//! epoll emulation for SMC connections.
//!
//! An SMC fd is registered with the kernel for `EPOLLIN | EPOLLRDHUP` only (doorbells and the
//! channel's EOF wake us) with our own tag as `epoll_data`; the application's events and data
//! are kept here. `epoll_wait` computes readiness from the rings, emulates `EPOLLET` (a new edge
//! only when the peer moved a cursor or a flag since the last report) and `EPOLLONESHOT`, and
//! hands back the application's data. Sockets that may still become SMC (not yet connected)
//! are tracked too, registered as the application asked until they convert.

use crate::fdtable::{self, Slot};
use crate::obj::Obj;
use crate::poll::{self, ERR, HUP, IN, RDHUP};
use crate::real;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
/// The kernel's limit on maxevents (`INT_MAX / sizeof(struct epoll_event)`).
const EP_MAX_EVENTS: usize = i32::MAX as usize / std::mem::size_of::<libc::epoll_event>();
/// Kernel events fetched per call at most.
const KBUF: usize = 1024;

/// High 32 bits of the kernel epoll_data of an SMC fd (random per process).
fn cookie() -> u64 {
    static C: OnceLock<u64> = OnceLock::new();
    *C.get_or_init(|| {
        let mut b = [0u8; 4];
        // SAFETY: valid buffer.
        unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
        let v = u32::from_ne_bytes(b) as u64 | 0x8000_0000;
        v << 32
    })
}

fn tag(fd: i32) -> u64 {
    cookie() | fd as u32 as u64
}

pub struct Entry {
    events: u32,
    data: u64,
    /// The connection, once the fd is SMC (emulated); `None` while it is only a candidate.
    obj: Option<Arc<Obj>>,
    last_token: (u64, u64),
    last_mask: u32,
    disabled: bool,
}

#[derive(Default)]
pub struct EpInner {
    entries: HashMap<i32, Entry>,
    /// fds of emulated entries, for a fair scan.
    order: Vec<i32>,
    rr: usize,
}

#[derive(Default)]
pub struct EpollSet {
    inner: Mutex<EpInner>,
    smc: AtomicUsize,
}

/// fd -> epoll fds that track it.
fn members() -> &'static Mutex<HashMap<i32, Vec<i32>>> {
    static M: OnceLock<Mutex<HashMap<i32, Vec<i32>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}
static MEMBERS_N: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn set_of(ep: i32, create: bool) -> Option<Arc<Obj>> {
    if let Some(o) = fdtable::get(ep) {
        if let Obj::Epoll(_) = &*o {
            return Some(o);
        }
        return None;
    }
    if !create {
        return None;
    }
    static CREATE: Mutex<()> = Mutex::new(());
    let _g = lock(&CREATE);
    if let Some(o) = fdtable::get(ep) {
        return match &*o {
            Obj::Epoll(_) => Some(o),
            _ => None,
        };
    }
    let o = Arc::new(Obj::Epoll(EpollSet::default()));
    drop(fdtable::replace(ep, Slot::Obj(o.clone())));
    Some(o)
}

fn as_set(o: &Obj) -> &EpollSet {
    match o {
        Obj::Epoll(s) => s,
        _ => unreachable!(),
    }
}

/// Our epoll_ctl. Returns `None` when the call is not ours (pass it through).
///
/// # Safety
/// `ev` is the caller's pointer.
pub unsafe fn ctl(ep: i32, op: i32, fd: i32, ev: *mut libc::epoll_event) -> Option<i32> {
    let raw = fdtable::raw(fd) & !1;
    let obj = if raw >= 8 { fdtable::get(fd) } else { None };
    let emulated = obj.as_ref().is_some_and(|o| o.conn().is_some());
    let candidate = raw == fdtable::TAG_TCP
        || obj
            .as_ref()
            .is_some_and(|o| matches!(&**o, Obj::Pending(_) | Obj::Handshake(_)));
    if !emulated && !candidate {
        if op == libc::EPOLL_CTL_DEL && MEMBERS_N.load(Ordering::Relaxed) > 0 {
            if let Some(so) = set_of(ep, false) {
                forget(as_set(&so), ep, fd);
            }
        }
        return None;
    }
    let so = set_of(ep, true)?;
    let set = as_set(&so);
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        let e = unsafe { &*ev };
        (e.events, e.u64)
    };
    let mut g = lock(&set.inner);
    // As the kernel: EPOLLEXCLUSIVE only with ADD, and an exclusive entry cannot be modified.
    let excl = libc::EPOLLEXCLUSIVE as u32;
    if op == libc::EPOLL_CTL_MOD
        && (events & excl != 0 || g.entries.get(&fd).is_some_and(|e| e.events & excl != 0))
    {
        real::set_errno(libc::EINVAL);
        return Some(-1);
    }
    let mut kev = libc::epoll_event {
        events: if emulated { IN | RDHUP } else { events },
        u64: if emulated { tag(fd) } else { data },
    };
    match op {
        libc::EPOLL_CTL_ADD => {
            if g.entries.contains_key(&fd) {
                // The kernel is the judge (it may be a different open file on the same number).
                let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
                if r != 0 {
                    return Some(r);
                }
            } else {
                let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
                if r != 0 {
                    return Some(r);
                }
            }
            g.entries.insert(
                fd,
                Entry {
                    events,
                    data,
                    obj: if emulated { obj.clone() } else { None },
                    last_token: (0, 0),
                    last_mask: 0,
                    disabled: false,
                },
            );
            if emulated {
                g.order.push(fd);
                set.smc.fetch_add(1, Ordering::Relaxed);
            }
            let mut m = lock(members());
            let v = m.entry(fd).or_default();
            if !v.contains(&ep) {
                v.push(ep);
                MEMBERS_N.fetch_add(1, Ordering::Relaxed);
            }
            Some(0)
        }
        libc::EPOLL_CTL_MOD => {
            let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
            if r != 0 {
                return Some(r);
            }
            if let Some(e) = g.entries.get_mut(&fd) {
                e.events = events;
                e.data = data;
                e.disabled = false;
                e.last_mask = 0;
                e.last_token = (0, 0);
            }
            Some(0)
        }
        libc::EPOLL_CTL_DEL => {
            let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
            remove_entry(set, &mut g, fd);
            drop(g);
            unmember(fd, ep);
            Some(r)
        }
        _ => None,
    }
}

fn remove_entry(set: &EpollSet, g: &mut EpInner, fd: i32) {
    if let Some(e) = g.entries.remove(&fd) {
        if e.obj.is_some() {
            g.order.retain(|&x| x != fd);
            set.smc.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn unmember(fd: i32, ep: i32) {
    let mut m = lock(members());
    if let Some(v) = m.get_mut(&fd) {
        let before = v.len();
        v.retain(|&x| x != ep);
        MEMBERS_N.fetch_sub(before - v.len(), Ordering::Relaxed);
        if v.is_empty() {
            m.remove(&fd);
        }
    }
}

fn forget(set: &EpollSet, ep: i32, fd: i32) {
    let mut g = lock(&set.inner);
    remove_entry(set, &mut g, fd);
    drop(g);
    unmember(fd, ep);
}

/// Whether an epoll set of ours tracks `fd`.
pub fn is_member(fd: i32) -> bool {
    MEMBERS_N.load(Ordering::Relaxed) > 0 && lock(members()).contains_key(&fd)
}

/// `fd` is being closed: drop it from every epoll set (the kernel does the same).
pub fn on_close(fd: i32) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let eps = lock(members()).remove(&fd).unwrap_or_default();
    MEMBERS_N.fetch_sub(eps.len(), Ordering::Relaxed);
    for ep in eps {
        if let Some(so) = set_of(ep, false) {
            let set = as_set(&so);
            let mut g = lock(&set.inner);
            remove_entry(set, &mut g, fd);
        }
    }
}

/// `fd` became an SMC connection: switch its registrations to emulation.
pub fn on_convert(fd: i32, obj: &Arc<Obj>) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let eps = lock(members()).get(&fd).cloned().unwrap_or_default();
    for ep in eps {
        let Some(so) = set_of(ep, false) else {
            continue;
        };
        let set = as_set(&so);
        let mut g = lock(&set.inner);
        let Some(e) = g.entries.get_mut(&fd) else {
            continue;
        };
        if e.obj.is_some() {
            continue;
        }
        let mut kev = libc::epoll_event {
            events: IN | RDHUP,
            u64: tag(fd),
        };
        // SAFETY: valid event.
        if unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut kev) } == 0 {
            e.obj = Some(obj.clone());
            g.order.push(fd);
            set.smc.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether `ep` needs emulation.
pub fn wants(ep: i32) -> Option<Arc<Obj>> {
    if fdtable::raw(ep) < 8 {
        return None;
    }
    let o = fdtable::get(ep)?;
    match &*o {
        Obj::Epoll(s) if s.smc.load(Ordering::Relaxed) > 0 => Some(o),
        _ => None,
    }
}

/// Fill `out` with ready emulated entries (ET/ONESHOT rules), at most `max`.
fn collect(set: &EpollSet, out: &mut Vec<libc::epoll_event>, max: usize, arm: bool) {
    let mut g = lock(&set.inner);
    let n = g.order.len();
    if n == 0 {
        return;
    }
    let start = g.rr % n;
    let mut advanced = 0;
    for i in 0..n {
        if out.len() >= max {
            break;
        }
        let fd = g.order[(start + i) % n];
        let Some(e) = g.entries.get_mut(&fd) else {
            continue;
        };
        if e.disabled {
            continue;
        }
        let Some(o) = &e.obj else { continue };
        let Some(c) = o.conn() else { continue };
        let want = e.events | ERR | HUP;
        let mask = if arm {
            poll::arm(c, fd, e.events)
        } else {
            poll::conn_mask(c)
        } & want;
        if mask == 0 {
            e.last_mask = 0;
            continue;
        }
        if e.events & ET != 0 {
            let tok = c.edge_token();
            if tok == e.last_token && mask & !e.last_mask == 0 {
                continue;
            }
            e.last_token = tok;
            e.last_mask = mask;
        }
        if e.events & ONESHOT != 0 {
            e.disabled = true;
        }
        out.push(libc::epoll_event {
            events: mask,
            u64: e.data,
        });
        advanced = i + 1;
    }
    g.rr = start + advanced;
}

/// Drain doorbells of the emulated fds the kernel reported; translate plain events.
fn translate(set: &EpollSet, kev: &[libc::epoll_event], out: &mut Vec<libc::epoll_event>) {
    let ck = cookie();
    let mut g = None;
    for k in kev {
        let d = k.u64;
        if d & 0xFFFF_FFFF_0000_0000 == ck {
            let fd = d as u32 as i32;
            let g = g.get_or_insert_with(|| lock(&set.inner));
            if let Some(Entry { obj: Some(o), .. }) = g.entries.get(&fd) {
                if let Some(c) = o.conn() {
                    c.drain(fd);
                }
                continue;
            }
        }
        out.push(*k);
    }
}

/// Our epoll_wait / epoll_pwait.
///
/// # Safety
/// `events` is the caller's array of `max` entries.
pub unsafe fn wait(
    so: &Obj,
    ep: i32,
    events: *mut libc::epoll_event,
    max: i32,
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    if max <= 0 || events.is_null() {
        real::set_errno(libc::EINVAL);
        return -1;
    }
    if max as usize > EP_MAX_EVENTS {
        real::set_errno(libc::EINVAL);
        return -1;
    }
    let set = as_set(so);
    let max = max as usize;
    let deadline = poll::deadline_ms(timeout);
    // At most KBUF events per call from the kernel (the rest stay queued there for the next
    // call, as with a smaller maxevents): a huge maxevents must not allocate its size.
    let mut out: Vec<libc::epoll_event> = Vec::with_capacity(max.min(KBUF));
    let mut kbuf: Vec<libc::epoll_event> =
        vec![libc::epoll_event { events: 0, u64: 0 }; max.min(KBUF)];
    let kwait_n = |kbuf: &mut Vec<libc::epoll_event>,
                   n: usize,
                   t: i32,
                   mask: Option<*const libc::sigset_t>|
     -> i32 {
        let n = n.min(kbuf.len()) as i32;
        match mask {
            None => unsafe { real::epoll_wait(ep, kbuf.as_mut_ptr(), n, t) },
            Some(m) => unsafe { real::epoll_pwait(ep, kbuf.as_mut_ptr(), n, t, m) },
        }
    };
    let kwait = |kbuf: &mut Vec<libc::epoll_event>, t: i32, mask: Option<*const libc::sigset_t>| {
        let n = kbuf.len();
        kwait_n(kbuf, n, t, mask)
    };
    let finish = |out: &Vec<libc::epoll_event>| -> i32 {
        let n = out.len().min(max);
        // SAFETY: the caller's array holds max entries.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), events, n) };
        n as i32
    };
    let mut spun = false;
    loop {
        out.clear();
        collect(set, &mut out, max, false);
        if !out.is_empty() || timeout == 0 {
            let room = max - out.len();
            if room > 0 {
                // Only as many kernel events as there is room for: the kernel keeps the others
                // (an edge-triggered plain fd's event dropped here would be lost for good).
                let r = kwait_n(&mut kbuf, room, 0, None);
                if r > 0 {
                    translate(set, &kbuf[..r as usize], &mut out);
                }
                if out.is_empty() {
                    // Doorbells may have made something ready.
                    collect(set, &mut out, max, false);
                }
            }
            return finish(&out);
        }
        if !spun {
            spun = true;
            let budget = poll::spin_budget();
            if budget > 0 {
                let start = Instant::now();
                let mut hit = false;
                let mut i = 0u32;
                while (start.elapsed().as_nanos() as u64) < budget {
                    collect(set, &mut out, max, false);
                    if !out.is_empty() {
                        hit = true;
                        break;
                    }
                    i += 1;
                    if i & 31 == 0 {
                        let r = kwait(&mut kbuf, 0, None);
                        if r > 0 {
                            translate(set, &kbuf[..r as usize], &mut out);
                            collect(set, &mut out, max, false);
                            if !out.is_empty() {
                                hit = true;
                                break;
                            }
                        }
                    }
                    crate::conn::spin_pause(i);
                }
                poll::spin_result(hit);
                if hit {
                    return finish(&out);
                }
            }
        }
        // Arm every emulated entry and recheck.
        out.clear();
        collect(set, &mut out, max, true);
        if !out.is_empty() {
            return finish(&out);
        }
        let rem = poll::remaining_ms(deadline);
        if deadline.is_some() && rem == 0 {
            return 0;
        }
        let r = kwait(&mut kbuf, rem, sigmask);
        if r < 0 {
            return r;
        }
        translate(set, &kbuf[..r as usize], &mut out);
        let room = max.saturating_sub(out.len());
        if room > 0 {
            let mut mine = Vec::new();
            collect(set, &mut mine, room, false);
            out.extend(mine);
        }
        if !out.is_empty() {
            return finish(&out);
        }
        if deadline.is_some() && poll::remaining_ms(deadline) == 0 {
            return 0;
        }
    }
}
