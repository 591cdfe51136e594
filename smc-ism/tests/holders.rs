//! Holder processes (`daemon/holder.rs`): beyond the daemon's own shelf (capped here at 0
//! files with `max_shelved`, as `vm.max_map_count` caps it on a host), the background sweep
//! moves DMB files into holder processes (4 files each here, `holder_max_files`), and the
//! daemon opens them again through the holders' mappings: an adopt and a pooled DMB bound
//! again get the very files. A holder killed loses nothing in use (the mappings of the
//! connections work on), its files fail their reopen cleanly (the reply goes without them,
//! the client declines), and new files go to a new holder. At shutdown the zygote and the
//! holders go; and when the daemon's process is killed, they go with it.
//!
//! A binary of its own: the holders are per process (as the shelves), and the first test finds
//! them among this process's grandchildren; the second runs its daemon in a child process
//! (`holders_daemon_child`) to kill it.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use smc_ism::proto;

fn inode(fd: &OwnedFd) -> u64 {
    // SAFETY: `libc::stat` is plain integers; valid out buffer; our own fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_ino
}

fn pwrite(fd: &OwnedFd, off: i64, data: &[u8]) {
    // SAFETY: valid buffer of that length; our own fd.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off) };
    assert_eq!(n, data.len() as isize);
}

fn pread(fd: &OwnedFd, off: i64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    // SAFETY: valid buffer of that length; our own fd.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), len, off) };
    assert_eq!(n, len as isize);
    b
}

/// Name and state of process `pid` and its parent, from `/proc/PID/stat`.
fn proc_stat(pid: i32) -> Option<(String, char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (l, r) = (s.find('(')?, s.rfind(')')?);
    let name = s[l + 1..r].to_string();
    let mut rest = s[r + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((name, state, ppid))
}

/// Live children of `parent` called `name`.
fn children(parent: i32, name: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| proc_stat(p).is_some_and(|(n, st, pp)| pp == parent && n == name && st != 'Z'))
        .collect()
}

fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(_, st, _)| st != 'Z')
}

/// This process's zygote and its holders.
fn zygote_and_holders() -> (i32, Vec<i32>) {
    let z = children(std::process::id() as i32, "smc-ism-zygote");
    assert_eq!(z.len(), 1, "one zygote: {z:?}");
    (z[0], children(z[0], "smc-ism-holder"))
}

fn wait_stats(
    c: &mut smc_ism::Client,
    what: &str,
    pred: impl FnMut(&smc_ism::Stats) -> bool,
) -> smc_ism::Stats {
    // The sweep's turns are every 100 ms: the generation counter does not move for them.
    let t = Instant::now();
    let mut pred = pred;
    loop {
        let st = c.stats().unwrap();
        if pred(&st) {
            return st;
        }
        assert!(t.elapsed() < WAIT, "{what}: {st:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn files_beyond_the_daemons_own_shelf_go_to_holders_and_a_killed_holder_fails_cleanly() {
    if !shelving_or_skip(
        "files_beyond_the_daemons_own_shelf_go_to_holders_and_a_killed_holder_fails_cleanly",
    ) {
        return;
    }
    let dir = TestDir::new("holders");
    let d = start(&dir, |c| {
        c.shelve_after_ms = Some(0);
        c.max_shelved = Some(0);
        c.holder_max_files = Some(4);
    });
    let mut s = client(&dir);
    let (a, b) = (shared(&dir), shared(&dir));
    // Another process of the same uid, cgroup and pid namespace, that a socket moved to.
    let mut m = client(&dir);
    // Three connections: six DMBs with a state page each, twelve files: three holders of four.
    let conns: Vec<_> = (0..3)
        .map(|_| {
            let (x, y) = tcp_pair();
            let r = pair(&a, &b, &x, &y);
            (x, y, r)
        })
        .collect();
    let st = wait_stats(&mut s, "every file in a holder", |st| {
        st.files_in_holders == 12 && st.dmbs_shelved == 6
    });
    assert_eq!((st.holders, st.live_dmbs), (3, 6), "{st:#?}");
    let (zygote, holders) = zygote_and_holders();
    assert_eq!(holders.len(), 3, "{holders:?}");

    // Adopt: the DMBs and the very state page, opened again through the holders.
    let (x, _, ((a1, _), (b1, _))) = &conns[0];
    let st1 = a1.state.as_ref().expect("a state page");
    pwrite(st1, 100, b"state kept by a holder");
    let own = m.adopt_dmb(x.as_raw_fd(), proto::ADOPT_OWN).unwrap();
    let peer = m.adopt_dmb(x.as_raw_fd(), proto::ADOPT_PEER).unwrap();
    let page = m.adopt_dmb(x.as_raw_fd(), proto::ADOPT_STATE).unwrap();
    assert_eq!((own.token, peer.token), (a1.token, b1.token));
    assert_eq!(inode(&page.fd), inode(st1), "the very page");
    assert_eq!(pread(&page.fd, 100, 22), b"state kept by a holder");
    write_bytes(&own.map().unwrap(), 64, b"through a holder");
    assert_eq!(read_bytes(&a1.map().unwrap(), 64, 16), b"through a holder");

    // A pooled DMB bound again: its memfd and page opened again through the holders.
    let (_, _, ((a2, ap2), (b2, bp2))) = &conns[1];
    a.release_flags(Some(a2.token), Some(ap2.token), proto::RELEASE_POOL_OWN)
        .unwrap();
    b.release_flags(Some(b2.token), Some(bp2.token), proto::RELEASE_POOL_OWN)
        .unwrap();
    let (x2, y2) = tcp_pair();
    let ((a3, ap3), (b3, _)) = pair(&a, &b, &x2, &y2);
    assert_eq!((a3.id, b3.id), (a2.id, b2.id), "bound again");
    assert_eq!(
        inode(a3.state.as_ref().unwrap()),
        inode(a2.state.as_ref().unwrap()),
        "with its page"
    );
    write_bytes(&ap3.map().unwrap(), 64, b"bound again");
    assert_eq!(read_bytes(&b2.map().unwrap(), 64, 11), b"bound again");
    assert_eq!(s.stats().unwrap().failures.reopen, 0);

    // Every holder killed: connections already mapped work on; an adopt of their files fails
    // cleanly (a declined reply, the daemon connection intact), counted as `reopen`.
    let (x4, _, ((a4, ap4), (b4, bp4))) = &conns[2];
    let (own4, peer_of_b4) = (a4.map().unwrap(), bp4.map().unwrap());
    let (peer4, b4own) = (ap4.map().unwrap(), b4.map().unwrap());
    for &h in &holders {
        // SAFETY: a holder of this process's daemon.
        assert_eq!(unsafe { libc::kill(h, libc::SIGKILL) }, 0);
    }
    let t = Instant::now();
    while holders.iter().any(|&h| alive(h)) {
        assert!(t.elapsed() < WAIT, "holders do not die");
        std::thread::sleep(Duration::from_millis(5));
    }
    write_bytes(&own4, 64, b"after the holders");
    assert_eq!(read_bytes(&peer_of_b4, 64, 17), b"after the holders");
    write_bytes(&b4own, 64, b"both ways");
    assert_eq!(read_bytes(&peer4, 64, 9), b"both ways");
    let r = m.adopt_dmb(x4.as_raw_fd(), proto::ADOPT_OWN);
    assert!(r.is_err(), "an adopt of a lost file: {r:?}");
    let st = wait_stats(&mut s, "the dead holders noticed", |st| st.holders == 0);
    assert!(st.failures.reopen >= 1, "{:?}", st.failures);
    assert_eq!(st.files_in_holders, 0);
    // The daemon connection is intact: the same client adopts what is still there.
    let again = m.adopt_dmb(x.as_raw_fd(), proto::ADOPT_OWN);
    assert!(again.is_err(), "its files were in the killed holders too");

    // New connections: their files go to a new holder, and adopting works again.
    let (x5, y5) = tcp_pair();
    let ((a5, _), _) = pair(&a, &b, &x5, &y5);
    let st = wait_stats(&mut s, "a new holder", |st| {
        st.files_in_holders == 4 && st.holders == 1
    });
    assert!(st.dmbs_shelved >= 2, "{st:#?}");
    let own5 = m.adopt_dmb(x5.as_raw_fd(), proto::ADOPT_OWN).unwrap();
    assert_eq!(own5.token, a5.token);
    write_bytes(&own5.map().unwrap(), 64, b"new holder");
    assert_eq!(read_bytes(&a5.map().unwrap(), 64, 10), b"new holder");
    let (z2, holders2) = zygote_and_holders();
    assert_eq!((z2, holders2.len()), (zygote, 1));

    // Shutdown: the zygote and the holders go with the daemon.
    drop((own, peer, page, own5, own4, peer_of_b4, peer4, b4own));
    drop((conns, a, b, m));
    drop(s);
    d.shutdown().unwrap();
    let t = Instant::now();
    while alive(zygote) || holders2.iter().any(|&h| alive(h)) {
        assert!(
            t.elapsed() < WAIT,
            "the zygote or a holder outlives the daemon"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The daemon of [`holders_die_with_a_killed_daemon`], in a child process: serves until it is
/// killed.
#[test]
#[ignore = "run by holders_die_with_a_killed_daemon"]
fn holders_daemon_child() {
    if std::env::var("ISM_CHILD_ROLE").as_deref() != Ok("holders-daemon") {
        return;
    }
    let dir = std::path::PathBuf::from(std::env::var_os("ISM_CHILD_DIR").unwrap());
    let mut cfg = smc_ism::DaemonConfig::with_paths(dir.join("run/ctl.sock"), dir.join("state"));
    cfg.shelve_after_ms = Some(0);
    cfg.max_shelved = Some(0);
    cfg.holder_max_files = Some(4);
    let _d = smc_ism::spawn(cfg).unwrap();
    std::thread::sleep(3 * WAIT);
}

/// A daemon process killed (`SIGKILL`: no shutdown of its own) takes its zygote and holders
/// with it (end of file on their sockets; the holders' `PR_SET_PDEATHSIG` for the zygote),
/// and the connections' memory, which lives in their processes, works on.
#[test]
fn holders_die_with_a_killed_daemon() {
    if !shelving_or_skip("holders_die_with_a_killed_daemon") {
        return;
    }
    let dir = TestDir::new("holders-kill");
    let child = spawn_child(
        "holders_daemon_child",
        "holders-daemon",
        &dir.sock(),
        &[("ISM_CHILD_DIR", dir.0.display().to_string())],
    )
    .spawn()
    .unwrap();
    /// Kills the daemon child also when the test fails.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);
    let daemon = child.0.id() as i32;
    let t = Instant::now();
    while smc_ism::Client::connect(&dir.sock()).is_err() {
        assert!(t.elapsed() < WAIT, "the daemon child does not listen");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut s = client(&dir);
    let (a, b) = (shared(&dir), shared(&dir));
    // Two connections: eight files, two holders of four.
    let (x1, y1) = tcp_pair();
    let ((a1, _), (_, bp1)) = pair(&a, &b, &x1, &y1);
    let (x2, y2) = tcp_pair();
    let ((a2, _), (_, bp2)) = pair(&a, &b, &x2, &y2);
    wait_stats(&mut s, "every file in a holder", |st| {
        st.files_in_holders == 8 && st.holders == 2
    });
    let z = children(daemon, "smc-ism-zygote");
    assert_eq!(z.len(), 1, "one zygote: {z:?}");
    let holders = children(z[0], "smc-ism-holder");
    assert_eq!(holders.len(), 2, "{holders:?}");
    let maps = [
        (a1.map().unwrap(), bp1.map().unwrap()),
        (a2.map().unwrap(), bp2.map().unwrap()),
    ];
    drop(s);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGKILL) }, 0);
    let _ = child.0.wait();
    let t = Instant::now();
    while alive(z[0]) || holders.iter().any(|&h| alive(h)) {
        assert!(
            t.elapsed() < WAIT,
            "the zygote or a holder outlives its daemon"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for (own, peer) in &maps {
        write_bytes(own, 64, b"daemon gone");
        assert_eq!(read_bytes(peer, 64, 11), b"daemon gone");
    }
}
