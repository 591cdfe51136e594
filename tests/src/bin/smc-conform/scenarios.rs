//! The scenarios: each a plain program against the socket API; `smc` is the number of client
//! connections that must take SMC-D when it runs under the data path.
use super::*;

pub struct Scenario {
    pub name: &'static str,
    pub smc: u32,
    pub run: fn(),
}

macro_rules! scenarios {
    ($($name:ident: $smc:expr;)*) => {
        pub static ALL: &[Scenario] = &[$(Scenario { name: stringify!($name), smc: $smc, run: $name }),*];
    };
}

scenarios! {
    // the five probes of issue 11
    linger0_reset: 1;
    write_after_peer_close: 1;
    nonblock_connect_accept_later: 1;
    asyncio_one_loop: 1;
    sendfile_null_offset_slow_reader: 1;
    // basics
    echo: 1;
    eof_after_close: 1;
    half_close: 1;
    read_zero_len: 1;
    write_zero_len: 1;
    eof_twice: 1;
    big_transfer: 1;
    full_duplex: 1;
    readv_writev: 1;
    sendmmsg_recvmmsg: 1;
    recvmmsg_waits_for_every_message: 1;
    recvmmsg_waitforone: 1;
    dup_then_close_original: 1;
    fork_child_keeps_closed_conn: 4;
    vfork_child_dup2_pipe_write: 1;
    unshare_files_thread_close: 1;
    close_range_unshare_thread_close: 1;
    peer_exits_with_bytes_unread: 1;
    peer_exits_nonblocking_calls_see_end: 1;
    peer_exited_then_epoll_wait_0: 1;
    raw_syscalls_accept_fcntl_poll_shutdown: 1;
    io_uring_after_connection: 1;
    dup_mid_handshake_both_used: 1;
    dup_mid_handshake_number_reused: 2;
    // epoll
    epoll_lt: 1;
    epoll_et: 1;
    epoll_oneshot_mod: 1;
    epoll_exclusive: 1;
    epoll_exclusive_mid_handshake: 1;
    epoll_exclusive_decided_during_ctl: 1;
    epoll_add_while_other_thread_waits: 1;
    epoll_two_sets: 1;
    epoll_peer_close_mask: 1;
    epoll_peer_shutdown_wr_mask: 1;
    epoll_maxevents_mixed: 1;
    epoll_nested: 1;
    epoll_nested_lt_data_left: 1;
    epoll_nested_wakes_on_write: 1;
    poll_nested_epoll: 1;
    epoll_pwait2: 1;
    epoll_pwait2_timeout: 1;
    epoll_et_peer_closed_quiet: 1;
    epoll_huge_maxevents: 1;
    epoll_mod_out: 1;
    epoll_del: 1;
    epoll_out_after_full: 1;
    epoll_close_while_dup_open: 1;
    epoll_close_while_dup_open_then_dup_closed: 1;
    epoll_et_close_while_dup_open: 1;
    epoll_et_out_parked_then_full: 1;
    epoll_shutdown_wakes_waiter: 1;
    epoll_shutdown_dup_wakes_waiter: 1;
    epoll_threads_lt_both_woken: 1;
    epoll_fork_shared_set: 1;
    epoll_peer_exit_after_write: 1;
    epoll_fork_child_closes_conn: 1;
    // poll / select
    poll_out_initial: 1;
    poll_peer_close: 1;
    poll_shutdown_rdwr: 1;
    ppoll_sigmask: 1;
    pselect_sigmask: 1;
    select_readable: 1;
    // close and errors
    linger0_so_error: 1;
    close_unread_resets_peer: 1;
    shut_rd_queued_data: 1;
    shutdown_wr_then_write: 1;
    write_after_peer_close_nosignal: 1;
    close_while_recv_blocked: 1;
    close_while_recv_blocked_peer_writes_on: 1;
    dup2_over_recv_blocked: 1;
    socket_reuses_number_while_recv_blocked: 2;
    dup2_over_recv_in_handshake: 1;
    socket_reuses_number_while_recv_in_handshake: 2;
    dup2_over_recv_after_clc_timeout: 0;
    socket_reuses_number_while_recv_after_clc_timeout: 0;
    dup2_over_sendfile_in_handshake: 1;
    dup2_over_recvmmsg_in_handshake: 1;
    read_after_write_after_peer_close: 1;
    close_while_send_blocked: 1;
    close_while_sendfile_blocked: 1;
    close_while_poll_blocked: 1;
    double_close: 1;
    // connect
    connect_refused: 0;
    connect_refused_nonblock: 0;
    setfl_between_connect_and_use: 1;
    connect_timeout_then_blocking: 1;
    nonblock_connect_write_at_once: 1;
    nonblock_write_server_not_accepting: 0;
    nonblock_first_write_after_pollout: 1;
    nonblock_first_write_after_epollout: 1;
    connect_own_listener_one_thread: 1;
    connect_own_listener_idle_thread: 1;
    own_listener_close_before_use_one_thread: 1;
    epoll_connect_quiet_server: 1;
    epoll_connect_lt_in_out: 1;
    epoll_wait0_reports_each_entry_once: 500;
    poll_connect_quiet_server: 1;
    accept_nonblock_empty: 0;
    blocking_accept_silent_client: 1;
    own_client_server_speaks_first: 1;
    // The client is idle past its server's wait for the Confirm: the server withdraws its
    // Accept and both ends continue on TCP (no SMC-D connection, nothing lost).
    idle_client_server_speaks_first: 0;
    epoll_server_greets_idle_client: 0;
    // fd passing
    scm_rights_client_mid_handshake: 0;
    scm_rights_accepted_mid_handshake: 1;
    spawn_accepted_mid_handshake: 1;
    // data calls
    msg_peek: 1;
    msg_waitall: 1;
    msg_trunc: 1;
    msg_dontwait: 1;
    fionread: 1;
    siocoutq_after_read: 1;
    siocoutq_unread: 1;
    so_rcvtimeo: 1;
    so_sndtimeo: 1;
    so_rcvlowat: 1;
    so_rcvlowat_blocking_read: 1;
    so_rcvlowat_epoll: 1;
    so_rcvlowat_lowered_wakes_poll: 1;
    so_rcvlowat_lowered_wakes_epoll: 1;
    shutdown_rd_wakes_poll: 1;
    rcvtimeo_sa_restart_eintr: 1;
    so_error_after_reported_reset: 1;
    connect_unspec_disconnects: 1;
    connect_unspec_dup_epoll_reconnect: 1;
    write_to_peer_shut_rdwr: 1;
    peer_fin_then_reset: 2;
    fionbio: 1;
    read_chk_buflen: 1;
    recv_chk_buflen: 1;
    bad_pointer_read: 1;
    bad_pointer_write: 1;
    splice_pipe_to_socket_short: 1;
    splice_socket_into_a_nearly_full_pipe: 1;
    clients_of_a_server_that_accepts_late: 0;
    epoll_client_of_a_server_that_accepts_late: 0;
    sendfile_offset: 1;
    msg_oob: 1;
    oob_mark_mid_stream: 1;
    oob_recv_none_twice_peek: 1;
    oob_recv_while_skipping_late_clc: 0;
    oob_epoll_while_skipping_late_clc: 0;
    oob_poll_epoll_select: 1;
    oob_read_skips_unread_urgent: 1;
    oob_two_before_read: 1;
    oob_two_single_bytes_at_read_position: 1;
    oob_second_after_first_seen: 1;
    oob_chain_of_three: 1;
    oob_peek_stops_at_mark: 1;
    oob_inline: 1;
    oob_sigurg: 1;
    oob_sigurg_setown_ex: 1;
    // signal-driven I/O (O_ASYNC)
    sigio_on_data: 1;
    sigio_on_peer_shutdown: 1;
    sigio_on_peer_close: 1;
    sigio_fsetsig_siginfo: 1;
    sigio_fioasync: 1;
    sigio_set_before_connect: 1;
    sigio_on_write_space: 1;
    sigio_fsetsig_write_space: 1;
    sigio_not_while_read_waits_one_thread: 1;
    oob_sigurg_inline: 1;
    oob_sigurg_then_fdopen: 1;
    fdopen_stdio_server: 1;
    fdopen_after_the_peer_closed_with_bytes_unread: 1;
    dprintf_on_socket: 1;
    aio_write_to_blocked_reader: 1;
    aio_read_before_peer_writes: 1;
    lio_listio_mixed: 2;
    aio_suspend_two_server_ends: 2;
    aio_write_first_call: 1;
    aio_read_after_peer_shut_wr: 1;
    aio_write_to_epoll_server: 1;
    fdopen_both_ends_one_thread: 1;
    aio_write_both_ends_one_thread: 1;
    popen_handler_parent_closes_at_once: 1;
    msg_zerocopy_completion: 1;
    // signals
    eintr_without_restart: 1;
    sa_restart_restarts: 1;
    restart_per_handler: 1;
    sysv_signal_interrupts: 1;
    sysv_signal_handler_restored: 0;
    // sleeping for a signal or a child while a connection is open (the library serves these
    // calls then: it answers its peers' switches to TCP while the process sleeps)
    sigsuspend_with_a_connection: 1;
    pause_with_a_connection: 1;
    waitid_with_a_connection: 1;
    waitpid_nohang_with_a_connection: 1;
    signal_from_child_sigsuspend_with_a_connection: 1;
    // a signal handler that acts on the connection the interrupted send is writing to
    shutdown_from_a_handler_during_send: 5;
    close_from_a_handler_during_a_blocking_call: 6;
    // a blocking recv left by siglongjmp from a signal handler (old-style timeouts)
    longjmp_recv_then_close: 1;
    longjmp_recv_then_pingpong: 1;
    longjmp_recv_then_thread_ends: 1;
    // a handler that makes a blocking recv inside an interrupted one (nothing is left)
    signal_handler_recv_inside_recv: 2;
    signal_handler_recv_inside_recv_altstack: 2;
    // a forked child that closes every inherited descriptor, then connects
    fork_child_closes_all_then_connects: 1;
    // buffering
    write_before_read_both: 1;
    write_before_read_3mb: 1;
    // red-team round 9 (rt9x)
    zero_len_recv: 1;
    peek_waitall_partial: 1;
    msg_iovlen_over_max: 1;
    sendfile_splice_socket_edges: 1;
    preadv2_and_raw_syscalls: 1;
    tcp_inq_cmsg: 1;
    tcp_state_orderly_close: 2;
    tcp_state_after_reset: 3;
    tcp_info_byte_counts: 1;
    so_peek_off: 2;
    // random call sequences (random.rs), one seed each; last, so that the CLC timer each
    // scenario above gets (1, 5 or 20 ms by its position) stays what it was
    random_calls_1: 1;
    random_calls_2: 1;
    random_calls_3: 1;
    random_calls_4: 1;
    random_calls_5: 1;
    random_calls_6: 1;
    random_calls_7: 1;
    random_calls_8: 1;
    random_urgent_5: 1;
    random_urgent_6: 1;
    random_urgent_7: 1;
    random_urgent_8: 1;
    // seeds that found a difference by hand (smc-preload DESIGN.md, TCP semantics covered),
    // pinned; after the others, so that their CLC timers stay what they were
    random_calls_9: 1;
    random_calls_10: 1;
    random_urgent_9: 1;
    random_urgent_10: 1;
    random_urgent_11: 1;
    random_urgent_12: 1;
    random_calls_11: 1;
    random_calls_12: 1;
    random_urgent_13: 1;
    handler_closes_recv_after_clc_timeout: 0;
    nonblocking_write_before_own_listener_accepts: 0;
    close_with_ring_full_before_server_confirms: 3;
    dup2_dead_socketpair_over_recv_then_signal: 1;
    close_over_recv_then_signal: 1;
    signal_two_of_three_blocked_readers: 1;
    // red-team round 29: argument checks and corners of the vector, epoll and select calls
    writev_nothing_after_shutdown: 1;
    epoll_argument_checks: 1;
    select_and_poll_argument_checks: 1;
    select_above_fd_setsize: 1;
    low_pointers_are_efault: 1;
}

// ── probes ──────────────────────────────────────────────────────────────────────────────────

fn linger0_reset() {
    let (c, s) = pair();
    write_all(c, b"abc");
    read_n(s, 3);
    linger0(c);
    r("close(c) with SO_LINGER{1,0}", close(c) as isize);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    rd("read(s) again", s, 100);
    close(s);
}

fn write_after_peer_close() {
    count_sigpipe();
    let (c, s) = pair();
    close(s);
    pl("poll(c,IN|RDHUP)", c, libc::POLLIN | libc::POLLRDHUP, 5000);
    r("write(c) 1st", wr(c, b"hello"));
    // The peer answers the first write with a reset.
    pl("poll(c,IN) after 1st write", c, libc::POLLIN, 5000);
    r("write(c) 2nd", wr(c, b"hello"));
    log_sigpipes();
    close(c);
}

fn nonblock_connect_accept_later() {
    // One thread: a non-blocking connect must return at once although nobody accepts yet;
    // the program accepts afterwards (as an event loop would), then talks.
    let (l, port) = listener();
    let c = tcp_socket();
    connect_nonblocking("c", c, port);
    so_error("SO_ERROR(c)", c);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    write_all(c, b"ping");
    set_nonblock(c, false);
    rd("read(s)", s, 100);
    write_all(s, b"pong!");
    rd("read(c)", c, 100);
    close(c);
    close(s);
    close(l);
}

fn asyncio_one_loop() {
    use std::os::unix::process::CommandExt as _;
    const PY: &str = r#"
import asyncio
async def main():
    async def handle(r, w):
        d = await r.readexactly(5)
        w.write(d.upper() * 1000)
        await w.drain()
        w.close()
    srv = await asyncio.start_server(handle, '127.0.0.1', 0)
    port = srv.sockets[0].getsockname()[1]
    r, w = await asyncio.open_connection('127.0.0.1', port)
    w.write(b'hello')
    await w.drain()
    got = await r.read()
    print('client read', len(got), got[:10])
    w.close()
    srv.close()
    await srv.wait_closed()
try:
    asyncio.run(asyncio.wait_for(main(), 10))
    print('done')
except asyncio.TimeoutError:
    print('TIMEOUT')
"#;
    let err = std::process::Command::new("python3")
        .args(["-c", PY])
        .exec();
    log(format!("exec python3: {err}"));
}

fn sendfile_null_offset_slow_reader() {
    // Several times what the ring (8 MiB by default) and TCP (about 4 MiB here) hold.
    const N: usize = 32 << 20;
    let data: Vec<u8> = (0..N).map(|i| (i * 7 + i / 4093) as u8).collect();
    let path = format!("/tmp/smc-conform-{}.dat", std::process::id());
    std::fs::write(&path, &data).expect("write temp file");
    let cpath = std::ffi::CString::new(path.clone()).unwrap();
    // SAFETY: valid path.
    let f = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY) };
    let _ = std::fs::remove_file(&path);
    let (c, s) = pair();
    set_nonblock(c, true);
    let reader = std::thread::spawn(move || {
        // A slow reader: small reads.
        let mut got = Vec::with_capacity(N);
        let mut b = vec![0u8; 4096];
        loop {
            // SAFETY: valid buffer.
            let k = unsafe { libc::read(s, b.as_mut_ptr().cast(), b.len()) };
            if k <= 0 {
                break;
            }
            got.extend_from_slice(&b[..k as usize]);
        }
        close(s);
        got
    });
    let mut sent = 0usize;
    let mut eagain = false;
    while sent < N {
        // SAFETY: NULL offset: the file's own offset advances.
        let k = unsafe { libc::sendfile(c, f, std::ptr::null_mut(), N - sent) };
        if k < 0 && errno() == libc::EAGAIN {
            eagain = true;
            poll_raw(c, libc::POLLOUT, 5000);
            continue;
        }
        if k <= 0 {
            r("sendfile", k);
            break;
        }
        sent += k as usize;
    }
    // SAFETY: plain lseek.
    let off = unsafe { libc::lseek(f, 0, libc::SEEK_CUR) };
    log(format!(
        "sent {sent}, file offset {off}, saw EAGAIN {eagain}"
    ));
    close(c);
    let got = reader.join().unwrap();
    log(format!(
        "reader got {} [{}] want [{}]",
        got.len(),
        digest(&got),
        digest(&data)
    ));
    close(f);
}

// ── basics ──────────────────────────────────────────────────────────────────────────────────

fn random_calls_1() {
    super::random::run(1)
}
fn random_calls_2() {
    super::random::run(2)
}
fn random_calls_3() {
    super::random::run(3)
}
fn random_calls_4() {
    super::random::run(4)
}
fn random_calls_5() {
    super::random::run(5)
}
fn random_calls_6() {
    super::random::run(6)
}
fn random_calls_7() {
    super::random::run(7)
}
fn random_calls_8() {
    super::random::run(8)
}
fn random_urgent_5() {
    super::random::run_urgent(5)
}
fn random_urgent_6() {
    super::random::run_urgent(6)
}
fn random_urgent_7() {
    super::random::run_urgent(7)
}
fn random_urgent_8() {
    super::random::run_urgent(8)
}
/// Seed 303: the peer's write reset the stream of an end that shut both ways; the writer's
/// close came after (a FIN before the reset to the reader, which said 0 for ECONNRESET).
fn random_calls_9() {
    super::random::run(303)
}
/// Seed 328: the same after one `shutdown(SHUT_RDWR)`, read with `MSG_PEEK`.
fn random_calls_10() {
    super::random::run(328)
}
/// Seed 83: a close after both FINs with an urgent doorbell of the peer still queued (a reset
/// in place of the silent close: the peer's `SO_ERROR` said ECONNRESET).
fn random_urgent_9() {
    super::random::run_urgent(83)
}
/// Seed 351: `SO_OOBINLINE` turned off after a second urgent byte came (TCP had kept the first
/// in the stream, inline when it arrived).
fn random_urgent_10() {
    super::random::run_urgent(351)
}
/// Seed 38: an urgent byte written to a peer that shut both ways (TCP takes its mark before
/// the reset: `POLLPRI`, `SIOCATMARK`).
fn random_urgent_11() {
    super::random::run_urgent(38)
}
/// Seed 360: the same with an older mark still ahead of the reader (the new mark makes the
/// older urgent byte an ordinary one).
fn random_urgent_12() {
    super::random::run_urgent(360)
}
/// Seed 2356: a `shutdown(SHUT_WR)` (ENOTCONN) of the end whose write reset the peer that shut
/// both ways (TCP in CLOSE sends no FIN; the peer's read said 0 for ECONNRESET).
fn random_calls_11() {
    super::random::run(2356)
}
/// Seed 3181: a `shutdown(SHUT_WR)` after the peer's FIN and then its reset (CLOSE_WAIT: the
/// reset left EPIPE, which the next write reports; it said ECONNRESET).
fn random_calls_12() {
    super::random::run(3181)
}
/// Seed 978: three urgent bytes, the oldest at the read position, `SIOCATMARK` between the
/// second and the third (TCP dropped the oldest when the second came; it stayed in the stream).
fn random_urgent_13() {
    super::random::run_urgent(978)
}

fn echo() {
    let (c, s) = pair();
    r("write(c)", wr(c, b"hello"));
    rd("read(s)", s, 100);
    r("write(s)", wr(s, b"world!"));
    rd("read(c)", c, 100);
    close(c);
    close(s);
}

fn eof_after_close() {
    let (c, s) = pair();
    write_all(c, b"bye");
    r("close(c)", close(c) as isize);
    rd("read(s)", s, 100);
    rd("read(s)", s, 100);
    close(s);
}

fn half_close() {
    let (c, s) = pair();
    write_all(c, b"request");
    r(
        "shutdown(c,WR)",
        // SAFETY: `c` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    rd("read(s)", s, 100);
    rd("read(s) eof", s, 100);
    r("write(s)", wr(s, b"response"));
    rd("read(c)", c, 100);
    r("close(s)", close(s) as isize);
    rd("read(c) eof", c, 100);
    close(c);
}

fn read_zero_len() {
    let (c, s) = pair();
    // SAFETY: a zero-length read into a live 1-byte buffer.
    r("read(s,0)", unsafe {
        libc::read(s, [0u8; 1].as_mut_ptr().cast(), 0)
    });
    write_all(c, b"x");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    // SAFETY: a zero-length read into a live 1-byte buffer.
    r("read(s,0) with data", unsafe {
        libc::read(s, [0u8; 1].as_mut_ptr().cast(), 0)
    });
    rd("read(s)", s, 10);
    close(c);
    close(s);
}

fn write_zero_len() {
    let (c, s) = pair();
    r("write(c,0)", wr(c, b""));
    // SAFETY: a zero-length send from a static (empty) buffer.
    r("send(c,0)", unsafe {
        libc::send(c, b"".as_ptr().cast(), 0, 0)
    });
    set_nonblock(s, true);
    rd("read(s) nothing", s, 10);
    close(c);
    close(s);
}

fn eof_twice() {
    let (c, s) = pair();
    eof_twice_after_close(c, s);
}

/// `c` is closed; the other end `s` reads EOF twice, then polls. Closes `s`.
fn eof_twice_after_close(c: c_int, s: c_int) {
    close(c);
    rd("read(s)", s, 10);
    rd("read(s)", s, 10);
    pl(
        "poll(s,IN|OUT|RDHUP)",
        s,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    );
    close(s);
}

fn big_transfer() {
    let (c, s) = pair();
    let data: Vec<u8> = (0..(16usize << 20)).map(|i| (i ^ (i >> 9)) as u8).collect();
    let want = digest(&data);
    let w = std::thread::spawn(move || {
        write_all(c, &data);
        close(c);
    });
    let got = read_n(s, 32 << 20);
    w.join().unwrap();
    log(format!(
        "got {} [{}] want [{want}]",
        got.len(),
        digest(&got)
    ));
    close(s);
}

fn full_duplex() {
    let (c, s) = pair();
    let mk = |seed: usize| -> Vec<u8> { (0..(4usize << 20)).map(|i| (i * seed) as u8).collect() };
    let (a, b) = (mk(3), mk(5));
    let (da, db) = (digest(&a), digest(&b));
    let t1 = std::thread::spawn(move || write_all(c, &a));
    let t2 = std::thread::spawn(move || write_all(s, &b));
    let t3 = std::thread::spawn(move || read_n(s, 4 << 20));
    let gc = read_n(c, 4 << 20);
    t1.join().unwrap();
    t2.join().unwrap();
    let gs = t3.join().unwrap();
    log(format!("c got [{}] want [{db}]", digest(&gc)));
    log(format!("s got [{}] want [{da}]", digest(&gs)));
    close(c);
    close(s);
}

fn readv_writev() {
    let (c, s) = pair();
    let (a, b) = (b"abc".to_vec(), b"defgh".to_vec());
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut _,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        },
    ];
    // SAFETY: `iov` holds 2 iovecs over live buffers, the count passed.
    r("writev(c)", unsafe { libc::writev(c, iov.as_ptr(), 2) });
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let (mut x, mut y) = ([0u8; 2], [0u8; 10]);
    let iov2 = [
        libc::iovec {
            iov_base: x.as_mut_ptr().cast(),
            iov_len: 2,
        },
        libc::iovec {
            iov_base: y.as_mut_ptr().cast(),
            iov_len: 10,
        },
    ];
    // SAFETY: `iov2` holds 2 iovecs over live, writable buffers of the lengths given.
    let n = r("readv(s)", unsafe { libc::readv(s, iov2.as_ptr(), 2) });
    log(format!(
        "parts [{}] [{}]",
        digest(&x),
        digest(&y[..(n.max(2) - 2) as usize])
    ));
    close(c);
    close(s);
}

/// One iovec over each 4-byte buffer of `rb`.
fn iovecs_of(rb: &mut [[u8; 4]]) -> Vec<libc::iovec> {
    rb.iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect()
}

/// One mmsghdr per iovec of `iovs` (which must outlive the headers' use).
fn mmsg_headers(iovs: &mut [libc::iovec]) -> Vec<libc::mmsghdr> {
    iovs.iter_mut()
        .map(|io| {
            // SAFETY: zeroed mmsghdr is valid.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = io;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect()
}

fn sendmmsg_recvmmsg() {
    let (c, s) = pair();
    let bufs = [b"one".to_vec(), b"two2".to_vec(), b"three".to_vec()];
    let mut iovs: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        })
        .collect();
    let mut msgs = mmsg_headers(&mut iovs);
    r(
        "sendmmsg(c)",
        // SAFETY: `msgs` holds 3 mmsghdrs whose iovecs point into `bufs`, alive for the call.
        unsafe { libc::sendmmsg(c, msgs.as_mut_ptr(), 3, 0) } as isize,
    );
    log(format!(
        "lens {:?}",
        msgs.iter().map(|m| m.msg_len).collect::<Vec<_>>()
    ));
    let got = read_n(s, 12);
    log(format!("read(s) [{}]", digest(&got)));
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let mut rb = [[0u8; 4]; 2];
    let mut riov = iovecs_of(&mut rb);
    let mut rm = mmsg_headers(&mut riov);
    r(
        "recvmmsg(s)",
        // SAFETY: `rm` holds 2 mmsghdrs whose iovecs point into the writable `rb`; no timeout.
        unsafe { libc::recvmmsg(s, rm.as_mut_ptr(), 2, 0, std::ptr::null_mut()) } as isize,
    );
    log(format!(
        "lens {:?} [{}]",
        rm.iter().map(|m| m.msg_len).collect::<Vec<_>>(),
        digest(&rb.concat())
    ));
    close(c);
    close(s);
}

fn dup_then_close_original() {
    let (c, s) = pair();
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(s) };
    r("close(s)", close(s) as isize);
    write_all(c, b"via dup");
    rd("read(dup)", d, 100);
    r("write(dup)", wr(d, b"back"));
    rd("read(c)", c, 100);
    close(d);
    rd("read(c) eof", c, 100);
    close(c);
}

/// A server thread for the dup scenarios: accepts one connection, writes `first`, waits for
/// 4 bytes, writes `second`, reads until EOF. Nothing is logged here (thread order).
/// Connections [`dup_server`] threads accepted (this process runs one scenario).
static DUP_ACCEPTED: AtomicU32 = AtomicU32::new(0);

fn dup_server(
    l: c_int,
    first: &'static [u8],
    second: &'static [u8],
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let s = accept_fd(l);
        assert!(s >= 0, "accept: {}", std::io::Error::last_os_error());
        DUP_ACCEPTED.fetch_add(1, Ordering::AcqRel);
        write_all(s, first);
        let _ = read_n(s, 4);
        write_all(s, second);
        while !read_n(s, 1).is_empty() {}
        close(s);
    })
}

fn dup_mid_handshake_both_used() {
    // A non-blocking connect is dup'd while its handshake may still be under way; both fds
    // stay open: the first reply is read through the original, the rest through the copy.
    let (l, port) = listener();
    let srv = dup_server(l, b"first", b"second");
    let c = tcp_socket();
    set_nonblock(c, true);
    let _ = connect_to(c, port);
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(c) };
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    rd("read(c)", c, 100);
    write_all(d, b"back");
    pl("poll(d,IN)", d, libc::POLLIN, 5000);
    rd("read(d)", d, 100);
    close(c);
    close(d);
    srv.join().expect("server thread");
    close(l);
}

/// A new TCP socket at the number `n`, just freed. Another thread may take the lowest free
/// number for a moment (the library's handshake of a server thread receives a DMB's fd from
/// the daemon, as glibc's resolver opens a file): sockets that got another number are held
/// until one gets `n` (bounded), then closed. One try on TCP.
fn socket_at_number(n: c_int) -> c_int {
    let mut held = Vec::new();
    let t = Instant::now();
    let b = loop {
        let b = tcp_socket();
        if b == n || t.elapsed() > Duration::from_secs(5) {
            break b;
        }
        held.push(b);
        std::thread::sleep(Duration::from_millis(1));
    };
    for h in held {
        close(h);
    }
    b
}

/// What a `vfork` child does before its exec (a `clone(CLONE_VM | CLONE_VFORK)` child on its
/// own stack, as `posix_spawn` makes it): makes the connection's number name the write end of
/// a pipe and writes there. Its table is its own: the bytes go into the pipe, never into its
/// parent's connection, which goes on.
fn vfork_child_dup2_pipe_write() {
    let (c, s) = pair_settled();
    let mut pp = [0 as c_int; 2];
    // SAFETY: valid out array.
    assert_eq!(unsafe { libc::pipe(pp.as_mut_ptr()) }, 0);
    struct Args {
        c: c_int,
        w: c_int,
    }
    extern "C" fn child(a: *mut libc::c_void) -> c_int {
        // SAFETY: `a` points to the parent's `Args`, alive: the parent waits (CLONE_VFORK).
        let a = unsafe { &*(a as *const Args) };
        // SAFETY: plain system calls on numbers, then _exit: nothing else runs in the child.
        unsafe {
            libc::dup2(a.w, a.c);
            let ok = libc::write(a.c, b"PIPEDATA".as_ptr().cast(), 8) == 8;
            libc::_exit(if ok { 0 } else { 3 })
        }
    }
    let mut args = Args { c, w: pp[1] };
    let mut stack = vec![0u8; 256 << 10];
    // SAFETY: the top of our own stack buffer (16-byte aligned below), a child function that
    // only makes system calls and exits, and its argument, alive until the child is gone.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(stack.len()) as usize & !15;
        libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut args as *mut Args).cast(),
        )
    };
    assert!(pid > 0, "clone: {}", std::io::Error::last_os_error());
    let mut st = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!("child exit {}", libc::WEXITSTATUS(st)));
    close(pp[1]);
    rd("read(pipe)", pp[0], 64);
    pl("poll(s,IN) nothing from the child", s, libc::POLLIN, 200);
    r("send(c) after the child", wr(c, b"conn"));
    rd("read(s)", s, 64);
    close(c);
    close(s);
    close(pp[0]);
}

/// A thread that takes a descriptor table of its own, closes the connection's number there
/// and opens `/dev/null` at it: the process's connection is untouched and goes on.
fn unshare_files_thread_close() {
    thread_own_table_close(|c| {
        // SAFETY: plain system calls.
        unsafe {
            if libc::unshare(libc::CLONE_FILES) != 0 {
                return -1;
            }
            libc::close(c)
        }
    });
}

/// [`unshare_files_thread_close`] through `close_range(c, c, CLOSE_RANGE_UNSHARE)`.
fn close_range_unshare_thread_close() {
    thread_own_table_close(|c| {
        // SAFETY: plain system call.
        unsafe { libc::close_range(c as u32, c as u32, libc::CLOSE_RANGE_UNSHARE as c_int) }
    });
}

fn thread_own_table_close(close_own: fn(c_int) -> c_int) {
    let (c, s) = pair_settled();
    let h = std::thread::spawn(move || {
        let r = close_own(c);
        // SAFETY: a plain open of /dev/null.
        let f = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
        // At the number itself, whatever the lowest free one was.
        let d = if f == c {
            c
        } else {
            // SAFETY: plain system call.
            unsafe { libc::dup2(f, c) }
        };
        let w = wr(c, b"NULLDATA");
        (r, d == c, w)
    });
    let (r0, at, w) = h.join().unwrap();
    log(format!(
        "thread: close {r0}, /dev/null at the number {at}, write {w}"
    ));
    pl("poll(s,IN) nothing", s, libc::POLLIN, 200);
    r("send(c) still", wr(c, b"still"));
    rd("read(s)", s, 64);
    r("send(s) back", wr(s, b"back"));
    rd("read(c)", c, 64);
    close(c);
    close(s);
}

fn dup_mid_handshake_number_reused() {
    // A non-blocking connect is moved to another number (dup, close) while its handshake may
    // still be under way; a second connection gets the old number. Neither stream may lose a
    // byte to the other's handshake.
    let (l, port) = listener();
    let sa = dup_server(l, b"hello", b"world");
    let sb = dup_server(l, b"hello", b"world");
    let a = tcp_socket();
    set_nonblock(a, true);
    let _ = connect_to(a, port);
    // The server has its socket for `a` before `a`'s number is freed: its accept takes no
    // number meanwhile, so `b` gets `a`'s (the lowest free) on TCP as under the library.
    let t = Instant::now();
    while DUP_ACCEPTED.load(Ordering::Acquire) < 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(a) };
    close(a);
    let b = socket_at_number(a);
    // Nearly always true; over TCP it was false once in a few hundred loaded runs (the number
    // stayed taken for the whole 5 s): said on stderr, out of the compared trace, since the
    // rest of the scenario holds either way.
    eprintln!("b took a's number = {}", a == b);
    r("connect(b)", connect_to(b, port) as isize);
    pl("poll(b,IN)", b, libc::POLLIN, 5000);
    rd("read(b)", b, 100);
    pl("poll(d,IN)", d, libc::POLLIN, 5000);
    rd("read(d)", d, 100);
    write_all(b, b"back");
    write_all(d, b"back");
    set_nonblock(d, false);
    rd("read(b) 2", b, 100);
    rd("read(d) 2", d, 100);
    close(b);
    close(d);
    sa.join().expect("server thread");
    sb.join().expect("server thread");
    close(l);
}

// ── epoll ───────────────────────────────────────────────────────────────────────────────────

const CS: &[&str] = &["c", "s", "p0", "p1", "p2", "ep"];

/// The kernel's io_uring ABI, as much as [`io_uring_after_connection`] uses.
mod uring {
    #[repr(C)]
    #[derive(Default)]
    pub struct Params {
        pub sq_entries: u32,
        pub cq_entries: u32,
        pub flags: u32,
        pub sq_thread_cpu: u32,
        pub sq_thread_idle: u32,
        pub features: u32,
        pub wq_fd: u32,
        pub resv: [u32; 3],
        pub sq_off: [u32; 10],
        pub cq_off: [u32; 10],
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    pub struct Sqe {
        pub opcode: u8,
        pub flags: u8,
        pub ioprio: u16,
        pub fd: i32,
        pub off: u64,
        pub addr: u64,
        pub len: u32,
        pub op_flags: u32,
        pub user_data: u64,
        pub pad: [u64; 3],
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Cqe {
        pub user_data: u64,
        pub res: i32,
        pub flags: u32,
    }
    pub const OP_EPOLL_CTL: u8 = 29;
    pub const OP_SEND: u8 = 26;
    pub const OP_RECV: u8 = 27;
    const OFF_CQ_RING: i64 = 0x800_0000;
    const OFF_SQES: i64 = 0x1000_0000;

    pub struct Ring {
        fd: i32,
        sq: *mut u8,
        cq: *mut u8,
        sqes: *mut Sqe,
        p: Params,
    }

    impl Ring {
        /// A ring of 8 entries, set up through `syscall(2)` as libuv does.
        pub fn new() -> Option<Ring> {
            let mut p = Params::default();
            // SAFETY: valid params struct.
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 8, &mut p as *mut Params) };
            if fd < 0 {
                return None;
            }
            let fd = fd as i32;
            let map = |len: usize, off: i64| {
                // SAFETY: a shared mapping of the ring's own fd at its documented offset.
                unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED | libc::MAP_POPULATE,
                        fd,
                        off,
                    )
                }
                .cast::<u8>()
            };
            let sq = map(p.sq_off[6] as usize + p.sq_entries as usize * 4, 0);
            let cq = map(
                p.cq_off[5] as usize + p.cq_entries as usize * std::mem::size_of::<Cqe>(),
                OFF_CQ_RING,
            );
            let sqes = map(p.sq_entries as usize * std::mem::size_of::<Sqe>(), OFF_SQES).cast();
            Some(Ring {
                fd,
                sq,
                cq,
                sqes,
                p,
            })
        }

        fn word(base: *mut u8, off: u32) -> &'static std::sync::atomic::AtomicU32 {
            // SAFETY: `off` is a kernel-given offset of a u32 inside the mapped ring.
            unsafe { &*(base.add(off as usize) as *const std::sync::atomic::AtomicU32) }
        }

        /// Submits `e` and waits (up to `ms`) for its completion: its result, or None.
        pub fn run(&mut self, e: Sqe, ms: u64) -> Option<i32> {
            use std::sync::atomic::Ordering;
            let tail = Self::word(self.sq, self.p.sq_off[1]);
            let mask = Self::word(self.sq, self.p.sq_off[2]).load(Ordering::Relaxed);
            let t = tail.load(Ordering::Relaxed);
            let i = t & mask;
            // SAFETY: `i` is below the ring's entries (masked); both arrays are mapped.
            unsafe {
                *self.sqes.add(i as usize) = e;
                *(self.sq.add(self.p.sq_off[6] as usize) as *mut u32).add(i as usize) = i;
            }
            tail.store(t.wrapping_add(1), Ordering::Release);
            // SAFETY: the ring's fd, one submission, no wait.
            unsafe { libc::syscall(libc::SYS_io_uring_enter, self.fd, 1, 0, 0, 0, 0) };
            let head = Self::word(self.cq, self.p.cq_off[0]);
            let ctail = Self::word(self.cq, self.p.cq_off[1]);
            let cmask = Self::word(self.cq, self.p.cq_off[2]).load(Ordering::Relaxed);
            let start = std::time::Instant::now();
            loop {
                let h = head.load(Ordering::Relaxed);
                if ctail.load(Ordering::Acquire) != h {
                    // SAFETY: the entry at the head, below the ring's entries (masked).
                    let c = unsafe {
                        *(self.cq.add(self.p.cq_off[5] as usize) as *const Cqe)
                            .add((h & cmask) as usize)
                    };
                    head.store(h.wrapping_add(1), Ordering::Release);
                    return Some(c.res);
                }
                if start.elapsed() > std::time::Duration::from_millis(ms) {
                    return None;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    impl Drop for Ring {
        fn drop(&mut self) {
            // SAFETY: the ring's own fd (its mappings go with the process).
            unsafe { libc::close(self.fd) };
        }
    }
}

/// io_uring set up (through `syscall(2)`, as libuv does) after a connection exists; then
/// `IORING_OP_RECV`, `IORING_OP_SEND` and `IORING_OP_EPOLL_CTL` on it. The ring's submissions
/// bypass any interposition: the connection reads and writes as TCP for them (before, the
/// receive never completed with the bytes in the ring and the epoll set never woke).
fn io_uring_after_connection() {
    let (c, s) = pair_settled();
    let Some(mut ring) = uring::Ring::new() else {
        log("io_uring_setup failed");
        close(c);
        close(s);
        return;
    };
    write_all(s, b"hello");
    let mut buf = [0u8; 64];
    let res = ring.run(
        uring::Sqe {
            opcode: uring::OP_RECV,
            fd: c,
            addr: buf.as_mut_ptr() as u64,
            len: 64,
            ..Default::default()
        },
        3000,
    );
    log(format!(
        "IORING_OP_RECV = {res:?} [{}]",
        digest(&buf[..res.unwrap_or(0).max(0) as usize])
    ));
    let res = ring.run(
        uring::Sqe {
            opcode: uring::OP_SEND,
            fd: c,
            addr: b"world".as_ptr() as u64,
            len: 5,
            ..Default::default()
        },
        3000,
    );
    log(format!("IORING_OP_SEND = {res:?}"));
    rd("read(s)", s, 64);
    // SAFETY: plain system call.
    let ep = unsafe { libc::epoll_create1(0) };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    let res = ring.run(
        uring::Sqe {
            opcode: uring::OP_EPOLL_CTL,
            fd: ep,
            off: c as u64,
            len: libc::EPOLL_CTL_ADD as u32,
            addr: &mut ev as *mut libc::epoll_event as u64,
            ..Default::default()
        },
        3000,
    );
    log(format!("IORING_OP_EPOLL_CTL(ADD c) = {res:?}"));
    write_all(s, b"again");
    ep_wait("epoll_wait", ep, 4, 2000, &names(CS));
    rd("read(c)", c, 64);
    drop(ring);
    close(ep);
    close(c);
    close(s);
}

/// A program (or runtime) that makes its socket calls through `syscall(2)`, past libc's
/// wrappers: `accept4`, `fcntl(F_SETFL, O_NONBLOCK)`, `poll`, `epoll_ctl` + `epoll_wait` and
/// `shutdown` behave as they do over TCP (the accepted socket never shows a CLC byte, the
/// non-blocking read does not wait, the shutdown ends the stream).
fn raw_syscalls_accept_fcntl_poll_shutdown() {
    let (l, port) = listener();
    // The accept waits in a thread, as in `pair` (a blocking connect to a listener of this
    // process waits for its handshake within the call).
    let h = std::thread::spawn(move || {
        // SAFETY: the listener and null address pointers (accept4(2)).
        unsafe {
            libc::syscall(
                libc::SYS_accept4,
                l,
                std::ptr::null_mut::<libc::sockaddr>(),
                std::ptr::null_mut::<libc::socklen_t>(),
                0,
            )
        }
    });
    let c = tcp_socket();
    r("connect(c)", connect_to(c, port) as isize);
    let s = h.join().unwrap() as c_int;
    log(format!("accept4 (syscall) ok = {}", s >= 0));
    write_all(c, b"hello");
    rd("read(s)", s, 64);
    // SAFETY: integer arguments only.
    let fl = unsafe { libc::syscall(libc::SYS_fcntl, s, libc::F_GETFL) } as c_int;
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_fcntl, s, libc::F_SETFL, fl | libc::O_NONBLOCK) };
    r("fcntl(s, O_NONBLOCK) (syscall)", rc as isize);
    recv_l("recv(s) nothing yet", s, 16, 0);
    write_all(c, b"more");
    let mut p = libc::pollfd {
        fd: s,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    let n = unsafe { libc::syscall(libc::SYS_poll, &mut p as *mut libc::pollfd, 1, 2000) };
    log(format!(
        "poll(s) (syscall) = {n} {}",
        mask_names(p.revents as u16 as u32)
    ));
    rd("read(s)", s, 64);
    // SAFETY: plain system call.
    let ep = unsafe { libc::epoll_create1(0) };
    let mut e = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 1,
    };
    // SAFETY: a valid event.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_epoll_ctl,
            ep,
            libc::EPOLL_CTL_ADD,
            s,
            &mut e as *mut libc::epoll_event,
        )
    };
    r("epoll_ctl(ADD s) (syscall)", rc as isize);
    write_all(c, b"again");
    ep_wait("epoll_wait", ep, 4, 2000, &names(CS));
    rd("read(s)", s, 64);
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_shutdown, c, libc::SHUT_WR) };
    r("shutdown(c, WR) (syscall)", rc as isize);
    pl("poll(s,IN)", s, libc::POLLIN, 2000);
    rd("read(s) the end", s, 64);
    // SAFETY: plain send with MSG_NOSIGNAL.
    let k = unsafe { libc::send(c, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    r("send(c) after its shutdown", k as isize);
    close(ep);
    close(c);
    close(s);
    close(l);
}

/// Forks a child that holds `keep` alone (the parent's copy is closed) and runs `then`, then
/// `_exit`s without closing it: the kernel closes the socket, as for a crash or a kill.
/// Returns once the child is reaped (its socket's end is on the wire by then: loopback
/// delivers it in the exiting task; 50 ms more for a loaded machine).
fn child_ends_without_close(keep: c_int, drop_fd: c_int, then: fn(c_int)) {
    // SAFETY: the child closes one number, makes plain calls on another and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(drop_fd);
        then(keep);
        // SAFETY: plain exit without destructors or closes (fork child).
        unsafe { libc::_exit(0) };
    }
    close(keep);
    let mut st = 0;
    // SAFETY: valid out pointer.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    std::thread::sleep(Duration::from_millis(50));
}

/// The process holding one end reads 1 of 100 bytes and exits without closing: TCP resets
/// the connection (the closing end left bytes unread), so the peer's read says `ECONNRESET`
/// and its writes `EPIPE`, never a clean end of a response cut short.
fn peer_exits_with_bytes_unread() {
    let (c, s) = pair_settled();
    write_all(s, &[7u8; 100]);
    child_ends_without_close(c, s, |c| {
        read_n(c, 1);
    });
    recv_l("recv(s) after the peer's end", s, 16, 0);
    r("send(s)", wr(s, b"x"));
    r("send(s) again", wr(s, b"x"));
    close(s);
}

/// The process holding one end exits without closing; the other end only makes calls that do
/// not wait: a non-blocking read, a zero-timeout poll, then again. TCP says the end at once
/// (0, `POLLIN|POLLRDHUP`), never `EAGAIN` for ever.
fn peer_exits_nonblocking_calls_see_end() {
    let (c, s) = pair_settled();
    child_ends_without_close(c, s, |_| {});
    recv_l("recv(s, DONTWAIT)", s, 16, libc::MSG_DONTWAIT);
    pl("poll(s,IN|RDHUP,0)", s, libc::POLLIN | libc::POLLRDHUP, 0);
    recv_l("recv(s, DONTWAIT) again", s, 16, libc::MSG_DONTWAIT);
    r("send(s)", wr(s, b"x"));
    close(s);
}

/// The process holding one end exits without closing; the other end is then added to a new
/// epoll set and waited for with timeout 0: `EPOLLIN|EPOLLRDHUP` at once, as on TCP.
fn peer_exited_then_epoll_wait_0() {
    let (c, s) = pair_settled();
    child_ends_without_close(c, s, |_| {});
    // SAFETY: plain system call.
    let ep = unsafe { libc::epoll_create1(0) };
    let mut e = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: 1,
    };
    // SAFETY: valid event.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s, &mut e) };
    ep_wait("epoll_wait(0)", ep, 4, 0, &names(CS));
    close(ep);
    close(s);
}

/// A forked child keeps serving a connection whose fd the parent closed, while the parent makes
/// and closes other connections meanwhile (their local state must not take the child's).
fn fork_child_keeps_closed_conn() {
    let (c, s) = pair();
    let (rp, wp) = pipe();
    // SAFETY: the child only waits for the go, echoes once on `s` and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(c);
        close(wp);
        let mut b = [0u8; 1];
        // SAFETY: valid buffer.
        unsafe { libc::read(rp, b.as_mut_ptr().cast(), 1) };
        let got = read_n(s, 5);
        write_all(s, &got);
        close(s);
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(rp);
    r("close(s) in the parent", close(s) as isize);
    for i in 0..3 {
        let (c2, s2) = pair();
        write_all(c2, b"other");
        log(format!(
            "other connection {i}: {}",
            read_n(s2, 5) == b"other"
        ));
        close(c2);
        close(s2);
    }
    write_all(wp, b"g");
    close(wp);
    write_all(c, b"hello");
    let echo = read_n(c, 5);
    log(format!(
        "echo from the child: {:?}",
        String::from_utf8_lossy(&echo)
    ));
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!("child exit {}", libc::WEXITSTATUS(st)));
    close(c);
}

fn epoll_lt() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD s IN)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_wait("wait(0) empty", ep, 8, 0, &names(CS));
    write_all(c, b"0123456789");
    ep_wait("wait", ep, 8, 5000, &names(CS));
    ep_wait("wait again (LT)", ep, 8, 0, &names(CS));
    rd("read(s,4)", s, 4);
    ep_wait("wait after partial read", ep, 8, 0, &names(CS));
    rd("read(s)", s, 100);
    ep_wait("wait drained", ep, 8, 0, &names(CS));
    close(ep);
    close(c);
    close(s);
}

fn epoll_et() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD s IN|ET)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLET) as u32,
        1,
    );
    write_all(c, b"0123456789");
    ep_wait("wait", ep, 8, 5000, &names(CS));
    ep_wait("wait again (ET, no new data)", ep, 8, 0, &names(CS));
    write_all(c, b"more");
    ep_wait("wait after more data", ep, 8, 5000, &names(CS));
    rd("read(s)", s, 100);
    ep_wait("wait drained", ep, 8, 0, &names(CS));
    close(c);
    ep_wait("wait after peer close", ep, 8, 5000, &names(CS));
    close(ep);
    close(s);
}

fn epoll_oneshot_mod() {
    let (c, s) = pair();
    let ep = ep_create();
    let ev = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
    ep_ctl(
        "epoll_ctl(ADD s IN|ONESHOT)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        ev,
        1,
    );
    write_all(c, b"abc");
    ep_wait("wait", ep, 8, 5000, &names(CS));
    ep_wait("wait disabled", ep, 8, 0, &names(CS));
    ep_ctl(
        "epoll_ctl(MOD s IN|ONESHOT)",
        ep,
        libc::EPOLL_CTL_MOD,
        s,
        ev,
        1,
    );
    ep_wait("wait re-armed", ep, 8, 0, &names(CS));
    ep_wait("wait disabled again", ep, 8, 0, &names(CS));
    close(ep);
    close(c);
    close(s);
}

fn epoll_exclusive() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD s IN|EXCLUSIVE)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        1,
    );
    ep_ctl(
        "epoll_ctl(MOD s IN|EXCLUSIVE)",
        ep,
        libc::EPOLL_CTL_MOD,
        s,
        (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        1,
    );
    write_all(c, b"abc");
    ep_wait("wait", ep, 8, 5000, &names(CS));
    close(ep);
    close(c);
    close(s);
}

/// Waits (unlogged, at most 5 s per wait) until a read of `fd` returns something: wakeups
/// with nothing to read are allowed (`EAGAIN`), as for TCP. Logs what the read returned.
fn ep_read(what: &str, ep: c_int, fd: c_int) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    while std::time::Instant::now() < deadline {
        // SAFETY: 4 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 5000) };
        if n <= 0 {
            break;
        }
        let mut b = [0u8; 100];
        // SAFETY: valid buffer.
        let k = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        if k > 0 {
            log(format!("{what} = {k} [{}]", digest(&b[..k as usize])));
            return;
        }
        if k == 0 || errno() != libc::EAGAIN {
            r(what, k);
            return;
        }
    }
    log(format!("{what}: no data within 5 s"));
}

fn epoll_exclusive_mid_handshake() {
    // EPOLLEXCLUSIVE registered right after a non-blocking connect (the handshake may be under
    // way): the data must be reported once it arrives, whatever the connection became.
    let (l, port) = listener();
    let srv = dup_server(l, b"first", b"second");
    let c = tcp_socket();
    set_nonblock(c, true);
    let _ = connect_to(c, port);
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD c IN|EXCLUSIVE)",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        0,
    );
    ep_read("read(c) 1", ep, c);
    write_all(c, b"back");
    ep_read("read(c) 2", ep, c);
    close(ep);
    close(c);
    srv.join().expect("server thread");
    close(l);
}

/// A thread sleeps in `epoll_wait` on a set with nothing of ours in it (the library passes such
/// a wait straight to the kernel) while another thread adds a client whose connect is under
/// way: the sleeper must get the application's data with `EPOLLIN` once the server's bytes are
/// there, and nothing else. The library's own registration's event reached it, with data the
/// application never gave (a pointer, for nginx). (Adding the socket before its connect would
/// race on TCP too: an unconnected socket reports `EPOLLHUP`.)
fn epoll_add_while_other_thread_waits() {
    let (l, port) = listener();
    let srv = std::thread::spawn(move || {
        let s = accept_fd(l);
        assert!(s >= 0, "accept: {}", std::io::Error::last_os_error());
        write_all(s, b"hello");
        while !read_n(s, 1).is_empty() {}
        close(s);
    });
    let ep = ep_create();
    static T: AtomicI32 = AtomicI32::new(0);
    let waiter = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        // Until the client's event comes (at most 5 s): wakeups without it are allowed.
        while Instant::now() < deadline && seen.is_empty() {
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: 4 entries.
            let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 5000) };
            if n <= 0 {
                break;
            }
            // Every event the application was given, as it would read it.
            seen.extend(
                ev[..n as usize]
                    .iter()
                    .map(|e| (e.u64, mask_names(e.events))),
            );
        }
        seen
    });
    wait_blocked(&T);
    let c = tcp_socket();
    set_nonblock(c, true);
    let _ = connect_to(c, port);
    ep_ctl(
        "epoll_ctl(ADD c IN, data 7)",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        libc::EPOLLIN as u32,
        7,
    );
    let seen = waiter.join().expect("waiter");
    log(format!("the waiting thread got {seen:?}"));
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    rd("read(c)", c, 100);
    close(c);
    srv.join().expect("server thread");
    close(ep);
    close(l);
}

fn epoll_two_sets() {
    let (c, s) = pair();
    let (e1, e2) = (ep_create(), ep_create());
    ep_ctl(
        "epoll_ctl(e1 ADD s)",
        e1,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl(
        "epoll_ctl(e2 ADD s)",
        e2,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    static T1: AtomicI32 = AtomicI32::new(0);
    static T2: AtomicI32 = AtomicI32::new(0);
    let w = |ep: c_int, t: &'static AtomicI32| {
        std::thread::spawn(move || {
            t.store(gettid(), Ordering::Release);
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: 4 entries.
            let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 3000) };
            (n, if n > 0 { ev[0].events } else { 0 })
        })
    };
    let h1 = w(e1, &T1);
    let h2 = w(e2, &T2);
    wait_blocked(&T1);
    wait_blocked(&T2);
    write_all(c, b"wake both");
    let (n1, m1) = h1.join().unwrap();
    let (n2, m2) = h2.join().unwrap();
    log(format!("e1 = {n1} {}", mask_names(m1)));
    log(format!("e2 = {n2} {}", mask_names(m2)));
    close(e1);
    close(e2);
    close(c);
    close(s);
}

fn epoll_peer_close_mask() {
    let (c, s) = pair();
    let ep = ep_create();
    let all = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP) as u32;
    ep_ctl(
        "epoll_ctl(ADD s IN|OUT|RDHUP)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        all,
        1,
    );
    ep_wait("wait idle", ep, 8, 0, &names(CS));
    close(c);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    ep_wait("wait after peer close", ep, 8, 0, &names(CS));
    rd("read(s)", s, 10);
    ep_wait("wait after eof read", ep, 8, 0, &names(CS));
    close(ep);
    close(s);
}

fn epoll_peer_shutdown_wr_mask() {
    let (c, s) = pair();
    let ep = ep_create();
    let all = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP) as u32;
    ep_ctl(
        "epoll_ctl(ADD s IN|OUT|RDHUP)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        all,
        1,
    );
    // SAFETY: `c` is a socket fd this scenario owns; shutdown touches no memory.
    unsafe { libc::shutdown(c, libc::SHUT_WR) };
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    ep_wait("wait after peer SHUT_WR", ep, 8, 0, &names(CS));
    // SAFETY: `s` is a socket fd this scenario owns; shutdown touches no memory.
    unsafe { libc::shutdown(s, libc::SHUT_WR) };
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    ep_wait("wait after both SHUT_WR", ep, 8, 0, &names(CS));
    close(ep);
    close(c);
    close(s);
}

fn epoll_maxevents_mixed() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN|ET",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLET) as u32,
        1,
    );
    let mut ps = Vec::new();
    for i in 0..3u64 {
        let (rp, wp) = pipe();
        write_all(wp, b"x");
        ep_ctl(
            "ADD pipe IN|ET",
            ep,
            libc::EPOLL_CTL_ADD,
            rp,
            (libc::EPOLLIN | libc::EPOLLET) as u32,
            2 + i,
        );
        ps.push((rp, wp));
    }
    write_all(c, b"data");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let mut seen = std::collections::BTreeSet::new();
    let mut events = 0;
    for _ in 0..6 {
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: 2 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 2, 0) };
        if n <= 0 {
            break;
        }
        for e in &ev[..n as usize] {
            seen.insert(names(CS)(e.u64));
            events += 1;
        }
    }
    log(format!(
        "seen over calls of maxevents 2: {seen:?}, {events} events"
    ));
    close(ep);
    for (a, b) in ps {
        close(a);
        close(b);
    }
    close(c);
    close(s);
}

fn epoll_nested() {
    let (c, s) = pair();
    let inner = ep_create();
    let outer = ep_create();
    ep_ctl(
        "inner ADD s IN",
        inner,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl(
        "outer ADD inner IN",
        outer,
        libc::EPOLL_CTL_ADD,
        inner,
        libc::EPOLLIN as u32,
        5,
    );
    ep_wait("outer wait(0)", outer, 8, 0, &names(CS));
    write_all(c, b"nested");
    ep_wait("outer wait", outer, 8, 2000, &names(CS));
    ep_wait("inner wait(0)", inner, 8, 0, &names(CS));
    close(outer);
    close(inner);
    close(c);
    close(s);
}

fn epoll_nested_lt_data_left() {
    // A level-triggered entry of an inner set still has data after a partial read: the outer
    // wait (and a poll of the inner set) must see the inner set ready at once, as TCP's entry
    // stays on the inner set's ready list.
    let (c, s) = pair();
    let inner = ep_create();
    let outer = ep_create();
    ep_ctl(
        "inner ADD s IN",
        inner,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl(
        "outer ADD inner IN",
        outer,
        libc::EPOLL_CTL_ADD,
        inner,
        libc::EPOLLIN as u32,
        5,
    );
    write_all(c, b"abcdef");
    ep_wait("outer wait", outer, 8, 5000, &names(CS));
    ep_wait("inner wait", inner, 8, 5000, &names(CS));
    rd("read(s, 2)", s, 2);
    ep_wait("outer wait, 4 bytes left", outer, 8, 2000, &names(CS));
    ep_wait("inner wait", inner, 8, 0, &names(CS));
    pl("poll(inner,IN), 4 bytes left", inner, libc::POLLIN, 2000);
    ep_wait("inner wait", inner, 8, 0, &names(CS));
    rd("read(s)", s, 100);
    close(outer);
    close(inner);
    close(c);
    close(s);
}

fn epoll_nested_wakes_on_write() {
    // An outer wait asleep while the inner set's connection was active a moment ago: the
    // peer's next write must wake it.
    let (c, s) = pair();
    let inner = ep_create();
    let outer = ep_create();
    ep_ctl(
        "inner ADD s IN",
        inner,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl(
        "outer ADD inner IN",
        outer,
        libc::EPOLL_CTL_ADD,
        inner,
        libc::EPOLLIN as u32,
        5,
    );
    write_all(c, b"x");
    ep_wait("outer wait", outer, 8, 5000, &names(CS));
    ep_wait("inner wait", inner, 8, 5000, &names(CS));
    rd("read(s)", s, 10);
    ep_wait("inner wait(0) drained", inner, 8, 0, &names(CS));
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: 4 entries.
        let n = unsafe { libc::epoll_wait(outer, ev.as_mut_ptr(), 4, 3000) };
        (n, if n > 0 { ev[0].events } else { 0 })
    });
    wait_blocked(&T);
    write_all(c, b"y");
    let (n, m) = h.join().unwrap();
    log(format!("outer wait in a thread = {n} [{}]", mask_names(m)));
    ep_wait("inner wait", inner, 8, 5000, &names(CS));
    rd("read(s)", s, 10);
    close(outer);
    close(inner);
    close(c);
    close(s);
}

fn poll_nested_epoll() {
    let (c, s) = pair();
    let inner = ep_create();
    ep_ctl(
        "inner ADD s IN",
        inner,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    pl("poll(inner,IN) idle", inner, libc::POLLIN, 0);
    write_all(c, b"nested");
    pl("poll(inner,IN)", inner, libc::POLLIN, 2000);
    ep_wait("inner wait(0)", inner, 8, 0, &names(CS));
    close(inner);
    close(c);
    close(s);
}

fn epoll_pwait2() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    write_all(c, b"x");
    let ts = libc::timespec {
        tv_sec: 5,
        tv_nsec: 0,
    };
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: 4 entries, valid timespec.
    let n = unsafe { libc::epoll_pwait2(ep, ev.as_mut_ptr(), 4, &ts, std::ptr::null()) };
    r("epoll_pwait2", n as isize);
    if n > 0 {
        let (d, m) = (ev[0].u64, ev[0].events);
        log(format!("ev {d} {}", mask_names(m)));
    }
    close(ep);
    close(c);
    close(s);
}

fn epoll_pwait2_timeout() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 30_000_000,
    };
    let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: 4 entries, valid timespec.
    let n = unsafe { libc::epoll_pwait2(ep, ev.as_mut_ptr(), 4, &ts, std::ptr::null()) };
    r("epoll_pwait2 30ms idle", n as isize);
    close(ep);
    close(c);
    close(s);
}

fn epoll_et_peer_closed_quiet() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN|RDHUP|ET",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        1,
    );
    close(c);
    ep_wait("wait", ep, 8, 5000, &names(CS));
    ep_wait("wait again 100ms (no new edge)", ep, 8, 100, &names(CS));
    close(ep);
    close(s);
}

fn epoll_huge_maxevents() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    write_all(c, b"x");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    in_child(|| {
        // A cap on the address space makes a huge allocation fail instead of swapping.
        let lim = libc::rlimit {
            rlim_cur: 1 << 30,
            rlim_max: 1 << 30,
        };
        // SAFETY: plain setrlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
        // On the heap (low addresses): the kernel checks the whole array against the end of
        // the user address space, which an array on the stack may cross (EFAULT, by ASLR).
        let mut ev = vec![libc::epoll_event { events: 0, u64: 0 }; 16];
        let max = (i32::MAX as usize / std::mem::size_of::<libc::epoll_event>()) as c_int;
        // SAFETY: the kernel writes only the ready events (1) into the 16 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), max, 0) };
        r("epoll_wait(maxevents=EP_MAX_EVENTS)", n as isize);
        // SAFETY: as above.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), max + 1, 0) };
        r("epoll_wait(maxevents=EP_MAX_EVENTS+1)", n as isize);
        // An array whose end is past the user address space: EFAULT before anything is read.
        let top = ((1usize << 47) - 4096 - 8 * 12) as *mut libc::epoll_event;
        // SAFETY: the kernel refuses the range without writing.
        let n = unsafe { libc::epoll_wait(ep, top, 16, 0) };
        r("epoll_wait(array past the user address space)", n as isize);
    });
    close(ep);
    close(c);
    close(s);
}

fn epoll_mod_out() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_wait("wait(0) IN only", ep, 8, 0, &names(CS));
    ep_ctl(
        "MOD s IN|OUT",
        ep,
        libc::EPOLL_CTL_MOD,
        s,
        (libc::EPOLLIN | libc::EPOLLOUT) as u32,
        1,
    );
    ep_wait("wait(0) IN|OUT", ep, 8, 0, &names(CS));
    ep_ctl(
        "MOD unknown fd",
        ep,
        libc::EPOLL_CTL_MOD,
        c,
        libc::EPOLLIN as u32,
        0,
    );
    ep_ctl(
        "ADD s twice",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    close(ep);
    close(c);
    close(s);
}

fn epoll_del() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl(
        "ADD c IN",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        libc::EPOLLIN as u32,
        0,
    );
    write_all(c, b"x");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    ep_ctl("DEL s", ep, libc::EPOLL_CTL_DEL, s, 0, 0);
    ep_wait("wait(0) after DEL", ep, 8, 0, &names(CS));
    ep_ctl("DEL s again", ep, libc::EPOLL_CTL_DEL, s, 0, 0);
    close(ep);
    close(c);
    close(s);
}

/// Edge-triggered `IN|OUT` (nginx's registration): the entry was reported writable and the
/// set slept since (the emulation parks it: nothing armed for room, there was room). Then the
/// program fills the send buffer (`EAGAIN`) and waits for the edge while the peer drains it.
fn epoll_et_out_parked_then_full() {
    let (c, s) = pair();
    set_nonblock(c, true);
    let ep = ep_create();
    ep_ctl(
        "ADD c IN|OUT|ET",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET) as u32,
        0,
    );
    ep_wait("wait writable", ep, 8, 5000, &names(CS));
    ep_wait("wait(50) idle", ep, 8, 50, &names(CS));
    let chunk = vec![7u8; 65536];
    let mut total = 0usize;
    loop {
        let n = wr(c, &chunk);
        if n < 0 {
            log(format!("write until full: {}", ename(errno())));
            break;
        }
        total += n as usize;
    }
    let reader = std::thread::spawn(move || read_n(s, total).len() == total);
    ep_wait("wait writable again", ep, 8, 5000, &names(CS));
    log(format!("drained all: {}", reader.join().expect("reader")));
    close(ep);
    close(c);
    close(s);
}

/// A thread waits for `c` (full send buffer: not writable) while another shuts it for writing
/// (through `via`, `c` itself or a dup): TCP wakes the waiter with `EPOLLOUT`.
fn shutdown_wakes_waiter(dup: bool) {
    let (c, s) = pair();
    set_nonblock(c, true);
    let chunk = vec![7u8; 65536];
    loop {
        if wr(c, &chunk) < 0 {
            log(format!("write until full: {}", ename(errno())));
            break;
        }
    }
    let ep = ep_create();
    ep_ctl(
        "ADD c IN|OUT",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        (libc::EPOLLIN | libc::EPOLLOUT) as u32,
        0,
    );
    ep_wait("wait(0) full", ep, 8, 0, &names(CS));
    // SAFETY: plain dup.
    let via = if dup { unsafe { libc::dup(c) } } else { c };
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: 4 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 5000) };
        (n, if n > 0 { ev[0].events } else { 0 })
    });
    wait_blocked(&T);
    // SAFETY: plain shutdown.
    r(
        "shutdown(SHUT_WR)",
        unsafe { libc::shutdown(via, libc::SHUT_WR) } as isize,
    );
    let (n, m) = h.join().expect("waiter");
    log(format!("waiter = {n} {}", mask_names(m)));
    if dup {
        close(via);
    }
    close(ep);
    close(c);
    close(s);
}

fn epoll_shutdown_wakes_waiter() {
    shutdown_wakes_waiter(false);
}

fn epoll_shutdown_dup_wakes_waiter() {
    shutdown_wakes_waiter(true);
}

/// Two threads wait on one set (maxevents 1) for one level-triggered connection that becomes
/// readable: both are woken with it (TCP keeps a level-triggered entry on the kernel's ready
/// list and wakes the next waiter).
fn epoll_threads_lt_both_woken() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    static T1: AtomicI32 = AtomicI32::new(0);
    static T2: AtomicI32 = AtomicI32::new(0);
    let w = |t: &'static AtomicI32| {
        std::thread::spawn(move || {
            t.store(gettid(), Ordering::Release);
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 1];
            // Without a timeout: a waiter left asleep is a hang (the watchdog ends it), not a
            // late return that would look the same in the trace.
            // SAFETY: 1 entry.
            unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 1, -1) }
        })
    };
    let h1 = w(&T1);
    let h2 = w(&T2);
    wait_blocked(&T1);
    wait_blocked(&T2);
    write_all(c, b"one");
    let (n1, n2) = (h1.join().expect("t1"), h2.join().expect("t2"));
    log(format!(
        "threads woken with an event: {}",
        (n1 == 1) as u32 + (n2 == 1) as u32
    ));
    close(ep);
    close(c);
    close(s);
}

/// A set copied by `fork`, waited on in both processes at once (level-triggered): both see
/// the connection become readable.
fn epoll_fork_shared_set() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_wait("wait(0) before fork", ep, 8, 0, &names(CS));
    let (rp, wp) = pipe();
    // SAFETY: the child only waits on the set, writes one line and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(rp);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: 4 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 5000) };
        let line = format!(
            "{n} {}",
            if n > 0 {
                mask_names(ev[0].events)
            } else {
                String::new()
            }
        );
        write_all(wp, line.as_bytes());
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(wp);
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: 4 entries.
        let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 5000) };
        (n, if n > 0 { ev[0].events } else { 0 })
    });
    wait_blocked(&T);
    wait_pid_blocked(pid);
    write_all(c, b"both");
    let (n, m) = h.join().expect("waiter");
    log(format!("parent = {n} {}", mask_names(m)));
    let child = read_n(rp, 256);
    close(rp);
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!(
        "child = {}",
        String::from_utf8_lossy(&child).trim()
    ));
    close(ep);
    close(c);
    close(s);
}

/// The peer writes and exits without closing (a crash: nothing in the CDC header) while this
/// side's entry sleeps parked: its doorbell and the TCP FIN arrive together. A non-blocking
/// epoll loop reads the bytes and then the EOF (TCP: the read after the bytes returns 0). (The
/// set is made after the fork: the child has no copy of it.)
fn epoll_peer_exit_after_write() {
    let (c, s) = pair();
    let (rp, wp) = pipe();
    // SAFETY: the child only waits for the go, writes on `c` and exits without closing it.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(s);
        close(wp);
        let mut b = [0u8; 1];
        // SAFETY: valid buffer.
        unsafe { libc::read(rp, b.as_mut_ptr().cast(), 1) };
        write_all(c, b"hello");
        // SAFETY: exit without closing `c` (as a crash would).
        unsafe { libc::_exit(0) };
    }
    close(c);
    close(rp);
    set_nonblock(s, true);
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    // Nothing to read: the set sleeps (the entry is parked, its wakeups armed).
    ep_wait("wait(50) idle", ep, 8, 50, &names(CS));
    write_all(wp, b"g");
    close(wp);
    let mut st = 0;
    // SAFETY: our child; once it is reaped its socket is closed (FIN sent).
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let (bytes, eof) = epoll_read_to_eof(ep, s);
    log(format!("bytes {bytes}, EOF seen: {eof}"));
    close(ep);
    close(s);
}

/// An epoll loop over one non-blocking fd: wait (2 s at most), read until `EAGAIN` or EOF; three
/// rounds at most. The bytes read and whether EOF was seen.
fn epoll_read_to_eof(ep: c_int, fd: c_int) -> (usize, bool) {
    let (mut bytes, mut eof) = (0usize, false);
    for _ in 0..3 {
        if eof {
            break;
        }
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: 8 entries.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 2000) };
        if n <= 0 {
            continue;
        }
        loop {
            let mut b = [0u8; 64];
            // SAFETY: valid buffer.
            let k = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
            if k > 0 {
                bytes += k as usize;
                continue;
            }
            eof = k == 0;
            break;
        }
    }
    (bytes, eof)
}

/// A child forked while the set watches `s` closes its copies of `s` and of the set and exits;
/// then the peer writes and closes: the parent's set reports it (TCP: the child's close of its
/// descriptor leaves the parent's registration alone, the open file lives on).
fn epoll_fork_child_closes_conn() {
    let (c, s) = pair();
    set_nonblock(s, true);
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_wait("wait(0)", ep, 8, 0, &names(CS));
    // SAFETY: the child only closes two descriptors and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(s);
        close(ep);
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    write_all(c, b"hello");
    close(c);
    let (bytes, eof) = epoll_read_to_eof(ep, s);
    log(format!("bytes {bytes}, EOF seen: {eof}"));
    close(ep);
    close(s);
}

fn epoll_out_after_full() {
    let (c, s) = pair();
    set_nonblock(c, true);
    let ep = ep_create();
    ep_ctl(
        "ADD c OUT|ET",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        (libc::EPOLLOUT | libc::EPOLLET) as u32,
        0,
    );
    ep_wait("wait writable", ep, 8, 5000, &names(CS));
    let chunk = vec![7u8; 65536];
    let mut total = 0usize;
    loop {
        let n = wr(c, &chunk);
        if n < 0 {
            log(format!("write until full: {}", ename(errno())));
            break;
        }
        total += n as usize;
    }
    ep_wait("wait(0) full", ep, 8, 0, &names(CS));
    let got = read_n(s, total);
    log(format!("drained all: {}", got.len() == total));
    ep_wait("wait writable again", ep, 8, 5000, &names(CS));
    close(ep);
    close(c);
    close(s);
}

// ── poll / select ───────────────────────────────────────────────────────────────────────────

fn poll_out_initial() {
    let (c, s) = pair();
    pl("poll(c,OUT)", c, libc::POLLOUT, 0);
    pl("poll(c,IN|OUT)", c, libc::POLLIN | libc::POLLOUT, 0);
    pl("poll(s,IN) idle 20ms", s, libc::POLLIN, 20);
    close(c);
    close(s);
}

fn poll_peer_close() {
    let (c, s) = pair();
    close(c);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    pl(
        "poll(s,IN|OUT|RDHUP)",
        s,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    );
    pl("poll(s,0)", s, 0, 0);
    close(s);
}

fn poll_shutdown_rdwr() {
    let (c, s) = pair();
    r(
        "shutdown(s,RDWR)",
        // SAFETY: `s` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(s, libc::SHUT_RDWR) } as isize,
    );
    pl(
        "poll(s,IN|OUT|RDHUP)",
        s,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    );
    pl("poll(c,IN|RDHUP)", c, libc::POLLIN | libc::POLLRDHUP, 5000);
    rd("read(c)", c, 10);
    close(c);
    close(s);
}

fn ppoll_sigmask() {
    let (c, s) = pair();
    handle(libc::SIGUSR1, false);
    // SAFETY: signal mask manipulation of this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGUSR1);
        log(format!(
            "pending, handled x{}",
            SIGUSR1S.load(Ordering::SeqCst)
        ));
        let mut p = libc::pollfd {
            fd: s,
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        // Still blocked during the call: sleeps until data.
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            write_all(c, b"x");
        });
        let n = libc::ppoll(&mut p, 1, &ts, &set);
        r("ppoll(mask blocks USR1)", n as isize);
        h.join().unwrap();
        let empty: libc::sigset_t = {
            let mut e = std::mem::zeroed();
            libc::sigemptyset(&mut e);
            e
        };
        rd("read(s)", s, 10);
        let n = libc::ppoll(&mut p, 1, &ts, &empty);
        r("ppoll(mask unblocks USR1)", n as isize);
        log(format!("handled x{}", SIGUSR1S.load(Ordering::SeqCst)));
    }
    close(c);
    close(s);
}

fn pselect_sigmask() {
    let (c, s) = pair();
    handle(libc::SIGUSR2, false);
    // SAFETY: signal mask and fd_set manipulation.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGUSR2);
        let empty: libc::sigset_t = {
            let mut e = std::mem::zeroed();
            libc::sigemptyset(&mut e);
            e
        };
        let mut rs: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut rs);
        let ts = libc::timespec {
            tv_sec: 5,
            tv_nsec: 0,
        };
        let n = libc::pselect(
            s + 1,
            &mut rs,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &ts,
            &empty,
        );
        r("pselect(mask unblocks USR2)", n as isize);
        log(format!("handled x{}", SIGUSR2S.load(Ordering::SeqCst)));
        write_all(c, b"x");
        let mut rs: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut rs);
        let n = libc::pselect(
            s + 1,
            &mut rs,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &ts,
            &set,
        );
        r("pselect(readable)", n as isize);
        log(format!("s set {}", libc::FD_ISSET(s, &rs)));
    }
    close(c);
    close(s);
}

fn select_readable() {
    let (c, s) = pair();
    // SAFETY: fd_set manipulation.
    unsafe {
        let mut rs: libc::fd_set = std::mem::zeroed();
        let mut ws: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut rs);
        libc::FD_SET(c, &mut ws);
        let mut t = tv(0);
        let n = libc::select(s.max(c) + 1, &mut rs, &mut ws, std::ptr::null_mut(), &mut t);
        r("select(s r, c w) idle", n as isize);
        log(format!(
            "r:s {} w:c {}",
            libc::FD_ISSET(s, &rs),
            libc::FD_ISSET(c, &ws)
        ));
        write_all(c, b"x");
        let mut rs: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(s, &mut rs);
        let mut t = tv(5000);
        let n = libc::select(
            s + 1,
            &mut rs,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut t,
        );
        r("select(s r)", n as isize);
        log(format!("r:s {}", libc::FD_ISSET(s, &rs)));
    }
    close(c);
    close(s);
}

// ── close and errors ────────────────────────────────────────────────────────────────────────

fn linger0_so_error() {
    let (c, s) = pair();
    linger0(c);
    close(c);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    pl(
        "poll(s,IN|OUT|RDHUP) after abort",
        s,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    );
    so_error("SO_ERROR(s)", s);
    so_error("SO_ERROR(s) again", s);
    rd("read(s)", s, 10);
    close(s);
}

fn close_unread_resets_peer() {
    count_sigpipe();
    let (c, s) = pair();
    write_all(c, b"never read");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    r("close(s) with unread data", close(s) as isize);
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    rd("read(c)", c, 10);
    rd("read(c) again", c, 10);
    r("write(c)", wr(c, b"x"));
    log_sigpipes();
    close(c);
}

fn shut_rd_queued_data() {
    let (c, s) = pair();
    write_all(c, b"queued");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    r(
        "shutdown(s,RD)",
        // SAFETY: `s` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(s, libc::SHUT_RD) } as isize,
    );
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 0);
    rd("read(s)", s, 100);
    rd("read(s) again", s, 100);
    r("write(s) still allowed", wr(s, b"reply"));
    rd("read(c)", c, 100);
    close(c);
    close(s);
}

fn shutdown_wr_then_write() {
    count_sigpipe();
    let (c, s) = pair();
    r(
        "shutdown(c,WR)",
        // SAFETY: `c` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    r("write(c)", wr(c, b"x"));
    // SAFETY: sends 1 byte from a static buffer.
    r("send(c,NOSIGNAL)", unsafe {
        libc::send(c, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL)
    });
    log_sigpipes();
    r(
        "shutdown(c,WR) again",
        // SAFETY: `c` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    // SAFETY: an invalid `how` only earns EINVAL; no memory is touched.
    r("shutdown(c,bad)", unsafe { libc::shutdown(c, 7) } as isize);
    rd("read(s)", s, 10);
    close(c);
    close(s);
}

fn write_after_peer_close_nosignal() {
    count_sigpipe();
    let (c, s) = pair();
    close(s);
    pl("poll(c,IN|RDHUP)", c, libc::POLLIN | libc::POLLRDHUP, 5000);
    // SAFETY: sends 1 byte from a static buffer.
    r("send(c,NOSIGNAL) 1st", unsafe {
        libc::send(c, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL)
    });
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    // SAFETY: sends 1 byte from a static buffer.
    r("send(c,NOSIGNAL) 2nd", unsafe {
        libc::send(c, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL)
    });
    rd("read(c)", c, 10);
    log_sigpipes();
    close(c);
}

/// A thread blocked in `recv(s, n, flags)` (announced through `t`): its result and digest.
fn blocked_recv(
    t: &'static AtomicI32,
    s: c_int,
    n: usize,
    flags: c_int,
) -> std::thread::JoinHandle<(isize, String)> {
    std::thread::spawn(move || {
        t.store(gettid(), Ordering::Release);
        let mut b = vec![0u8; n];
        // SAFETY: valid buffer.
        let k = unsafe { libc::recv(s, b.as_mut_ptr().cast(), n, flags) };
        (k, digest(&b[..k.max(0) as usize]))
    })
}

/// A pipe whose read end takes the number `s` (free again), its write end above it.
fn pipe_at(s: c_int) -> (c_int, c_int) {
    let (rp0, wp0) = pipe();
    // SAFETY: plain fcntl: the write end above the number, the read end on it.
    let wp = unsafe { libc::fcntl(wp0, libc::F_DUPFD, s + 1) };
    close(wp0);
    let rp = if rp0 == s {
        rp0
    } else {
        // SAFETY: as above.
        let rp = unsafe { libc::fcntl(rp0, libc::F_DUPFD, s) };
        close(rp0);
        rp
    };
    log(format!("pipe reuses the number: {}", rp == s));
    (rp, wp)
}

// A close() of the number while another thread blocks in a call on it: the call holds the
// socket (the kernel's file reference), goes on as if nothing happened, and the socket closes
// when it returns; the number is the application's to reuse at once, and nothing of ours may
// touch what it names now.

fn close_while_recv_blocked() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, s, 16, 0);
    wait_blocked(&T);
    r("close(s) while recv blocks", close(s) as isize);
    // The number is free again: a pipe takes it.
    let (rp, wp) = pipe_at(s);
    write_all(wp, b"pipe data");
    write_all(c, b"late");
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    rd("read(pipe)", rp, 100);
    close(rp);
    close(wp);
    close(c);
}

fn close_while_recv_blocked_peer_writes_on() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, s, 64, libc::MSG_WAITALL);
    wait_blocked(&T);
    r("close(s) while recv(WAITALL) blocks", close(s) as isize);
    // The number is reused by a pipe that stays empty (a file that is not ready).
    let (rp, wp) = pipe_at(s);
    // The peer sees nothing of the close: the socket is still open.
    pl(
        "poll(c,IN|RDHUP) after the close",
        c,
        libc::POLLIN | libc::POLLRDHUP,
        0,
    );
    write_all(c, b"written after the close, ");
    pl(
        "poll(c,IN|RDHUP) after a write",
        c,
        libc::POLLIN | libc::POLLRDHUP,
        0,
    );
    write_all(c, b"and more");
    // SAFETY: plain syscall.
    r(
        "shutdown(c,WR)",
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    // The call returned: the socket went with it.
    pl("poll(c,IN) after the call returned", c, libc::POLLIN, 5000);
    rd("read(c)", c, 10);
    pl("poll(pipe,IN) untouched", rp, libc::POLLIN, 0);
    close(rp);
    close(wp);
    close(c);
}

fn dup2_over_recv_blocked() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, s, 16, 0);
    wait_blocked(&T);
    let wp = pipe_over("dup2(pipe, s) while recv blocks", s);
    write_all(c, b"late");
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    rd("read(s), the pipe now", s, 100);
    pl("poll(c,IN) after the call returned", c, libc::POLLIN, 5000);
    rd("read(c)", c, 10);
    close(s);
    close(wp);
    close(c);
}

/// A non-blocking connect of `c` (named `name` in the trace) to `port`, logged, then a wait
/// until it is writable.
fn connect_nonblocking(name: &str, c: c_int, port: u16) {
    set_nonblock(c, true);
    let rc = connect_to(c, port);
    let e = errno();
    log(format!(
        "connect({name}) nonblocking = {}",
        if rc == 0 { "0".into() } else { ename(e) }
    ));
    pl(&format!("poll({name},OUT)"), c, libc::POLLOUT, 5000);
}

/// A pipe whose read end replaces the socket at its number `fd` (`what`: the trace line), with
/// "pipe data" in it; returns its write end.
fn pipe_over(what: &str, fd: c_int) -> c_int {
    let (rp, wp) = pipe();
    // SAFETY: plain dup2: the pipe's read end replaces the socket at its number.
    let d = unsafe { libc::dup2(rp, fd) };
    log(format!("{what}: {}", d == fd));
    close(rp);
    write_all(wp, b"pipe data");
    wp
}

/// A client whose connect returned before the server accepted (non-blocking connect, then
/// blocking again): its first `recv` blocks until the server speaks, and under the data path it
/// drives the connection's handshake meanwhile. Another thread makes the number name a pipe:
/// as on TCP, the blocked call goes on with the socket it started on (it gets the server's
/// bytes, never the pipe's), and the socket closes when it returns.
fn handshake_window_client() -> (c_int, c_int, u16) {
    let (l, port) = listener();
    let c = tcp_socket();
    connect_nonblocking("c", c, port);
    set_nonblock(c, false);
    (l, c, port)
}

fn dup2_over_recv_in_handshake() {
    let (l, c, _) = handshake_window_client();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, c, 16, 0);
    wait_blocked(&T);
    let wp = pipe_over("dup2(pipe, c) while recv blocks", c);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    write_all(s, b"late");
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    rd("read(c), the pipe now", c, 100);
    pl("poll(s,IN) after the call returned", s, libc::POLLIN, 5000);
    rd("read(s)", s, 10);
    close(c);
    close(wp);
    close(s);
    close(l);
}

/// As [`dup2_over_recv_in_handshake`] with `sendfile` from a file: on TCP the call does not
/// wait (the connection is up) and its bytes are the server's; under the data path it waits for
/// the handshake, and must still send them to the server, never into the pipe at the number.
fn dup2_over_sendfile_in_handshake() {
    let (l, c, _) = handshake_window_client();
    // SAFETY: a plain memfd with 8 bytes, rewound.
    let f = unsafe { libc::memfd_create(c"conform-sendfile".as_ptr(), 0) };
    write_all(f, b"FILEDATA");
    // SAFETY: plain lseek on our memfd.
    unsafe { libc::lseek(f, 0, libc::SEEK_SET) };
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        // SAFETY: fd numbers and a NULL offset (the file's own).
        unsafe { libc::sendfile(c, f, std::ptr::null_mut(), 8) }
    });
    wait_blocked_or_done(&T, &h);
    let wp = pipe_over("dup2(pipe, c) during sendfile", c);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    log(format!("sendfile = {}", h.join().unwrap()));
    rd("read(s)", s, 100);
    rd("read(c), the pipe now", c, 100);
    pl("poll(s,IN) after the call returned", s, libc::POLLIN, 5000);
    rd("read(s) again", s, 10);
    close(c);
    close(wp);
    close(s);
    close(f);
    close(l);
}

/// As [`dup2_over_recv_in_handshake`] with `recvmmsg` (a call made of several reads).
fn dup2_over_recvmmsg_in_handshake() {
    let (l, c, _) = handshake_window_client();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let mut b = [0u8; 16];
        let mut v = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
        // SAFETY: plain old data.
        let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
        m.msg_hdr.msg_iov = &mut v;
        m.msg_hdr.msg_iovlen = 1;
        // SAFETY: one mmsghdr over our buffer.
        let k = unsafe { libc::recvmmsg(c, &mut m, 1, 0, std::ptr::null_mut()) };
        (k, m.msg_len, digest(&b[..(m.msg_len as usize).min(16)]))
    });
    wait_blocked(&T);
    let wp = pipe_over("dup2(pipe, c) while recvmmsg blocks", c);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    write_all(s, b"late");
    let (k, n, d) = h.join().unwrap();
    log(format!("blocked recvmmsg = {k}, msg_len {n} [{d}]"));
    rd("read(c), the pipe now", c, 100);
    pl("poll(s,IN) after the call returned", s, libc::POLLIN, 5000);
    rd("read(s)", s, 10);
    close(c);
    close(wp);
    close(s);
    close(l);
}

/// The peer sent its last bytes and closed; a write of ours after that draws its reset. On TCP
/// the peer's FIN came first: reads give its bytes, then the end of the stream (not the error),
/// and the `EPIPE` stays pending for `SO_ERROR` and the next write (`tests/redteam/rt7_ctl.py`).
fn read_after_write_after_peer_close() {
    count_sigpipe();
    let (c, s) = pair();
    write_all(c, b"WRITDATA");
    close(c);
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    r("write(s) after the peer's close", wr(s, b"late"));
    pl("poll(s,IN) after the write", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    rd("read(s) at the end", s, 100);
    rd("read(s) again", s, 100);
    so_error("SO_ERROR(s)", s);
    so_error("SO_ERROR(s) again", s);
    r("write(s) then", wr(s, b"more"));
    log_sigpipes();
    close(s);
}

/// Runs this scenario again (the same process image and arguments) with `SMC_CLC_TIMEOUT_MS=1`,
/// unless it runs so already: the library reads its configuration when it loads. Over TCP the
/// variable means nothing.
fn with_clc_timeout_1ms() {
    reexec_with("SMC_CLC_TIMEOUT_MS", "1");
}

/// Runs the scenario again in a fresh image with `var=value` in its environment (the library
/// reads its knobs at load), unless it has that already.
fn reexec_with(var: &str, value: &str) {
    use std::os::unix::process::CommandExt as _;
    if std::env::var(var).as_deref() == Ok(value) {
        return;
    }
    let mut args = std::env::args_os();
    let _ = args.next();
    let err = std::process::Command::new("/proc/self/exe")
        .args(args)
        .env(var, value)
        .exec();
    panic!("re-exec with {var}={value}: {err}");
}

/// [`epoll_exclusive_mid_handshake`] with the server thread deciding the client's handshake
/// while the client's `epoll_ctl(ADD)` is under way (the library pauses 50 ms inside it, after
/// the registration and before the set knows the fd: `SMC_TEST_EPOLL_CTL_PAUSE_MS`). The
/// entry stayed on the TCP socket of an SMC connection whose doorbells nothing armed: the
/// first read waited its whole 5 s (seen once in CI under a CLC timeout of 1 ms).
fn epoll_exclusive_decided_during_ctl() {
    reexec_with("SMC_TEST_EPOLL_CTL_PAUSE_MS", "50");
    epoll_exclusive_mid_handshake();
}

/// [`dup2_over_recv_in_handshake`] where the client's handshake gives up first (a CLC timeout
/// of 1 ms, before the server accepts): the client falls back and its blocked `recv` waits to
/// skip the server's late Accept, then reads the server's bytes. A dup2 over the number during
/// that wait must not end the call (it did: the skip went on through the number, which named
/// the pipe, and the socket closed under the call with the Accept unread: reset).
fn dup2_over_recv_after_clc_timeout() {
    with_clc_timeout_1ms();
    dup2_over_recv_in_handshake();
}

/// [`socket_reuses_number_while_recv_in_handshake`] with a CLC timeout of 1 ms, as
/// [`dup2_over_recv_after_clc_timeout`]: the blocked `recv` skips its late Accept through its
/// own socket, never through the new client at the number.
fn socket_reuses_number_while_recv_after_clc_timeout() {
    with_clc_timeout_1ms();
    socket_reuses_number_while_recv_in_handshake();
}

fn socket_reuses_number_while_recv_in_handshake() {
    let (l, c, port) = handshake_window_client();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, c, 16, 0);
    wait_blocked(&T);
    r("close(c) while recv blocks", close(c) as isize);
    // A new client takes the number (moved there if it did not get it).
    let n0 = tcp_socket();
    let n = if n0 == c {
        n0
    } else {
        // SAFETY: plain dup2 onto the free number.
        let n = unsafe { libc::dup2(n0, c) };
        close(n0);
        n
    };
    log(format!("new socket at the number: {}", n == c));
    // Non-blocking as well: the old client's handshake waits for an accept that only comes
    // after this connect (a blocking one would wait for its own, too).
    connect_nonblocking("new", n, port);
    set_nonblock(n, false);
    // The listener's first connection is the old client's, the second the new one's.
    let s = accept_fd(l);
    let s2 = accept_fd(l);
    log(format!("accept ok = {} {}", s >= 0, s2 >= 0));
    write_all(n, b"to the new one");
    rd("read(new's server end)", s2, 100);
    write_all(s, b"late");
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    write_all(s2, b"back");
    rd("read(new)", n, 100);
    pl("poll(new,IN) nothing more", n, libc::POLLIN, 0);
    so_error("SO_ERROR(new)", n);
    pl(
        "poll(s,IN) after the old call returned",
        s,
        libc::POLLIN,
        5000,
    );
    rd("read(s)", s, 10);
    close(n);
    close(s);
    close(s2);
    close(l);
}

fn socket_reuses_number_while_recv_blocked() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = blocked_recv(&T, s, 16, 0);
    wait_blocked(&T);
    r("close(s) while recv blocks", close(s) as isize);
    // A new connection one of whose ends takes the number (moved there if another socket of
    // its making took it).
    let (c2, s2) = pair();
    let (n, other) = if c2 == s {
        (c2, s2)
    } else if s2 == s {
        (s2, c2)
    } else {
        // SAFETY: plain dup2 onto the free number.
        let n = unsafe { libc::dup2(s2, s) };
        close(s2);
        (n, c2)
    };
    log(format!("new socket at the number: {}", n == s));
    write_all(other, b"to the new one");
    rd("read(new)", n, 100);
    // The old peer wakes the old call.
    write_all(c, b"late");
    let (k, d) = h.join().unwrap();
    log(format!("blocked recv = {k} [{d}]"));
    write_all(n, b"back");
    rd("read(other end)", other, 100);
    pl("poll(other end,IN) nothing more", other, libc::POLLIN, 0);
    pl("poll(new,IN) nothing more", n, libc::POLLIN, 0);
    so_error("SO_ERROR(other end)", other);
    so_error("SO_ERROR(new)", n);
    pl(
        "poll(c,IN) after the old call returned",
        c,
        libc::POLLIN,
        5000,
    );
    rd("read(c)", c, 10);
    close(n);
    close(other);
    close(c);
}

fn close_while_send_blocked() {
    // More than the peer's socket and ring hold: the write blocks until the peer reads.
    let data: Vec<u8> = (0..(24usize << 20))
        .map(|i| (i ^ (i >> 11)) as u8)
        .collect();
    let want = digest(&data);
    close_while_writing_blocked("write", want, move |s| {
        // SAFETY: valid buffer.
        unsafe { libc::write(s, data.as_ptr().cast(), data.len()) }
    });
}

/// `sendfile` from a file into a socket whose peer does not read yet, blocked; another thread
/// closes the socket's number and a pipe takes it: the call goes on with the socket it started
/// on (the kernel holds the file for the whole call), never with what the number names now.
fn close_while_sendfile_blocked() {
    let data: Vec<u8> = (0..(24usize << 20))
        .map(|i| (i ^ (i >> 13)) as u8)
        .collect();
    let want = digest(&data);
    // SAFETY: a plain memfd, filled with `data` and rewound.
    let f = unsafe { libc::memfd_create(c"conform-sendfile".as_ptr(), 0) };
    write_all(f, &data);
    // SAFETY: plain lseek on our memfd.
    unsafe { libc::lseek(f, 0, libc::SEEK_SET) };
    let n = data.len();
    close_while_writing_blocked("sendfile", want, move |s| {
        // SAFETY: fd numbers and a NULL offset (the file's own).
        unsafe { libc::sendfile(s, f, std::ptr::null_mut(), n) }
    });
    close(f);
}

/// A thread makes `call` (`write_blocked(s)`: more than the peer's socket and ring hold) on
/// one end of a pair and blocks; the number is closed and a pipe takes it. Everything the call
/// writes arrives (digest `want`), then the end of the stream; the pipe is untouched.
fn close_while_writing_blocked(
    call: &str,
    want: String,
    write_blocked: impl FnOnce(c_int) -> isize + Send + 'static,
) {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    T.store(0, Ordering::Release);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        write_blocked(s)
    });
    wait_blocked(&T);
    r(&format!("close(s) while {call} blocks"), close(s) as isize);
    let (rp, wp) = pipe_at(s);
    let got = read_n(c, 32 << 20);
    let k = h.join().unwrap();
    log(format!("blocked {call} = {k}"));
    log(format!(
        "peer got {} [{}] want [{want}]",
        got.len(),
        digest(&got)
    ));
    pl("poll(pipe,IN) untouched", rp, libc::POLLIN, 0);
    close(rp);
    close(wp);
    close(c);
}

/// recvmmsg with 3 messages of 4 bytes and no flags blocks until it has all three (as
/// `__sys_recvmmsg` does: only MSG_WAITFORONE or MSG_DONTWAIT make the later ones not wait);
/// the peer writes them 100 ms apart.
fn recvmmsg_waits_for_every_message() {
    recvmmsg_paced(0);
}

/// The same with MSG_WAITFORONE: it returns once the first message is in.
fn recvmmsg_waitforone() {
    recvmmsg_paced(libc::MSG_WAITFORONE);
}

fn recvmmsg_paced(flags: c_int) {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    T.store(0, Ordering::Release);
    let h = std::thread::spawn(move || {
        let mut rb = [[0u8; 4]; 3];
        let mut riov = iovecs_of(&mut rb);
        let mut rm = mmsg_headers(&mut riov);
        T.store(gettid(), Ordering::Release);
        // SAFETY: `rm` holds 3 mmsghdrs whose iovecs point into the writable `rb`; no timeout.
        let n = unsafe { libc::recvmmsg(s, rm.as_mut_ptr(), 3, flags, std::ptr::null_mut()) };
        let lens: Vec<u32> = rm.iter().map(|m| m.msg_len).collect();
        (n, lens, digest(&rb.concat()))
    });
    wait_blocked(&T);
    for m in [b"aaaa", b"bbbb", b"cccc"] {
        write_all(c, m);
        std::thread::sleep(Duration::from_millis(100));
    }
    let (n, lens, d) = h.join().unwrap();
    log(format!("recvmmsg(s) = {n} lens {lens:?} [{d}]"));
    close(c);
    rd("read(s) rest, then the end", s, 100);
    close(s);
}

fn close_while_poll_blocked() {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        // Its number is closed during the wait: the kernel says so (POLLNVAL) at the next wakeup.
        let (n, rev) = poll_raw(s, libc::POLLIN, 5000);
        (n, mask_names(rev as u16 as u32))
    });
    wait_blocked(&T);
    r("close(s) while poll blocks", close(s) as isize);
    write_all(c, b"late");
    let (n, m) = h.join().unwrap();
    log(format!("blocked poll = {n} {m}"));
    // The poll held the socket only while it waited.
    pl(
        "poll(c,IN|RDHUP) after the poll returned",
        c,
        libc::POLLIN | libc::POLLRDHUP,
        5000,
    );
    close(c);
}

fn double_close() {
    let (c, s) = pair();
    r("close(c)", close(c) as isize);
    r("close(c) again", close(c) as isize);
    r("write(c) closed fd", wr(c, b"x"));
    rd("read(s)", s, 10);
    close(s);
}

// ── connect ─────────────────────────────────────────────────────────────────────────────────

fn closed_port() -> u16 {
    let (l, port) = listener();
    close(l);
    port
}

fn connect_refused() {
    let port = closed_port();
    let c = tcp_socket();
    r("connect(closed port)", connect_to(c, port) as isize);
    so_error("SO_ERROR", c);
    r("write(c)", wr(c, b"x"));
    close(c);
}

fn connect_refused_nonblock() {
    let port = closed_port();
    let c = tcp_socket();
    set_nonblock(c, true);
    let rc = connect_to(c, port);
    log(format!(
        "connect(closed port) nonblocking = {}",
        if rc == 0 { "0".into() } else { ename(errno()) }
    ));
    pl("poll(c,OUT)", c, libc::POLLOUT, 5000);
    so_error("SO_ERROR", c);
    so_error("SO_ERROR again", c);
    rd("read(c)", c, 10);
    close(c);
}

fn setfl_between_connect_and_use() {
    let (c, s) = pair();
    set_nonblock(s, true);
    rd("read(s) nonblocking", s, 10);
    set_nonblock(s, false);
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        rd("read(s) blocking", s, 10)
    });
    wait_blocked(&T);
    write_all(c, b"late");
    h.join().unwrap();
    close(c);
    close(s);
}

fn connect_timeout_then_blocking() {
    // hiredis / libmysqlclient: non-blocking connect, poll with a timeout, check SO_ERROR, then
    // back to blocking for the conversation; the server is a thread that accepts by itself.
    let (l, port) = listener();
    let srv = std::thread::spawn(move || {
        let s = accept_fd(l);
        let req = read_n(s, 4);
        write_all(s, &req.repeat(3));
        close(s);
        close(l);
    });
    let c = tcp_socket();
    set_nonblock(c, true);
    let rc = connect_to(c, port);
    log(format!(
        "connect = {}",
        if rc == 0 { "0".into() } else { ename(errno()) }
    ));
    pl("poll(c,OUT) 2000", c, libc::POLLOUT, 2000);
    so_error("SO_ERROR", c);
    set_nonblock(c, false);
    r("write(c)", wr(c, b"ping"));
    let got = read_n(c, 100);
    log(format!("read(c) {} [{}]", got.len(), digest(&got)));
    srv.join().unwrap();
    close(c);
}

fn nonblock_connect_write_at_once() {
    let (l, port) = listener();
    let srv = std::thread::spawn(move || {
        let s = accept_fd(l);
        let got = read_n(s, 5);
        close(s);
        close(l);
        got
    });
    let c = tcp_socket();
    set_nonblock(c, true);
    let rc = connect_to(c, port);
    log(format!(
        "connect = {}",
        if rc == 0 { "0".into() } else { ename(errno()) }
    ));
    pl("poll(c,OUT)", c, libc::POLLOUT, 5000);
    // Written at once; a non-blocking write may only say EAGAIN, never lose bytes.
    let mut sent = 0;
    while sent < 5 {
        let n = wr(c, &b"hello"[sent..]);
        if n > 0 {
            sent += n as usize;
        } else if errno() == libc::EAGAIN {
            poll_raw(c, libc::POLLOUT, 5000);
        } else {
            r("write", n);
            break;
        }
    }
    let got = srv.join().unwrap();
    log(format!("server got [{}]", digest(&got)));
    close(c);
}

/// A server in a forked child (another process, so not a listener of ours): it accepts once
/// `go` says so (at once without it), reads 5 bytes and writes their digest to the returned
/// pipe. (port, go writer, result reader, child pid).
fn child_server(wait_go: bool) -> (u16, c_int, c_int, libc::pid_t) {
    let (port_r, port_w) = pipe();
    let (go_r, go_w) = pipe();
    let (res_r, res_w) = pipe();
    // SAFETY: the child runs socket calls only and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(port_r);
        close(go_w);
        close(res_r);
        let (l, port) = listener();
        write_all(port_w, &port.to_ne_bytes());
        if wait_go {
            read_n(go_r, 1);
        }
        let s = accept_fd(l);
        let got = read_n(s, 5);
        write_all(res_w, digest(&got).as_bytes());
        close(s);
        close(l);
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(port_w);
    close(go_r);
    close(res_w);
    let p = read_n(port_r, 2);
    close(port_r);
    (u16::from_ne_bytes([p[0], p[1]]), go_w, res_r, pid)
}

fn child_server_done(go: c_int, res: c_int, pid: libc::pid_t) {
    let got = read_n(res, 8);
    log(format!("server got [{}]", String::from_utf8_lossy(&got)));
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    close(go);
    close(res);
}

fn nonblock_first_write_after_pollout() {
    // A non-blocking connect, POLLOUT, then the first write: on TCP it takes the 5 bytes
    // (smc-scale and redis-benchmark count anything else as a failure). The data path
    // reports POLLOUT once its handshake is decided, so the write goes through too.
    let (port, go, res, pid) = child_server(false);
    let c = nonblock_client(port);
    pl("poll(c,OUT)", c, libc::POLLOUT, 5000);
    r("write(c) after POLLOUT", wr(c, b"hello"));
    child_server_done(go, res, pid);
    close(c);
}

fn nonblock_first_write_after_epollout() {
    // wrk's pattern: IN|OUT level-triggered, write on the first OUT.
    let (port, go, res, pid) = child_server(false);
    let c = nonblock_client(port);
    let ep = ep_create();
    let io = (libc::EPOLLIN | libc::EPOLLOUT) as u32;
    ep_ctl("ADD c IN|OUT", ep, libc::EPOLL_CTL_ADD, c, io, 0);
    ep_wait("wait IN|OUT", ep, 8, 5000, &names(CS));
    r("write(c) after EPOLLOUT", wr(c, b"hello"));
    child_server_done(go, res, pid);
    close(ep);
    close(c);
}

fn nonblock_write_server_not_accepting() {
    // A non-blocking write never waits: here the first one comes right after the connect,
    // while the server (another process, so not a listener of ours) has not accepted the
    // connection yet, and it accepts only once that write has returned. TCP takes the bytes
    // (or says EAGAIN if its handshake is not through yet); the data path's client stops
    // waiting for the server's Accept and goes on over TCP (`setup::write_before_accept`:
    // before, it said EAGAIN until the server accepted). It must not wait inside the write.
    let (port, go, res, pid) = child_server(true);
    let c = nonblock_client(port);
    let n = wr(c, b"hello");
    let e = errno();
    log(format!(
        "first write returned without waiting for the accept: {}",
        if n > 0 || e == libc::EAGAIN {
            "bytes or EAGAIN".to_string()
        } else {
            ename(e)
        }
    ));
    let mut sent = n.max(0) as usize;
    write_all(go, b"g");
    while sent < 5 {
        let n = wr(c, &b"hello"[sent..]);
        if n > 0 {
            sent += n as usize;
        } else if errno() == libc::EAGAIN {
            poll_raw(c, libc::POLLOUT, 5000);
        } else {
            r("write", n);
            break;
        }
    }
    child_server_done(go, res, pid);
    close(c);
}

fn connect_own_listener_one_thread() {
    // Blocking connect to our own listener, accepted afterwards by the same thread.
    let (l, port) = listener();
    let c = tcp_socket();
    r("connect(own listener)", connect_to(c, port) as isize);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    r("write(c)", wr(c, b"self"));
    rd("read(s)", s, 10);
    r("write(s)", wr(s, b"back"));
    rd("read(c)", c, 10);
    close(c);
    close(s);
    close(l);
}

fn own_listener_close_before_use_one_thread() {
    // The same, and the client end is closed before either end is used: both handshakes are
    // still under way (each end waits for the other's next operation). The server end reads
    // EOF, as on TCP, not a reset (the client's socket held the server's Accept unread).
    let (l, port) = listener();
    let c = tcp_socket();
    r("connect(own listener)", connect_to(c, port) as isize);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    eof_twice_after_close(c, s);
    close(l);
}

fn connect_own_listener_idle_thread() {
    // The same in a process with another thread, which never accepts (a worker waiting for
    // work): the connect does not wait for an Accept that only this thread can make, after
    // the call (it took the 2 s CLC timeout and fell back to TCP).
    let (stop_r, stop_w) = pipe();
    let idle = std::thread::spawn(move || {
        read_n(stop_r, 1);
        close(stop_r);
    });
    connect_own_listener_one_thread();
    write_all(stop_w, b"x");
    close(stop_w);
    let _ = idle.join();
}

/// A server (here a thread) that accepts and stays quiet until told to answer: the client's
/// readiness must come from the server's bytes, never from the handshake's messages (wrk
/// counted a read error when `EPOLLIN` came with nothing to read).
fn quiet_server() -> (u16, c_int, std::thread::JoinHandle<()>) {
    let (l, port) = listener();
    let (go_r, go_w) = pipe();
    let srv = std::thread::spawn(move || {
        let s = accept_fd(l);
        read_n(go_r, 1);
        write_all(s, b"hi");
        read_n(s, 2);
        close(s);
        close(l);
        close(go_r);
    });
    (port, go_w, srv)
}

fn nonblock_client(port: u16) -> c_int {
    let c = tcp_socket();
    set_nonblock(c, true);
    let rc = connect_to(c, port);
    log(format!(
        "connect = {}",
        if rc == 0 { "0".into() } else { ename(errno()) }
    ));
    c
}

fn epoll_connect_quiet_server() {
    let (port, go, srv) = quiet_server();
    let c = nonblock_client(port);
    let ep = ep_create();
    ep_ctl(
        "ADD c IN",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        libc::EPOLLIN as u32,
        0,
    );
    ep_wait("wait IN, server quiet (300 ms)", ep, 8, 300, &names(CS));
    rd("read(c)", c, 10);
    write_all(go, b"g");
    ep_wait("wait IN, server wrote", ep, 8, 5000, &names(CS));
    rd("read(c)", c, 10);
    write_all(c, b"ok");
    srv.join().unwrap();
    close(go);
    close(ep);
    close(c);
}

fn epoll_wait0_reports_each_entry_once() {
    // Python's selectors and many event loops: a set with a readable pipe (level-triggered)
    // and a non-blocking client whose handshake is under way, waited on with timeout 0 until
    // the client is writable. One call reports each entry at most once (a decision made inside
    // the call, then a second look at the kernel's set, reported the pipe twice: red team
    // round 11, `rt11_epdup.py`, about 1 call in 100 such connections).
    let (l, port) = listener();
    const N: usize = 500;
    let srv = std::thread::spawn(move || {
        for _ in 0..N {
            let s = accept_fd(l);
            let mut b = [0u8; 10];
            // SAFETY: valid buffer.
            unsafe { libc::read(s, b.as_mut_ptr().cast(), b.len()) };
            close(s);
        }
        close(l);
    });
    let (pr, pw) = pipe();
    write_all(pw, b"x");
    let mut twice = 0;
    let mut writable = 0;
    for _ in 0..N {
        let ep = ep_create();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: valid event.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, pr, &mut ev) };
        let c = tcp_socket();
        set_nonblock(c, true);
        connect_to(c, port);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT) as u32,
            u64: 2,
        };
        // SAFETY: valid event.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c, &mut ev) };
        // Until writable (a SYN dropped at a full accept queue is sent again after 1 s).
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(10) {
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
            // SAFETY: 8 entries.
            let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 0) }.max(0) as usize;
            let got = &evs[..n];
            if got.iter().filter(|e| e.u64 == 1).count() > 1
                || got.iter().filter(|e| e.u64 == 2).count() > 1
            {
                twice += 1;
                if twice == 1 {
                    let shown: Vec<String> = got
                        .iter()
                        .map(|e| format!("{}:{:#x}", { e.u64 }, { e.events }))
                        .collect();
                    log(format!("a call reporting an entry twice: {shown:?}"));
                }
            }
            if got
                .iter()
                .any(|e| e.u64 == 2 && e.events & libc::EPOLLOUT as u32 != 0)
            {
                writable += 1;
                break;
            }
        }
        set_nonblock(c, false);
        write_all(c, b"hi");
        close(ep);
        close(c);
    }
    log(format!("clients writable = {writable} of {N}"));
    log(format!("calls reporting an entry twice = {twice}"));
    let _ = srv.join();
    close(pr);
    close(pw);
}

fn epoll_connect_lt_in_out() {
    // wrk's pattern: read and write interest at once, level-triggered.
    let (port, go, srv) = quiet_server();
    let c = nonblock_client(port);
    let ep = ep_create();
    let io = (libc::EPOLLIN | libc::EPOLLOUT) as u32;
    ep_ctl("ADD c IN|OUT", ep, libc::EPOLL_CTL_ADD, c, io, 0);
    ep_wait("wait IN|OUT", ep, 8, 5000, &names(CS));
    ep_wait("wait IN|OUT, server quiet (300 ms)", ep, 8, 300, &names(CS));
    ep_ctl(
        "MOD c IN",
        ep,
        libc::EPOLL_CTL_MOD,
        c,
        libc::EPOLLIN as u32,
        0,
    );
    ep_wait("wait IN, server quiet (300 ms)", ep, 8, 300, &names(CS));
    rd("read(c)", c, 10);
    write_all(go, b"g");
    ep_wait("wait IN, server wrote", ep, 8, 5000, &names(CS));
    rd("read(c)", c, 10);
    write_all(c, b"ok");
    srv.join().unwrap();
    close(go);
    close(ep);
    close(c);
}

fn poll_connect_quiet_server() {
    let (port, go, srv) = quiet_server();
    let c = nonblock_client(port);
    pl("poll(c,OUT)", c, libc::POLLOUT, 5000);
    pl("poll(c,IN), server quiet (300 ms)", c, libc::POLLIN, 300);
    rd("read(c)", c, 10);
    write_all(go, b"g");
    pl("poll(c,IN), server wrote", c, libc::POLLIN, 5000);
    rd("read(c)", c, 10);
    write_all(c, b"ok");
    srv.join().unwrap();
    close(go);
    close(c);
}

fn epoll_close_while_dup_open() {
    // The kernel keeps a registration while the open file lives (here a dup keeps it): the
    // event may come for the closed number, but never with data the program did not register.
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(s) };
    close(s);
    // The peer's bytes and its close (FIN: the TCP socket becomes readable).
    write_all(c, b"x");
    close(c);
    let evs = ep_wait("wait after close(s), dup open", ep, 8, 300, &names(CS));
    let foreign = evs.iter().filter(|(d, _)| *d != 1).count();
    log(format!("events with data never registered = {foreign}"));
    assert_eq!(
        foreign, 0,
        "an event carried data the program never registered"
    );
    rd("read(dup)", d, 10);
    close(d);
    close(ep);
}

fn epoll_close_while_dup_open_then_dup_closed() {
    // The registration lives with the open file: under the closed number's data while the dup
    // keeps the file, gone with the file.
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(s) };
    close(s);
    write_all(c, b"x");
    ep_wait("wait, data after close(s)", ep, 8, 5000, &names(CS));
    rd("read(dup)", d, 10);
    ep_wait("wait, drained", ep, 8, 0, &names(CS));
    write_all(c, b"y");
    ep_wait("wait, more data", ep, 8, 5000, &names(CS));
    rd("read(dup)", d, 10);
    ep_ctl(
        "MOD s (closed number)",
        ep,
        libc::EPOLL_CTL_MOD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    ep_ctl("DEL s (closed number)", ep, libc::EPOLL_CTL_DEL, s, 0, 0);
    close(d);
    // The open file is gone, and its registration with it.
    write_all(c, b"z");
    ep_wait("wait after close(dup)", ep, 8, 100, &names(CS));
    // The number is free: a pipe registered there is a new registration.
    let (rp, wp) = pipe_at(s);
    ep_ctl(
        "ADD pipe at the number",
        ep,
        libc::EPOLL_CTL_ADD,
        rp,
        libc::EPOLLIN as u32,
        1,
    );
    write_all(wp, b"p");
    ep_wait("wait, the pipe", ep, 8, 5000, &names(CS));
    close(rp);
    close(wp);
    close(c);
    close(ep);
}

fn epoll_et_close_while_dup_open() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "ADD s IN|ET",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLET) as u32,
        1,
    );
    // SAFETY: plain dup.
    let d = unsafe { libc::dup(s) };
    close(s);
    write_all(c, b"x");
    ep_wait("wait, data after close(s)", ep, 8, 5000, &names(CS));
    ep_wait("wait again, no new edge", ep, 8, 0, &names(CS));
    write_all(c, b"y");
    ep_wait("wait, new data", ep, 8, 5000, &names(CS));
    rd("read(dup)", d, 10);
    close(d);
    close(c);
    close(ep);
}

// ── fd passing ───────────────────────────────────────────────────────────────────────────────

/// Sends `fd` over the Unix socket `u` with `SCM_RIGHTS` (one byte of data).
fn send_fd(u: c_int, fd: c_int) -> isize {
    let mut x = 0u8;
    let mut io = libc::iovec {
        iov_base: (&mut x as *mut u8).cast(),
        iov_len: 1,
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; the pointers are valid for the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut io;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_* on our own buffer, large enough for one int.
    unsafe {
        mh.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let c = libc::CMSG_FIRSTHDR(&mh);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut c_int, fd);
        libc::sendmsg(u, &mh, 0)
    }
}

/// Receives one fd sent with [`send_fd`] (-1 if none came).
fn recv_fd(u: c_int) -> c_int {
    let mut x = 0u8;
    let mut io = libc::iovec {
        iov_base: (&mut x as *mut u8).cast(),
        iov_len: 1,
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; the pointers are valid for the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut io;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: as above; CMSG_* walk our own buffer as the kernel filled it.
    unsafe {
        if libc::recvmsg(u, &mut mh, 0) != 1 {
            return -1;
        }
        let c = libc::CMSG_FIRSTHDR(&mh);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return -1;
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const c_int)
    }
}

/// A socket whose handshake is under way goes to another process (forked before the
/// connection existed, as a pre-forked worker is) and is closed here; `hand_over` makes it
/// (runs in a thread of this process once the other process is ready) and returns it, `serve`
/// is the other process's use of it.
fn pass_to_other_process(hand_over: impl FnOnce() -> c_int + Send + 'static, serve: fn(c_int)) {
    let mut sp = [0; 2];
    // SAFETY: out array of two ints.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sp.as_mut_ptr()) };
    assert_eq!(rc, 0);
    let (here, there) = (sp[0], sp[1]);
    let sender = std::thread::spawn(move || {
        read_n(here, 1);
        let fd = hand_over();
        let sent = send_fd(here, fd);
        close(fd);
        sent
    });
    in_child(move || {
        close(here);
        write_all(there, b"r");
        let fd = recv_fd(there);
        log(format!("received an fd = {}", fd >= 0));
        serve(fd);
        close(fd);
    });
    r("sendmsg(SCM_RIGHTS)", sender.join().unwrap());
    close(here);
    close(there);
}

fn scm_rights_client_mid_handshake() {
    // A non-blocking connect, passed on at once: the other process reads the server's bytes
    // exactly (never CLC bytes) and its answer reaches the server.
    let (l, port) = listener();
    let srv = std::thread::spawn(move || {
        let s = accept_fd(l);
        write_all(s, b"hello from the server");
        let got = read_n(s, 2);
        close(s);
        close(l);
        got
    });
    pass_to_other_process(
        move || nonblock_client(port),
        |c| {
            set_nonblock(c, false);
            let got = read_n(c, 21);
            log(format!("read {} bytes, digest {}", got.len(), digest(&got)));
            write_all(c, b"ok");
            rd("read(c) at the end", c, 10);
        },
    );
    let got = srv.join().unwrap();
    log(format!("server read {:?}", String::from_utf8_lossy(&got)));
}

fn scm_rights_accepted_mid_handshake() {
    // A pre-forked worker receives an accepted socket from its parent, which closes it: the
    // client's bytes reach the worker exactly and the worker's answer reaches the client.
    let (l, port) = listener();
    let cl = std::thread::spawn(move || {
        let c = tcp_socket();
        connect_to(c, port);
        write_all(c, b"hello from the client");
        let got = read_n(c, 2);
        close(c);
        got
    });
    pass_to_other_process(
        move || {
            let s = accept_fd(l);
            close(l);
            s
        },
        |s| {
            let got = read_n(s, 21);
            log(format!("read {} bytes, digest {}", got.len(), digest(&got)));
            write_all(s, b"ok");
        },
    );
    let got = cl.join().unwrap();
    log(format!("client read {:?}", String::from_utf8_lossy(&got)));
}

/// The other image of [`spawn_accepted_mid_handshake`] (`smc-conform __serve_fd FD LOG`):
/// reads the client's 21 bytes from the inherited socket and answers; its trace lines go to
/// the inherited pipe `LOG`.
pub fn serve_inherited_fd(fd: c_int, log_fd: c_int) {
    CHILD_PIPE.store(log_fd, Ordering::Relaxed);
    let got = read_n(fd, 21);
    log(format!("read {} bytes, digest {}", got.len(), digest(&got)));
    r("write(fd)", wr(fd, b"ok"));
    close(fd);
}

fn spawn_accepted_mid_handshake() {
    // An inetd-style server: the accepted socket is handed to a new image (posix_spawn, as
    // CPython's subprocess and Java do) at once; the client's bytes reach it exactly.
    let (l, port) = listener();
    let cl = std::thread::spawn(move || {
        let c = tcp_socket();
        connect_to(c, port);
        write_all(c, b"hello from the client");
        let got = read_n(c, 2);
        close(c);
        got
    });
    let s = accept_fd(l);
    close(l);
    let (rp, wp) = pipe();
    let exe = std::ffi::CString::new(
        std::env::current_exe()
            .unwrap()
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    let args: Vec<std::ffi::CString> = [
        "smc-conform".to_string(),
        "__serve_fd".into(),
        s.to_string(),
        wp.to_string(),
    ]
    .into_iter()
    .map(|a| std::ffi::CString::new(a).unwrap())
    .collect();
    let mut argv: Vec<*mut libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr() as *mut libc::c_char)
        .collect();
    argv.push(std::ptr::null_mut());
    extern "C" {
        static environ: *const *mut libc::c_char;
    }
    let mut pid = 0;
    // SAFETY: valid path, argv and environment, NULL-terminated; no file actions or attributes.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            exe.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr(),
            environ,
        )
    };
    log(format!("posix_spawn = {rc}"));
    close(wp);
    close(s);
    let out = read_n(rp, 1 << 16);
    close(rp);
    for l in String::from_utf8_lossy(&out).lines() {
        log(format!("child: {l}"));
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!("child exit {}", libc::WEXITSTATUS(st)));
    let got = cl.join().unwrap();
    log(format!("client read {:?}", String::from_utf8_lossy(&got)));
}

fn send_nosig(what: &str, fd: c_int, b: &[u8]) -> isize {
    // SAFETY: valid buffer.
    r(what, unsafe {
        libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL)
    })
}

fn own_client_server_speaks_first() {
    // One thread: a non-blocking connect to our own listener, the accept, and the server
    // greets before the client's next call (SMTP, FTP, MySQL speak first). TCP: the greeting
    // is sent at once and read by the client.
    let (l, port) = listener();
    let c = nonblock_client(port);
    pl("poll(c, OUT)", c, libc::POLLOUT, 5000);
    let s = accept_fd(l);
    send_nosig("send(s, greeting)", s, b"220 hello\r\n");
    set_nonblock(c, false);
    rd("read(c)", c, 100);
    send_nosig("send(c)", c, b"ok");
    rd("read(s)", s, 100);
    close(c);
    close(s);
    close(l);
}

fn idle_client_server_speaks_first() {
    // A connection pool: the client connects non-blocking (a connect timeout), its first call
    // finds nothing, and it keeps the connection idle while its server (another process, a
    // blocking accept) greets; it reads later. TCP: the greeting is there.
    let (l, port) = listener();
    let (go_r, go_w) = pipe();
    let (done_r, done_w) = pipe();
    let (log_r, log_w) = pipe();
    // SAFETY: the child only runs the server and exits; no other thread exists yet.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(log_r);
        CHILD_PIPE.store(log_w, Ordering::Relaxed);
        read_n(go_r, 1);
        let s = accept_fd(l);
        log(format!("accept = {}", s >= 0));
        send_nosig("send(s, greeting)", s, b"220 hello\r\n");
        close(s);
        write_all(done_w, b"d");
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(log_w);
    close(l);
    let c = nonblock_client(port);
    pl("poll(c, OUT)", c, libc::POLLOUT, 5000);
    recv_l("recv(c, DONTWAIT)", c, 100, libc::MSG_DONTWAIT);
    write_all(go_w, b"g");
    read_n(done_r, 1);
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    for line in String::from_utf8_lossy(&read_n(log_r, 1 << 16)).lines() {
        log(format!("server: {line}"));
    }
    set_nonblock(c, false);
    rd("read(c)", c, 100);
    rd("read(c) again", c, 100);
    for fd in [c, go_r, go_w, done_r, done_w, log_r] {
        close(fd);
    }
}

fn epoll_server_greets_idle_client() {
    // The same idle client, served by an event loop (another process, non-blocking sockets,
    // epoll): it accepts, waits for EPOLLOUT, greets (a write that says EAGAIN waits for the
    // next EPOLLOUT, as any event loop does; only the final result is logged) and closes. TCP:
    // the greeting goes out at once and is there when the client reads.
    let (l, port) = listener();
    set_nonblock(l, true);
    let (go_r, go_w) = pipe();
    let (done_r, done_w) = pipe();
    let (log_r, log_w) = pipe();
    // SAFETY: the child only runs the server and exits; no other thread exists yet.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(log_r);
        CHILD_PIPE.store(log_w, Ordering::Relaxed);
        read_n(go_r, 1);
        let ep = ep_create();
        ep_ctl(
            "ADD l IN",
            ep,
            libc::EPOLL_CTL_ADD,
            l,
            libc::EPOLLIN as u32,
            0,
        );
        ep_wait("epoll_wait (listener)", ep, 4, 5000, &names(&["l", "s"]));
        // SAFETY: no address wanted.
        let s = unsafe {
            libc::accept4(
                l,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK,
            )
        };
        log(format!("accept4 = {}", s >= 0));
        ep_ctl(
            "ADD s OUT",
            ep,
            libc::EPOLL_CTL_ADD,
            s,
            libc::EPOLLOUT as u32,
            1,
        );
        let greeting = b"220 hello\r\n";
        let mut sent = -1;
        for _ in 0..100 {
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: 4 entries.
            let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 10_000) };
            if n <= 0 {
                break;
            }
            // SAFETY: valid buffer.
            sent = unsafe {
                libc::send(
                    s,
                    greeting.as_ptr().cast(),
                    greeting.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if sent >= 0 || errno() != libc::EAGAIN {
                break;
            }
        }
        r("send(s, greeting) once writable", sent);
        close(s);
        close(ep);
        write_all(done_w, b"d");
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(log_w);
    close(l);
    let c = nonblock_client(port);
    pl("poll(c, OUT)", c, libc::POLLOUT, 5000);
    recv_l("recv(c, DONTWAIT)", c, 100, libc::MSG_DONTWAIT);
    write_all(go_w, b"g");
    read_n(done_r, 1);
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    for line in String::from_utf8_lossy(&read_n(log_r, 1 << 16)).lines() {
        log(format!("server: {line}"));
    }
    set_nonblock(c, false);
    rd("read(c)", c, 100);
    rd("read(c) again", c, 100);
    for fd in [c, go_r, go_w, done_r, done_w, log_r] {
        close(fd);
    }
}

fn blocking_accept_silent_client() {
    // A same-host client that announces SMC and never speaks (made with raw system calls, as
    // a program without the library would) must not hold up a blocking accept loop while the
    // next client waits in the queue: accept returns at once, the next client is served, and
    // nothing is sent to the silent one (before the fix, accept waited 2 s for its Proposal
    // and then sent it a Decline).
    let (l, port) = listener();
    // SAFETY: raw system calls with valid arguments; the library does not see them.
    let raw =
        unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) } as c_int;
    let on: u32 = 1;
    let a = sa(port);
    // SAFETY: as above (the option fails where no eBPF program serves it: plain TCP).
    unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            raw,
            smc_common::bpf::SOL_SMC_BPF,
            smc_common::bpf::SMC_SO_ENABLE,
            &on as *const u32,
            4,
        );
        assert_eq!(
            libc::syscall(
                libc::SYS_connect,
                raw,
                &a as *const libc::sockaddr_in,
                SALEN
            ),
            0
        );
    }
    // The next client, in its own thread (a blocking connect): queued behind the silent one
    // before the first accept (the listener's TCP_INFO counts its accept queue).
    let cl = std::thread::spawn(move || {
        let c = tcp_socket();
        connect_to(c, port);
        write_all(c, b"ping");
        let got = read_n(c, 4);
        close(c);
        got
    });
    let t = Instant::now();
    loop {
        // SAFETY: tcp_info is plain data; valid out buffer and length.
        let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: as above.
        unsafe {
            libc::getsockopt(
                l,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut ti as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        if ti.tcpi_unacked >= 2 || t.elapsed() > Duration::from_secs(5) {
            log(format!("accept queue = {}", ti.tcpi_unacked));
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let silent = accept_fd(l);
    log(format!("accept(silent client) = {}", silent >= 0));
    let s = accept_fd(l);
    log(format!("accept(next client) = {}", s >= 0));
    rd("read(s) from the next client", s, 10);
    write_all(s, b"pong");
    let got = cl.join().unwrap();
    log(format!(
        "next client read {:?}",
        String::from_utf8_lossy(&got)
    ));
    pl("poll(silent client, IN)", raw, libc::POLLIN, 0);
    close(s);
    close(silent);
    close(raw);
    close(l);
}

fn accept_nonblock_empty() {
    let (l, _) = listener();
    set_nonblock(l, true);
    r("accept(nonblocking, empty)", accept_fd(l) as isize);
    pl("poll(l,IN)", l, libc::POLLIN, 0);
    close(l);
}

// ── data calls ──────────────────────────────────────────────────────────────────────────────

fn msg_peek() {
    let (c, s) = pair();
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv_l("recv(s,4,PEEK)", s, 4, libc::MSG_PEEK);
    recv_l("recv(s,100,PEEK)", s, 100, libc::MSG_PEEK);
    recv_l("recv(s,3)", s, 3, 0);
    recv_l(
        "recv(s,100,PEEK|DONTWAIT)",
        s,
        100,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
    );
    recv_l("recv(s,100)", s, 100, 0);
    recv_l(
        "recv(s,100,PEEK|DONTWAIT) empty",
        s,
        100,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
    );
    close(c);
    close(s);
}

fn msg_waitall() {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        recv_l("recv(s,12,WAITALL)", s, 12, libc::MSG_WAITALL)
    });
    wait_blocked(&T);
    write_all(c, b"0123");
    write_all(c, b"4567");
    wait_blocked(&T);
    write_all(c, b"89ab");
    h.join().unwrap();
    write_all(c, b"xy");
    close(c);
    recv_l("recv(s,12,WAITALL) at eof", s, 12, libc::MSG_WAITALL);
    close(s);
}

fn msg_trunc() {
    let (c, s) = pair();
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    // SAFETY: TCP's MSG_TRUNC discards without copying: a NULL buffer is fine.
    r("recv(s,NULL,4,TRUNC)", unsafe {
        libc::recv(s, std::ptr::null_mut(), 4, libc::MSG_TRUNC)
    });
    recv_l("recv(s,100)", s, 100, 0);
    close(c);
    close(s);
}

fn msg_dontwait() {
    let (c, s) = pair();
    recv_l("recv(s,DONTWAIT) empty", s, 10, libc::MSG_DONTWAIT);
    write_all(c, b"abc");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv_l("recv(s,DONTWAIT)", s, 10, libc::MSG_DONTWAIT);
    close(c);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv_l("recv(s,DONTWAIT) eof", s, 10, libc::MSG_DONTWAIT);
    close(s);
}

fn ioctl_int(fd: c_int, req: libc::c_ulong) -> (c_int, c_int) {
    let mut v: c_int = -7;
    // SAFETY: valid out pointer.
    let rc = unsafe { libc::ioctl(fd, req, &mut v) };
    (rc, v)
}

fn fionread() {
    let (c, s) = pair();
    log(format!("FIONREAD idle {:?}", ioctl_int(s, libc::FIONREAD)));
    write_all(c, &[1u8; 1234]);
    let t = Instant::now();
    // Bytes arrive together on loopback; wait until all are there.
    while ioctl_int(s, libc::FIONREAD).1 < 1234 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    log(format!("FIONREAD {:?}", ioctl_int(s, libc::FIONREAD)));
    log(format!("SIOCINQ {:?}", ioctl_int(s, 0x541B)));
    read_n(s, 1000);
    log(format!(
        "FIONREAD after 1000 {:?}",
        ioctl_int(s, libc::FIONREAD)
    ));
    close(c);
    close(s);
}

fn siocoutq_after_read() {
    let (c, s) = pair();
    write_all(c, &[1u8; 3000]);
    read_n(s, 3000);
    log(format!(
        "SIOCOUTQ after the peer read all {:?}",
        ioctl_int(c, libc::TIOCOUTQ)
    ));
    close(c);
    close(s);
}

fn siocoutq_unread() {
    let (c, s) = pair();
    write_all(c, &[1u8; 3000]);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    log(format!(
        "SIOCOUTQ while unread {:?}",
        ioctl_int(c, libc::TIOCOUTQ)
    ));
    close(c);
    close(s);
}

fn so_rcvtimeo() {
    let (c, s) = pair();
    let t = tv(50);
    r(
        "SO_RCVTIMEO 50ms",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t) as isize,
    );
    rd("read(s) times out", s, 10);
    write_all(c, b"x");
    rd("read(s)", s, 10);
    close(c);
    close(s);
}

fn so_sndtimeo() {
    let (c, s) = pair();
    let t = tv(50);
    r(
        "SO_SNDTIMEO 50ms",
        setsockopt_raw(c, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &t) as isize,
    );
    let chunk = vec![3u8; 1 << 20];
    let mut total = 0usize;
    let mut end = String::from("no error");
    // Until a write fails: the timeout hit with nothing written (short writes before that).
    for _ in 0..1000 {
        let n = wr(c, &chunk);
        if n < 0 {
            end = ename(errno());
            break;
        }
        total += n as usize;
    }
    log(format!(
        "blocking writes end with {end} (some bytes first: {})",
        total > 0
    ));
    let got = read_n(s, total);
    log(format!("peer reads all: {}", got.len() == total));
    close(c);
    close(s);
}

fn so_rcvlowat() {
    let (c, s) = pair();
    let v: c_int = 8;
    r(
        "SO_RCVLOWAT 8",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
    );
    write_all(c, b"1234");
    pl("poll(s,IN) 4 bytes < lowat, 50ms", s, libc::POLLIN, 50);
    write_all(c, b"5678");
    pl("poll(s,IN) 8 bytes", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

fn so_rcvlowat_blocking_read() {
    // A blocking read waits for SO_RCVLOWAT bytes (tcp_recvmsg's target), not for the first
    // byte; MSG_DONTWAIT returns what is there.
    let (c, s) = pair();
    let v: c_int = 8;
    r(
        "SO_RCVLOWAT 8",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
    );
    write_all(c, b"12");
    recv_l("recv(s, 1, DONTWAIT)", s, 1, libc::MSG_DONTWAIT);
    write_all(c, b"34");
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        rd("read(s) blocks until 8 bytes", s, 100)
    });
    wait_blocked(&T);
    write_all(c, b"5678");
    let _ = h.join();
    recv_l("recv(s, DONTWAIT) nothing left", s, 100, libc::MSG_DONTWAIT);
    // Fewer bytes asked than the mark: the read returns them.
    write_all(c, b"abc");
    rd("read(s, 2) < lowat", s, 2);
    close(c);
    close(s);
}

fn so_rcvlowat_epoll() {
    // epoll reports IN only from SO_RCVLOWAT bytes on, level- and edge-triggered.
    let (c, s) = pair();
    let v: c_int = 6;
    r(
        "SO_RCVLOWAT 6",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
    );
    let nm = names(&["", "s", "s(ET)"]);
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    let et = ep_create();
    ep_ctl(
        "ADD s IN|ET",
        et,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLET) as u32,
        2,
    );
    write_all(c, b"123");
    ep_wait("epoll_wait 3 bytes < lowat", ep, 4, 50, &nm);
    ep_wait("epoll_wait ET 3 bytes < lowat", et, 4, 50, &nm);
    write_all(c, b"456");
    ep_wait("epoll_wait 6 bytes", ep, 4, 5000, &nm);
    ep_wait("epoll_wait ET 6 bytes", et, 4, 5000, &nm);
    rd("read(s)", s, 100);
    close(ep);
    close(et);
    close(c);
    close(s);
}

/// Runs `f` in a thread once the calling thread sleeps in the kernel (after `start`).
fn when_blocked(f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    static ME: AtomicI32 = AtomicI32::new(0);
    ME.store(gettid(), Ordering::Release);
    std::thread::spawn(move || {
        wait_blocked(&ME);
        f();
    })
}

fn so_rcvlowat_lowered_wakes_poll() {
    // Another thread lowers SO_RCVLOWAT below what is queued: the sleeping poll wakes
    // (tcp_set_rcvlowat wakes the readers).
    let (c, s) = pair();
    let v: c_int = 1000;
    r(
        "SO_RCVLOWAT 1000",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
    );
    write_all(c, b"0123456789");
    let h = when_blocked(move || {
        let v: c_int = 1;
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v);
    });
    pl(
        "poll(s,IN) until the mark is lowered",
        s,
        libc::POLLIN,
        5000,
    );
    h.join().unwrap();
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

fn so_rcvlowat_lowered_wakes_epoll() {
    let (c, s) = pair();
    let v: c_int = 1000;
    r(
        "SO_RCVLOWAT 1000",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
    );
    write_all(c, b"0123456789");
    let ep = ep_create();
    ep_ctl(
        "ADD s IN",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        libc::EPOLLIN as u32,
        1,
    );
    let h = when_blocked(move || {
        let v: c_int = 1;
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v);
    });
    ep_wait(
        "epoll_wait until the mark is lowered",
        ep,
        4,
        5000,
        &names(&["", "s"]),
    );
    h.join().unwrap();
    rd("read(s)", s, 100);
    close(ep);
    close(c);
    close(s);
}

fn shutdown_rd_wakes_poll() {
    // Another thread shuts the reading side of a socket this thread polls: it wakes with
    // IN|RDHUP, as TCP's shutdown wakes its sleepers.
    let (c, s) = pair();
    let h = when_blocked(move || {
        // SAFETY: plain call.
        unsafe { libc::shutdown(s, libc::SHUT_RD) };
    });
    pl(
        "poll(s,IN|RDHUP) until shut",
        s,
        libc::POLLIN | libc::POLLRDHUP,
        5000,
    );
    h.join().unwrap();
    rd("read(s)", s, 10);
    close(c);
    close(s);
}

fn rcvtimeo_sa_restart_eintr() {
    // A socket with SO_RCVTIMEO is never restarted after a signal, SA_RESTART or not
    // (sock_intr_errno, signal(7)): EINTR.
    handle(libc::SIGUSR1, true);
    let (c, s) = pair();
    let t = tv(5000);
    r(
        "SO_RCVTIMEO 5s",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t) as isize,
    );
    // SAFETY: plain call.
    let me = unsafe { libc::pthread_self() };
    let h = when_blocked(move || {
        // SAFETY: the main thread is alive (it joins this one).
        unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
    });
    recv_l("recv(s) blocking, SA_RESTART signal", s, 10, 0);
    h.join().unwrap();
    write_all(c, b"data");
    rd("read(s)", s, 10);
    close(c);
    close(s);
}

fn so_error_after_reported_reset() {
    // The peer aborts (SO_LINGER 0) after writing: the data, ECONNRESET, then EOF; SO_ERROR has
    // nothing left to report.
    let (c, s) = pair();
    write_all(c, b"0123456789");
    linger0(c);
    close(c);
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    rd("read(s) again", s, 100);
    rd("read(s) a third time", s, 100);
    so_error("SO_ERROR(s)", s);
    close(s);
}

/// `connect(AF_UNSPEC)` on an established connection (`tcp_disconnect`): the peer gets a
/// reset, this end's read says `ECONNRESET` then `ENOTCONN`, its write `EPIPE`; the same
/// socket then connects to another server as a fresh connection, and its bytes go there.
fn connect_unspec_disconnects() {
    count_sigpipe();
    let (c, s) = pair_settled();
    write_all(s, b"unread");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    // SAFETY: a zeroed sockaddr is valid (AF_UNSPEC is 0).
    let u: libc::sockaddr = unsafe { std::mem::zeroed() };
    r(
        "connect(c,AF_UNSPEC)",
        // SAFETY: a valid address of its length.
        unsafe { libc::connect(c, &u, std::mem::size_of::<libc::sockaddr>() as _) } as isize,
    );
    pl(
        "poll(s,IN|RDHUP) after the disconnect",
        s,
        libc::POLLIN | libc::POLLRDHUP,
        5000,
    );
    rd("read(s)", s, 10);
    rd("read(s) again", s, 10);
    r("write(s)", wr(s, b"y"));
    pl(
        "poll(c,IN|OUT|RDHUP)",
        c,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        0,
    );
    rd("read(c)", c, 10);
    rd("read(c) again", c, 10);
    r("write(c)", wr(c, b"x"));
    // SAFETY: plain old data.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut al = SALEN;
    r(
        "getpeername(c)",
        // SAFETY: valid out buffers.
        unsafe { libc::getpeername(c, &mut a as *mut _ as *mut libc::sockaddr, &mut al) } as isize,
    );
    log_sigpipes();
    close(s);
    let (l2, port2) = listener();
    r(
        "connect(c) to another server",
        connect_to(c, port2) as isize,
    );
    let s2 = accept_fd(l2);
    r("write(c,hello)", wr(c, b"hello"));
    pl("poll(s2,IN)", s2, libc::POLLIN, 5000);
    rd("read(s2)", s2, 10);
    r("write(s2,world)", wr(s2, b"world"));
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    rd("read(c) from the new server", c, 10);
    close(c);
    close(s2);
    close(l2);
}

/// [`connect_unspec_disconnects`] with a second number of the socket (`dup`) and the socket
/// in an epoll set: both numbers see the disconnected socket (one `ECONNRESET` between them),
/// the set reports it as TCP's, and after it connected to another server the set reports the
/// new server's bytes, read through the other number.
fn connect_unspec_dup_epoll_reconnect() {
    const CS: &[&str] = &["c"];
    let (c, s) = pair_settled();
    // SAFETY: plain syscall.
    let d = unsafe { libc::dup(c) };
    let ep = ep_create();
    ep_ctl("add c", ep, libc::EPOLL_CTL_ADD, c, libc::EPOLLIN as u32, 0);
    ep_wait("wait(0) idle", ep, 8, 0, &names(CS));
    // SAFETY: a zeroed sockaddr is valid (AF_UNSPEC is 0).
    let u: libc::sockaddr = unsafe { std::mem::zeroed() };
    r(
        "connect(c,AF_UNSPEC)",
        // SAFETY: a valid address of its length.
        unsafe { libc::connect(c, &u, std::mem::size_of::<libc::sockaddr>() as _) } as isize,
    );
    ep_wait("wait after the disconnect", ep, 8, 5000, &names(CS));
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    rd("read(s)", s, 10);
    rd("read(dup of c)", d, 10);
    rd("read(c)", c, 10);
    close(s);
    let (l2, port2) = listener();
    r(
        "connect(c) to another server",
        connect_to(c, port2) as isize,
    );
    let s2 = accept_fd(l2);
    ep_wait("wait(0) connected, idle", ep, 8, 0, &names(CS));
    write_all(s2, b"world");
    ep_wait("wait for the new server's bytes", ep, 8, 5000, &names(CS));
    rd("read(dup of c)", d, 10);
    r("write(dup of c)", wr(d, b"hello"));
    pl("poll(s2,IN)", s2, libc::POLLIN, 5000);
    rd("read(s2)", s2, 10);
    close(ep);
    close(d);
    close(c);
    close(s2);
    close(l2);
}

/// Writing to a peer that shut both ways without closing (`shutdown(SHUT_RDWR)`): its kernel
/// answers data after its `SHUT_RD` with a reset (`tcp_rcv_state_process`, FIN_WAIT with
/// `RCV_SHUTDOWN`): the first write succeeds, the next says `EPIPE`, and the peer reads
/// `ECONNRESET`.
fn write_to_peer_shut_rdwr() {
    count_sigpipe();
    let (c, s) = pair_settled();
    r(
        "shutdown(c,RDWR)",
        // SAFETY: `c` is a socket fd this scenario owns; shutdown touches no memory.
        unsafe { libc::shutdown(c, libc::SHUT_RDWR) } as isize,
    );
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    rd("read(s) at EOF", s, 10);
    r("write(s) 1st", wr(s, b"hello"));
    pl(
        "poll(s,IN|OUT) after 1st write",
        s,
        libc::POLLIN | libc::POLLOUT,
        5000,
    );
    r("write(s) 2nd", wr(s, b"hello"));
    set_nonblock(s, true);
    r("write(s) 3rd, non-blocking", wr(s, b"hello"));
    log_sigpipes();
    so_error("SO_ERROR(s)", s);
    rd("read(s)", s, 10);
    pl(
        "poll(c,IN|OUT|RDHUP)",
        c,
        libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        5000,
    );
    rd("read(c)", c, 10);
    rd("read(c) again", c, 10);
    close(c);
    close(s);
}

/// The peer shuts writing, then closes with our bytes unread (a reset): its FIN came first,
/// so a read is at the end of the stream (`SOCK_DONE`), blocking or not, and the reset leaves
/// `EPIPE` pending (`tcp_reset` in CLOSE_WAIT) for `SO_ERROR` or the next write.
fn peer_fin_then_reset() {
    count_sigpipe();
    for so_error_first in [true, false] {
        let (c, s) = pair_settled();
        write_all(c, b"abc");
        write_all(s, b"xyz");
        pl("poll(s,IN)", s, libc::POLLIN, 5000);
        pl("poll(c,IN)", c, libc::POLLIN, 5000);
        r(
            "shutdown(s,WR)",
            // SAFETY: `s` is a socket fd this scenario owns; shutdown touches no memory.
            unsafe { libc::shutdown(s, libc::SHUT_WR) } as isize,
        );
        r("close(s) with unread data", close(s) as isize);
        pl(
            "poll(c,IN|OUT|RDHUP)",
            c,
            libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
            5000,
        );
        rd("read(c) data", c, 10);
        rd("read(c) after FIN and reset", c, 10);
        rd("read(c) again", c, 10);
        if so_error_first {
            so_error("SO_ERROR(c)", c);
            so_error("SO_ERROR(c) again", c);
            r("write(c)", wr(c, b"q"));
        } else {
            r("write(c)", wr(c, b"q"));
            so_error("SO_ERROR(c)", c);
            r("write(c) again", wr(c, b"q"));
        }
        pl(
            "poll(c,IN|OUT|RDHUP) at the end",
            c,
            libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
            0,
        );
        log_sigpipes();
        close(c);
    }
}

fn fionbio() {
    let (c, s) = pair();
    let on: c_int = 1;
    // SAFETY: valid pointer.
    r(
        "ioctl(s,FIONBIO,1)",
        unsafe { libc::ioctl(s, libc::FIONBIO, &on) } as isize,
    );
    rd("read(s)", s, 10);
    let off: c_int = 0;
    // SAFETY: valid pointer.
    r(
        "ioctl(s,FIONBIO,0)",
        unsafe { libc::ioctl(s, libc::FIONBIO, &off) } as isize,
    );
    write_all(c, b"x");
    rd("read(s) blocking", s, 10);
    close(c);
    close(s);
}

extern "C" {
    fn __read_chk(fd: c_int, buf: *mut libc::c_void, n: usize, buflen: usize) -> isize;
    fn __recv_chk(
        fd: c_int,
        buf: *mut libc::c_void,
        n: usize,
        buflen: usize,
        flags: c_int,
    ) -> isize;
}

fn read_chk_buflen() {
    let (c, s) = pair();
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    in_child(|| {
        let mut b = [0u8; 64];
        // SAFETY: the buffer holds 64; n within buflen.
        let k = unsafe { __read_chk(s, b.as_mut_ptr().cast(), 4, 8) };
        r("__read_chk(n=4,buflen=8)", k);
        // SAFETY: n > buflen: glibc aborts before the call.
        let k = unsafe { __read_chk(s, b.as_mut_ptr().cast(), 16, 8) };
        r("__read_chk(n=16,buflen=8)", k);
    });
    close(c);
    close(s);
}

fn recv_chk_buflen() {
    let (c, s) = pair();
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    in_child(|| {
        let mut b = [0u8; 64];
        // SAFETY: n within buflen.
        let k = unsafe { __recv_chk(s, b.as_mut_ptr().cast(), 4, 8, 0) };
        r("__recv_chk(n=4,buflen=8)", k);
        // SAFETY: n > buflen: glibc aborts before the call.
        let k = unsafe { __recv_chk(s, b.as_mut_ptr().cast(), 16, 8, 0) };
        r("__recv_chk(n=16,buflen=8)", k);
    });
    close(c);
    close(s);
}

fn bad_pointer_read() {
    let (c, s) = pair();
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    in_child(|| {
        // SAFETY: deliberately invalid pointer: the kernel answers EFAULT.
        let k = unsafe { libc::read(s, 8 as *mut libc::c_void, 10) };
        r("read(s, bad pointer)", k);
        // SAFETY: deliberately invalid pointer: the kernel answers EFAULT.
        let k = unsafe { libc::recv(s, 8 as *mut libc::c_void, 10, libc::MSG_PEEK) };
        r("recv(s, bad pointer, PEEK)", k);
    });
    rd("read(s) after", s, 100);
    close(c);
    close(s);
}

fn bad_pointer_write() {
    let (c, s) = pair();
    in_child(|| {
        // SAFETY: deliberately invalid pointer: the kernel answers EFAULT.
        let k = unsafe { libc::write(c, 8 as *const libc::c_void, 10) };
        r("write(c, bad pointer)", k);
    });
    write_all(c, b"ok");
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

/// A server, a forked process, that accepts only once told to (a byte on the returned pipe):
/// then it serves `n` connections, each 3 bytes read and answered with `ok:` and them. Returns
/// its port, pid and the pipe's write end.
fn late_server(n: usize) -> (u16, libc::pid_t, c_int) {
    let (l, port) = listener();
    let (rp, wp) = pipe();
    // SAFETY: the child only serves `n` connections and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(wp);
        let _ = read_n(rp, 1);
        for _ in 0..n {
            let s = accept_fd(l);
            let mut out = b"ok:".to_vec();
            out.extend(read_n(s, 3));
            write_all(s, &out);
            close(s);
        }
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(rp);
    close(l);
    (port, pid, wp)
}

/// A server ([`late_server`]) waited for, its exit status logged.
fn reap_server(pid: libc::pid_t) {
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!("server exit {}", libc::WEXITSTATUS(st)));
}

/// A server busy elsewhere accepts its clients only after they connected and wrote (red team
/// rt16 `rt16_lateaccept.py`; here it accepts once the clients are done, told through a
/// pipe): TCP completes the connect and queues the first bytes at once. A server's library
/// answers the client's Proposal only once its program accepts, and the client waited for that
/// Accept up to the CLC timeout (2 s): a non-blocking `send` right after a blocking connect said
/// `EAGAIN` with no `POLLOUT` for a second, a connect with a 1 s timeout (non-blocking, then
/// `poll` for `POLLOUT`, as Python's `create_connection(timeout=1)`) failed. Both clients now
/// go on over TCP (no SMC-D connection: the server accepts after their wait for it ended).
fn clients_of_a_server_that_accepts_late() {
    let (port, pid, wp) = late_server(2);
    let c1 = tcp_socket();
    r("connect(c1) blocking", connect_to(c1, port) as isize);
    set_nonblock(c1, true);
    r("send(c1, 3 bytes) non-blocking", wr(c1, b"GET"));
    pl("poll(c1, OUT, 1 s)", c1, libc::POLLOUT, 1000);
    let c2 = tcp_socket();
    set_nonblock(c2, true);
    let rc = connect_to(c2, port);
    let e = errno();
    log(format!(
        "connect(c2) nonblocking = {}",
        if rc == 0 { "0".into() } else { ename(e) }
    ));
    pl("poll(c2, OUT, 1 s)", c2, libc::POLLOUT, 1000);
    so_error("SO_ERROR(c2)", c2);
    r("send(c2, 3 bytes) non-blocking", wr(c2, b"PUT"));
    write_all(wp, b"g");
    close(wp);
    for (name, c) in [("c1", c1), ("c2", c2)] {
        set_nonblock(c, false);
        let got = read_n(c, 6);
        log(format!("{name} read {:?}", String::from_utf8_lossy(&got)));
        close(c);
    }
    reap_server(pid);
}

/// An event-loop client (non-blocking connect, `EPOLLOUT` edge-triggered and level-triggered)
/// of a server that accepts only once the client is done (told through a pipe): TCP reports the
/// connect complete at once. The client's handshake waits for the Accept until the accept wait
/// ends at an epoll tick, then falls back (TCP, skipping the late CLC messages): that step
/// reported no `EPOLLOUT` (the socket's own edge had come long before), so a client that
/// writes first waited for ever (`smc-scale` at 65 536 connections: every connect in flight
/// of a client stuck so, `epoll_wait` 0 after 1 s here).
fn epoll_client_of_a_server_that_accepts_late() {
    let (port, pid, wp) = late_server(2);
    let ep = ep_create();
    let name = names(&["c1", "c2"]);
    let mut cs = Vec::new();
    for (i, flags) in [(0u64, libc::EPOLLET as u32), (1, 0)] {
        let c = tcp_socket();
        set_nonblock(c, true);
        let rc = connect_to(c, port);
        let e = errno();
        log(format!(
            "connect(c{}) nonblocking = {}",
            i + 1,
            if rc == 0 { "0".into() } else { ename(e) }
        ));
        ep_ctl(
            "epoll_ctl(ADD, OUT)",
            ep,
            libc::EPOLL_CTL_ADD,
            c,
            libc::EPOLLOUT as u32 | flags,
            i,
        );
        // The connect completes (once for the edge-triggered entry, the other level).
        let got = ep_wait("epoll_wait(1 s)", ep, 4, 1000, &name);
        log(format!(
            "c{} writable: {}",
            i + 1,
            got.iter()
                .any(|(d, m)| *d == i && m & libc::EPOLLOUT as u32 != 0)
        ));
        r(&format!("send(c{}, 3 bytes)", i + 1), wr(c, b"GET"));
        ep_ctl("epoll_ctl(DEL)", ep, libc::EPOLL_CTL_DEL, c, 0, i);
        cs.push(c);
    }
    write_all(wp, b"g");
    close(wp);
    for (i, c) in cs.into_iter().enumerate() {
        set_nonblock(c, false);
        let got = read_n(c, 6);
        log(format!(
            "c{} read {:?}",
            i + 1,
            String::from_utf8_lossy(&got)
        ));
        close(c);
    }
    close(ep);
    reap_server(pid);
}

/// `splice` from the socket into a blocking pipe with room for one page only, as a proxy does
/// (haproxy `option splice-response`, whose own thread empties the pipe later): it moves what
/// fits and returns, never waiting for room (the library wrote all it had read into the pipe
/// and blocked for good: 20 of 60 haproxy transfers hung). With `SPLICE_F_NONBLOCK` a full pipe
/// says EAGAIN, and so does an empty one spliced into the socket.
fn splice_socket_into_a_nearly_full_pipe() {
    let (c, s) = pair();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    write_all(c, &data);
    let t = Instant::now();
    while ioctl_int(s, libc::FIONREAD).1 < data.len() as c_int
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (rp, wp) = pipe();
    // 15 of the pipe's 16 pages taken.
    write_all(wp, &[7u8; 15 * 4096]);
    let null = std::ptr::null_mut();
    for flags in [0, libc::SPLICE_F_NONBLOCK] {
        // SAFETY: socket -> pipe, no offsets.
        let k = unsafe { libc::splice(s, null, wp, null, 65536, flags) };
        log(format!(
            "splice(s -> pipe with one free page, flags {flags}) = {}",
            if k < 0 {
                ename(errno())
            } else if k > 0 && k <= 4096 {
                "at most a page".into()
            } else {
                format!("{k}")
            }
        ));
    }
    // The pipe drained, the rest moves through it in order.
    let mut got = read_n(rp, 15 * 4096);
    log(format!(
        "pipe filler intact: {}",
        got.iter().all(|&b| b == 7)
    ));
    got.clear();
    // Non-blocking: a splice from an empty socket says EAGAIN instead of waiting (a socket
    // waits by its own O_NONBLOCK, not by SPLICE_F_NONBLOCK).
    set_nonblock(s, true);
    while got.len() < data.len() {
        // SAFETY: socket -> pipe, no offsets.
        let k = unsafe { libc::splice(s, null, wp, null, 65536, libc::SPLICE_F_NONBLOCK) };
        if k <= 0 {
            if k < 0 && errno() == libc::EAGAIN {
                got.extend(read_n(rp, ioctl_int(rp, libc::FIONREAD).1.max(0) as usize));
                continue;
            }
            r("splice(s -> pipe)", k);
            break;
        }
        got.extend(read_n(rp, k as usize));
    }
    log(format!(
        "every byte through the pipe, in order: {}",
        got == data
    ));
    // No descriptor left for the process (the library's private pipe cannot be made): the
    // bytes still move.
    write_all(c, &data[..5000]);
    let t = Instant::now();
    while ioctl_int(s, libc::FIONREAD).1 < 5000 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: plain dup/close; the lowest free number becomes the limit, so none is left.
    let low = unsafe { libc::dup(0) };
    // SAFETY: our own descriptor.
    unsafe { libc::close(low) };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let tight = libc::rlimit {
        rlim_cur: low as libc::rlim_t,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: valid pointers; the limit is restored below.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &tight) };
    // SAFETY: socket -> pipe, no offsets.
    let k = unsafe { libc::splice(s, null, wp, null, 65536, libc::SPLICE_F_NONBLOCK) };
    let e = errno();
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    log(format!(
        "splice(s -> pipe) with no descriptor left = {}",
        if k > 0 {
            "moved bytes".into()
        } else {
            ename(e)
        }
    ));
    if k > 0 {
        let back = read_n(rp, k as usize);
        log(format!(
            "moved bytes in order: {}",
            data.get(..k as usize) == Some(&back[..])
        ));
    }
    // SAFETY: an empty blocking pipe -> socket with SPLICE_F_NONBLOCK.
    let k = unsafe { libc::splice(rp, null, c, null, 100, libc::SPLICE_F_NONBLOCK) };
    r("splice(empty pipe -> c, SPLICE_F_NONBLOCK)", k);
    close(rp);
    close(wp);
    close(c);
    close(s);
}

fn splice_pipe_to_socket_short() {
    let (c, s) = pair();
    set_nonblock(c, true);
    // Fill the connection until it takes no more.
    let chunk = vec![9u8; 65536];
    let mut sent: Vec<u8> = Vec::new();
    loop {
        let n = wr(c, &chunk);
        if n <= 0 {
            break;
        }
        sent.extend_from_slice(&chunk[..n as usize]);
    }
    let (rp, wp) = pipe();
    let pdata: Vec<u8> = (0..60000u32).map(|i| (i % 251) as u8).collect();
    write_all(wp, &pdata);
    close(wp);
    // SAFETY: pipe -> socket.
    let k = unsafe {
        libc::splice(
            rp,
            std::ptr::null_mut(),
            c,
            std::ptr::null_mut(),
            65536,
            libc::SPLICE_F_NONBLOCK,
        )
    };
    log(format!(
        "splice into a full connection = {}",
        if k < 0 {
            ename(errno())
        } else {
            "moved bytes".into()
        }
    ));
    if k > 0 {
        sent.extend_from_slice(&pdata[..k as usize]);
    }
    let mut off = k.max(0) as usize;
    let total_want = sent.len() + pdata.len() - off;
    let reader = std::thread::spawn(move || read_n(s, total_want));
    while off < pdata.len() {
        // SAFETY: pipe -> socket.
        let k = unsafe {
            libc::splice(
                rp,
                std::ptr::null_mut(),
                c,
                std::ptr::null_mut(),
                65536,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        if k < 0 && errno() == libc::EAGAIN {
            poll_raw(c, libc::POLLOUT, 5000);
            continue;
        }
        if k <= 0 {
            r("splice", k);
            break;
        }
        sent.extend_from_slice(&pdata[off..off + k as usize]);
        off += k as usize;
    }
    let got = reader.join().unwrap();
    log(format!(
        "peer got every byte sent, in order: {}, pipe bytes all moved: {}",
        got == sent,
        off == pdata.len()
    ));
    close(rp);
    close(c);
    close(s);
}

fn sendfile_offset() {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let path = format!("/tmp/smc-conform-o{}.dat", std::process::id());
    std::fs::write(&path, &data).expect("temp file");
    let cpath = std::ffi::CString::new(path.clone()).unwrap();
    // SAFETY: valid path.
    let f = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY) };
    let _ = std::fs::remove_file(&path);
    let (c, s) = pair();
    let reader = std::thread::spawn(move || read_n(s, 200_000));
    let mut off: libc::off_t = 100_000;
    let mut total = 0;
    while total < 200_000 {
        // SAFETY: valid offset pointer.
        let k = unsafe { libc::sendfile(c, f, &mut off, 200_000 - total) };
        if k <= 0 {
            r("sendfile", k);
            break;
        }
        total += k as usize;
    }
    // SAFETY: plain lseek.
    let cur = unsafe { libc::lseek(f, 0, libc::SEEK_CUR) };
    log(format!("sent {total}, offset now {off}, file offset {cur}"));
    let got = reader.join().unwrap();
    log(format!(
        "peer got [{}] want [{}]",
        digest(&got),
        digest(&data[100_000..300_000])
    ));
    close(f);
    close(c);
    close(s);
}

fn msg_oob() {
    let (c, s) = pair();
    // SAFETY: sends 1 byte from a static buffer.
    r("send(c,OOB)", unsafe {
        libc::send(c, b"!".as_ptr().cast(), 1, libc::MSG_OOB)
    });
    write_all(c, b"in band");
    close(c);
    let got = read_n(s, 100);
    log(format!("read(s) [{}]", digest(&got)));
    close(s);
}

/// Urgent byte between in-band bytes: reads stop before the mark, `SIOCATMARK` and `FIONREAD`
/// before and after, the urgent byte out of band once, the rest in band.
fn oob_mark_mid_stream() {
    let (c, s) = pair();
    write_all(c, b"abc");
    send_oob("send(c,dX,OOB)", c, b"dX");
    write_all(c, b"efg");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    atmark("SIOCATMARK(s)", s);
    inq("FIONREAD(s)", s);
    recvmsg_l("recv(s,100)", s, 100, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s) at mark", s);
    inq("FIONREAD(s) at mark", s);
    pl("poll(s,IN|PRI) at mark", s, libc::POLLIN | libc::POLLPRI, 0);
    recvmsg_l("recv(s,OOB)", s, 100, libc::MSG_OOB);
    atmark("SIOCATMARK(s) after OOB", s);
    inq("FIONREAD(s) after OOB", s);
    pl(
        "poll(s,IN|PRI) after OOB",
        s,
        libc::POLLIN | libc::POLLPRI,
        0,
    );
    recvmsg_l("recv(s,2)", s, 2, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s) past mark", s);
    recvmsg_l("recv(s,100)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB) again", s, 100, libc::MSG_OOB);
    recvmsg_l("recv(s,100) empty", s, 100, libc::MSG_DONTWAIT);
    close(c);
    recvmsg_l("recv(s,100) EOF", s, 100, 0);
    close(s);
}

/// `recv(MSG_OOB)` with no urgent data, twice after one, and `MSG_OOB|MSG_PEEK`.
fn oob_recv_none_twice_peek() {
    let (c, s) = pair();
    recvmsg_l("recv(s,OOB) none", s, 10, libc::MSG_OOB);
    set_nonblock(s, true);
    recvmsg_l("recv(s,OOB) none nonblocking", s, 10, libc::MSG_OOB);
    set_nonblock(s, false);
    send_oob("send(c,X,OOB)", c, b"X");
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    recvmsg_l("recv(s,OOB|PEEK)", s, 10, libc::MSG_OOB | libc::MSG_PEEK);
    recvmsg_l(
        "recv(s,OOB|PEEK) again",
        s,
        10,
        libc::MSG_OOB | libc::MSG_PEEK,
    );
    recvmsg_l("recv(s,0,OOB)", s, 0, libc::MSG_OOB);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s,OOB) twice", s, 10, libc::MSG_OOB);
    recvmsg_l(
        "recv(s,OOB|PEEK) after",
        s,
        10,
        libc::MSG_OOB | libc::MSG_PEEK,
    );
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s) nonblocking", s, 10, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s) after read", s);
    recvmsg_l("recv(s,OOB) after read", s, 10, libc::MSG_OOB);
    send_oob("send(c,YZ,OOB)", c, b"YZ");
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    recvmsg_l("recv(s,OOB|TRUNC)", s, 10, libc::MSG_OOB | libc::MSG_TRUNC);
    recvmsg_l("recv(s,OOB) after TRUNC", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 10, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// A blocking `recv(MSG_OOB)` with nothing urgent, on a client whose handshake gives up (a CLC
/// timeout of 1 ms, before the server accepts) and then waits to skip the server's late
/// answer: TCP says `EINVAL` at once; the call waited for CLC bytes that come only once the
/// server accepts, which this server does after the call (the watchdog ended it). Urgent data
/// then still arrives as on TCP, and the in-band bytes after it.
fn oob_recv_while_skipping_late_clc() {
    with_clc_timeout_1ms();
    let (l, c, _) = handshake_window_client();
    recvmsg_l("recv(c,OOB) none", c, 10, libc::MSG_OOB);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    send_oob("send(s,X,OOB)", s, b"X");
    pl("poll(c,PRI)", c, libc::POLLPRI, 5000);
    recvmsg_l("recv(c,OOB)", c, 10, libc::MSG_OOB);
    write_all(s, b"data");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    rd("read(c)", c, 100);
    close(c);
    close(s);
    close(l);
}

/// [`oob_recv_while_skipping_late_clc`] seen through epoll: the urgent byte's `EPOLLPRI` while
/// the fallback still skips the server's late answer (its entry watched on the handshake's
/// behalf), then `EPOLLIN` for the in-band bytes.
fn oob_epoll_while_skipping_late_clc() {
    with_clc_timeout_1ms();
    let (l, c, _) = handshake_window_client();
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD c IN|PRI)",
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        (libc::EPOLLIN | libc::EPOLLPRI) as u32,
        0,
    );
    recvmsg_l("recv(c,OOB) none", c, 10, libc::MSG_OOB);
    let s = accept_fd(l);
    log(format!("accept ok = {}", s >= 0));
    send_oob("send(s,X,OOB)", s, b"X");
    ep_wait("epoll_wait (urgent byte)", ep, 4, 5000, &names(&["c"]));
    recvmsg_l("recv(c,OOB)", c, 10, libc::MSG_OOB);
    write_all(s, b"data");
    ep_wait("epoll_wait (data)", ep, 4, 5000, &names(&["c"]));
    rd("read(c)", c, 100);
    close(ep);
    close(c);
    close(s);
    close(l);
}

/// Readiness: poll, epoll (level-triggered) and select's exceptfds before urgent data, while it
/// is pending and after it was read.
fn oob_poll_epoll_select() {
    let (c, s) = pair();
    let ep = ep_create();
    ep_ctl(
        "epoll_ctl(ADD s IN|PRI)",
        ep,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLPRI) as u32,
        0,
    );
    let n = names(&["s"]);
    pl("poll(s,IN|PRI) before", s, libc::POLLIN | libc::POLLPRI, 0);
    ep_wait("epoll_wait before", ep, 4, 0, &n);
    sel_ex("select(s,ex) before", s, 0);
    send_oob("send(c,X,OOB)", c, b"X");
    pl("poll(s,PRI) wait", s, libc::POLLPRI, 5000);
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 0);
    pl("poll(s,IN)", s, libc::POLLIN, 0);
    ep_wait("epoll_wait", ep, 4, 0, &n);
    sel_ex("select(s,ex)", s, 0);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    pl("poll(s,IN|PRI) after", s, libc::POLLIN | libc::POLLPRI, 0);
    ep_wait("epoll_wait after", ep, 4, 0, &n);
    sel_ex("select(s,ex) after", s, 0);
    write_all(c, b"yz");
    pl("poll(s,IN) data", s, libc::POLLIN, 5000);
    pl("poll(s,IN|PRI) data", s, libc::POLLIN | libc::POLLPRI, 0);
    recvmsg_l("recv(s)", s, 10, libc::MSG_DONTWAIT);
    // An edge-triggered set sees the urgent data arrive.
    let et = ep_create();
    ep_ctl(
        "epoll_ctl(ADD s ET IN|PRI)",
        et,
        libc::EPOLL_CTL_ADD,
        s,
        (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLET) as u32,
        0,
    );
    ep_wait("epoll_wait ET idle", et, 4, 0, &n);
    send_oob("send(c,W,OOB)", c, b"W");
    ep_wait("epoll_wait ET", et, 4, 5000, &n);
    ep_wait("epoll_wait ET again", et, 4, 0, &n);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    close(et);
    close(ep);
    close(c);
    close(s);
}

/// A normal read at the mark skips an urgent byte nobody read out of band: it is gone, and
/// `recv(MSG_OOB)` says so.
fn oob_read_skips_unread_urgent() {
    let (c, s) = pair();
    send_oob("send(c,X,OOB)", c, b"X");
    write_all(c, b"yz");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    inq("FIONREAD(s)", s);
    recvmsg_l("recv(s,1)", s, 1, libc::MSG_DONTWAIT);
    pl("poll(s,IN|PRI) after", s, libc::POLLIN | libc::POLLPRI, 0);
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 10, libc::MSG_DONTWAIT);
    // A blocking read of an urgent byte alone skips it and waits for what follows.
    send_oob("send(c,V,OOB)", c, b"V");
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        let mut b = [0u8; 10];
        T.store(gettid(), Ordering::Release);
        // SAFETY: valid buffer.
        let k = unsafe { libc::recv(s, b.as_mut_ptr().cast(), 10, 0) };
        (k, b)
    });
    wait_blocked(&T);
    write_all(c, b"u");
    let (k, b) = h.join().unwrap();
    log(format!(
        "blocking recv(s) = {k} [{}]",
        String::from_utf8_lossy(&b[..k.max(0) as usize])
    ));
    recvmsg_l("recv(s,OOB) after", s, 10, libc::MSG_OOB);
    close(c);
    close(s);
}

/// Two urgent sends before the reader looks: the mark moves to the newest, the older urgent
/// byte is in band.
fn oob_two_before_read() {
    let (c, s) = pair();
    send_oob("send(c,ab,OOB)", c, b"ab");
    send_oob("send(c,cd,OOB)", c, b"cd");
    write_all(c, b"ef");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    atmark("SIOCATMARK(s)", s);
    inq("FIONREAD(s)", s);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s) after", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// Urgent bytes sent one after the other while the first is the next to read: TCP drops the
/// older one (`tcp_check_urg`), only the newest is there.
fn oob_two_single_bytes_at_read_position() {
    let (c, s) = pair();
    send_oob("send(c,x,OOB)", c, b"x");
    send_oob("send(c,y,OOB)", c, b"y");
    write_all(c, b"z");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    atmark("SIOCATMARK(s)", s);
    inq("FIONREAD(s)", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    // The same after in-band bytes were read up to the first urgent byte.
    write_all(c, b"12");
    send_oob("send(c,3,OOB)", c, b"3");
    send_oob("send(c,45,OOB)", c, b"45");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// The reader saw the first urgent byte (and maybe read it) before the second one came.
fn oob_second_after_first_seen() {
    let (c, s) = pair();
    send_oob("send(c,x,OOB)", c, b"x");
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    atmark("SIOCATMARK(s)", s);
    send_oob("send(c,y,OOB)", c, b"y");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 0);
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    send_oob("send(c,z,OOB)", c, b"z");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 0);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    write_all(c, b"ab");
    send_oob("send(c,c,OOB)", c, b"c");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    send_oob("send(c,de,OOB)", c, b"de");
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// Three urgent sends before the reader looks.
fn oob_chain_of_three() {
    let (c, s) = pair();
    send_oob("send(c,a,OOB)", c, b"a");
    send_oob("send(c,b,OOB)", c, b"b");
    send_oob("send(c,c,OOB)", c, b"c");
    write_all(c, b"d");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    write_all(c, b"e");
    send_oob("send(c,f,OOB)", c, b"f");
    send_oob("send(c,gh,OOB)", c, b"gh");
    send_oob("send(c,i,OOB)", c, b"i");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// `MSG_PEEK` stops at the mark too and skips the urgent byte when it starts there.
fn oob_peek_stops_at_mark() {
    let (c, s) = pair();
    write_all(c, b"ab");
    send_oob("send(c,cX,OOB)", c, b"cX");
    write_all(c, b"de");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s,PEEK)", s, 100, libc::MSG_PEEK | libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,2)", s, 2, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,PEEK)", s, 100, libc::MSG_PEEK | libc::MSG_DONTWAIT);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l(
        "recv(s,PEEK) at mark",
        s,
        100,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
    );
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l(
        "recv(s,PEEK) after OOB",
        s,
        100,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
    );
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// `SO_OOBINLINE`: the urgent byte stays in the stream, reads still stop at the mark.
fn oob_inline() {
    let (c, s) = pair();
    let one: c_int = 1;
    r(
        "setsockopt(s,SO_OOBINLINE,1)",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_OOBINLINE, &one) as isize,
    );
    let (rc, v) = getsockopt_int(s, libc::SOL_SOCKET, libc::SO_OOBINLINE);
    log(format!("getsockopt(s,SO_OOBINLINE) = {rc} {v}"));
    write_all(c, b"abc");
    send_oob("send(c,dX,OOB)", c, b"dX");
    write_all(c, b"ef");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    inq("FIONREAD(s)", s);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s)", s);
    inq("FIONREAD(s) at mark", s);
    pl("poll(s,IN|PRI) at mark", s, libc::POLLIN | libc::POLLPRI, 0);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s,PEEK)", s, 100, libc::MSG_PEEK | libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,1)", s, 1, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s) past", s);
    pl("poll(s,IN|PRI) past", s, libc::POLLIN | libc::POLLPRI, 0);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    send_oob("send(c,g,OOB)", c, b"g");
    send_oob("send(c,h,OOB)", c, b"h");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    // Turned off again: the next urgent byte is out of band.
    let zero: c_int = 0;
    r(
        "setsockopt(s,SO_OOBINLINE,0)",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_OOBINLINE, &zero) as isize,
    );
    send_oob("send(c,iJ,OOB)", c, b"iJ");
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    close(c);
    close(s);
}

/// `SIGURG` to the socket's owner (`F_SETOWN`) when urgent data arrives.
fn oob_sigurg() {
    count_sigurg();
    let (c, s) = pair();
    // SAFETY: plain fcntl.
    r(
        "fcntl(s,F_SETOWN,pid)",
        unsafe { libc::fcntl(s, libc::F_SETOWN, libc::getpid()) } as isize,
    );
    write_all(c, b"a");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    log_sigurgs();
    send_oob("send(c,X,OOB)", c, b"X");
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    // The signal is process-directed: give it a moment to be delivered to some thread.
    let t0 = Instant::now();
    while SIGURGS.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    log_sigurgs();
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    close(c);
    close(s);
}

/// `SIGURG` to the owner set with `F_SETOWN_EX` (a process), for each of two urgent sends
/// with a read between, the byte readable with `MSG_OOB` by then.
fn oob_sigurg_setown_ex() {
    count_sigurg();
    let (c, s) = pair();
    own_ex("fcntl(s,F_SETOWN_EX,pid)", s);
    for b in [b"aX", b"bY"] {
        let n = SIGURGS.load(Ordering::SeqCst);
        send_oob("send(c,OOB)", c, b);
        await_signal("SIGURG", &SIGURGS, n);
        pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
        recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
        recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    }
    close(c);
    close(s);
}

/// `O_ASYNC` with `F_SETOWN`: `SIGIO` as data arrives, again for data arriving after a read
/// (TCP's `sock_def_readable`), and the bytes are there to read.
fn sigio_on_data() {
    count_sigio(libc::SIGIO);
    let (c, s) = pair();
    own_async(s);
    for b in [&b"abc"[..], b"defgh", b"i"] {
        let n = SIGIOS.load(Ordering::SeqCst);
        write_all(c, b);
        await_signal("SIGIO", &SIGIOS, n);
        rd("read(s)", s, 100);
    }
    close(c);
    close(s);
}

/// `SIGIO` when the peer shuts its writing (the FIN), after its last bytes were read.
fn sigio_on_peer_shutdown() {
    count_sigio(libc::SIGIO);
    let (c, s) = pair();
    own_async(s);
    let n = SIGIOS.load(Ordering::SeqCst);
    write_all(c, b"last");
    await_signal("SIGIO", &SIGIOS, n);
    rd("read(s)", s, 100);
    let n = SIGIOS.load(Ordering::SeqCst);
    // SAFETY: plain syscall.
    r(
        "shutdown(c,WR)",
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    await_signal("SIGIO at the FIN", &SIGIOS, n);
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

/// `SIGIO` when the peer closes (nothing unread).
fn sigio_on_peer_close() {
    count_sigio(libc::SIGIO);
    let (c, s) = pair();
    own_async(s);
    let n = SIGIOS.load(Ordering::SeqCst);
    close(c);
    await_signal("SIGIO at the close", &SIGIOS, n);
    rd("read(s)", s, 100);
    close(s);
}

/// `F_SETSIG` (a real-time signal): `si_code` `POLL_IN`, `si_band` `IN|RDNORM`, `si_fd` the
/// socket, for data and for the peer's FIN.
fn sigio_fsetsig_siginfo() {
    let sig = libc::SIGRTMIN() + 1;
    count_sigio(sig);
    let (c, s) = pair();
    own_async(s);
    // SAFETY: plain fcntl.
    r(
        "fcntl(s,F_SETSIG,RTMIN+1)",
        unsafe { libc::fcntl(s, F_SETSIG, sig) } as isize,
    );
    let n = SIGIOS.load(Ordering::SeqCst);
    write_all(c, b"abc");
    await_sigio_info("F_SETSIG signal", n, s);
    rd("read(s)", s, 100);
    let n = SIGIOS.load(Ordering::SeqCst);
    // SAFETY: plain syscall.
    r(
        "shutdown(c,WR)",
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    await_sigio_info("F_SETSIG signal at the FIN", n, s);
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

/// `ioctl(FIOASYNC)` and `F_SETOWN_EX` instead of `F_SETFL` and `F_SETOWN`.
fn sigio_fioasync() {
    count_sigio(libc::SIGIO);
    let (c, s) = pair();
    own_ex("fcntl(s,F_SETOWN_EX,pid)", s);
    let one: c_int = 1;
    // SAFETY: FIOASYNC reads one int.
    r(
        "ioctl(s,FIOASYNC,1)",
        unsafe { libc::ioctl(s, libc::FIOASYNC, &one) } as isize,
    );
    // SAFETY: plain fcntl.
    let fl = unsafe { libc::fcntl(s, libc::F_GETFL) };
    log(format!("F_GETFL has O_ASYNC {}", fl & libc::O_ASYNC != 0));
    let n = SIGIOS.load(Ordering::SeqCst);
    write_all(c, b"abc");
    await_signal("SIGIO", &SIGIOS, n);
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

/// `O_ASYNC` and the owner set on the client socket before `connect`: `SIGIO` for the server's
/// bytes once connected (the handshake's own signals are consumed before the first step).
fn sigio_set_before_connect() {
    count_sigio(libc::SIGIO);
    let (l, port) = listener();
    let h = std::thread::spawn(move || accept_fd(l));
    let c = tcp_socket();
    // SAFETY: plain fcntl calls.
    unsafe {
        libc::fcntl(c, libc::F_SETOWN, libc::getpid());
        libc::fcntl(
            c,
            libc::F_SETFL,
            libc::fcntl(c, libc::F_GETFL) | libc::O_ASYNC,
        );
    }
    assert_eq!(connect_to(c, port), 0);
    let s = h.join().expect("accept thread");
    close(l);
    // Settle: one byte each way, then every signal of the setup has been counted.
    write_all(c, b"s");
    assert_eq!(read_n(s, 1), b"s");
    let n = SIGIOS.load(Ordering::SeqCst);
    write_all(s, b"c");
    await_signal("SIGIO", &SIGIOS, n);
    rd("read(c)", c, 100);
    let n = SIGIOS.load(Ordering::SeqCst);
    write_all(s, b"more");
    await_signal("SIGIO", &SIGIOS, n);
    rd("read(c)", c, 100);
    close(c);
    close(s);
}

/// `SIGIO` to a non-blocking writer that filled the connection once the reader made room
/// (plain `SIGIO`: TCP's `sk_stream_write_space` says `POLL_OUT`, which only `F_SETSIG` shows).
fn sigio_on_write_space() {
    count_sigio(libc::SIGIO);
    let (c, s) = pair();
    own_async(c);
    set_nonblock(c, true);
    let chunk = vec![b'w'; 65536];
    let mut total = 0usize;
    loop {
        let n = wr(c, &chunk);
        if n < 0 {
            log(format!("write(c) until {}", ename(errno())));
            break;
        }
        total += n as usize;
    }
    let n = SIGIOS.load(Ordering::SeqCst);
    let got = read_n(s, total);
    log(format!("read everything written: {}", got.len() == total));
    await_signal("SIGIO to the writer", &SIGIOS, n);
    r("write(c) again", wr(c, b"x"));
    close(c);
    close(s);
}

/// [`sigio_on_write_space`] with `F_SETSIG`: TCP's signal for the room says `POLL_OUT`,
/// `si_band` `OUT|WRNORM|WRBAND`.
fn sigio_fsetsig_write_space() {
    let sig = libc::SIGRTMIN() + 1;
    count_sigio(sig);
    let (c, s) = pair();
    own_async(c);
    // SAFETY: plain fcntl.
    r(
        "fcntl(c,F_SETSIG,RTMIN+1)",
        unsafe { libc::fcntl(c, F_SETSIG, sig) } as isize,
    );
    set_nonblock(c, true);
    let chunk = vec![b'w'; 65536];
    let mut total = 0usize;
    loop {
        let n = wr(c, &chunk);
        if n < 0 {
            log(format!("write(c) until {}", ename(errno())));
            break;
        }
        total += n as usize;
    }
    let n = SIGIOS.load(Ordering::SeqCst);
    let got = read_n(s, total);
    log(format!("read everything written: {}", got.len() == total));
    await_sigio_info("F_SETSIG signal to the writer", n, c);
    close(c);
    close(s);
}

/// A blocking read waits on an `O_ASYNC` socket when the data comes: TCP sends no `SIGIO`
/// for it (`sk_wait_data` sets `SOCKWQ_ASYNC_WAITDATA`, `sock_wake_async` then stays
/// silent); with none waiting, it does. `SIGIO` is blocked in the one thread and looked for as
/// pending (the writer is a forked child that writes once the read sleeps).
fn sigio_not_while_read_waits_one_thread() {
    count_sigio(libc::SIGIO);
    // SAFETY: sigset manipulation on a local set, the calling thread's mask.
    let pending = || unsafe {
        let mut p: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut p);
        libc::sigismember(&p, libc::SIGIO) == 1
    };
    // SAFETY: as above.
    let take = || unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGIO);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    };
    // SAFETY: as above.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGIO);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let (l, port) = listener();
    let c = tcp_socket();
    r("connect(own listener)", connect_to(c, port) as isize);
    let s = accept_fd(l);
    close(l);
    write_all(c, b"s");
    assert_eq!(read_n(s, 1), b"s");
    own_async(s);
    take();
    // SAFETY: plain syscall.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the child only waits, writes and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        wait_pid_blocked(parent);
        write_all(c, b"abc");
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    rd("read(s) blocked until the child writes", s, 3);
    log(format!("SIGIO pending after the read: {}", pending()));
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    take();
    write_all(c, b"de");
    let t0 = Instant::now();
    while !pending() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    log(format!("SIGIO pending with no read waiting: {}", pending()));
    rd("read(s)", s, 100);
    take();
    close(c);
    close(s);
}

/// `SIGURG` with `SO_OOBINLINE` on: the urgent byte stays in the stream, the signal comes all
/// the same, and the stream around it is intact.
fn oob_sigurg_inline() {
    count_sigurg();
    let (c, s) = pair();
    let one: c_int = 1;
    r(
        "setsockopt(s,SO_OOBINLINE,1)",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_OOBINLINE, &one) as isize,
    );
    // SAFETY: plain fcntl.
    r(
        "fcntl(s,F_SETOWN,pid)",
        unsafe { libc::fcntl(s, libc::F_SETOWN, libc::getpid()) } as isize,
    );
    let n = SIGURGS.load(Ordering::SeqCst);
    write_all(c, b"abc");
    send_oob("send(c,dX,OOB)", c, b"dX");
    write_all(c, b"ef");
    await_signal("SIGURG", &SIGURGS, n);
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    atmark("SIOCATMARK(s)", s);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    let n = SIGURGS.load(Ordering::SeqCst);
    send_oob("send(c,g,OOB)", c, b"g");
    await_signal("SIGURG", &SIGURGS, n);
    write_all(c, &[b'h'; 5000]);
    let got = read_n(s, 5001);
    log(format!("read {} [{}]", got.len(), digest(&got)));
    close(c);
    close(s);
}

/// Urgent data with an owner, then the receiving end goes to stdio (`fdopen`): the stream
/// after it is intact and holds no trace of the urgent signalling (no urgent byte left for
/// `recv(MSG_OOB)`, no mark), and urgent data sent afterwards signals and reads as before.
fn oob_sigurg_then_fdopen() {
    count_sigurg();
    let (c, s) = pair();
    // SAFETY: plain fcntl.
    r(
        "fcntl(s,F_SETOWN,pid)",
        unsafe { libc::fcntl(s, libc::F_SETOWN, libc::getpid()) } as isize,
    );
    let n = SIGURGS.load(Ordering::SeqCst);
    send_oob("send(c,aX,OOB)", c, b"aX");
    await_signal("SIGURG", &SIGURGS, n);
    pl("poll(s,PRI)", s, libc::POLLPRI, 5000);
    recvmsg_l("recv(s)", s, 100, libc::MSG_DONTWAIT);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    let h = std::thread::spawn(move || {
        write_all(
            c,
            b"line one
",
        );
        let a = read_n(c, 3);
        let n = SIGURGS.load(Ordering::SeqCst);
        send_oob("send(c,bY,OOB)", c, b"bY");
        await_signal("SIGURG", &SIGURGS, n);
        write_all(
            c,
            b"line two
",
        );
        (c, a)
    });
    // SAFETY: a valid mode string; the FILE is closed below.
    let f = unsafe { libc::fdopen(s, c"r+".as_ptr()) };
    log(format!("fdopen(s) ok = {}", !f.is_null()));
    let mut line = [0u8; 64];
    // SAFETY: a buffer of its length; the FILE is open.
    let p = unsafe { libc::fgets(line.as_mut_ptr().cast(), line.len() as c_int, f) };
    // SAFETY: fgets NUL-terminates.
    let got = (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(line.as_ptr().cast()) });
    log(format!("fgets = {got:?}"));
    // SAFETY: valid strings; the FILE is open.
    unsafe {
        libc::fputs(c"ok\n".as_ptr(), f);
        libc::fflush(f);
    }
    let (c, a) = h.join().unwrap();
    log(format!(
        "client got [{}]",
        String::from_utf8_lossy(&a).trim_end()
    ));
    pl("poll(s,IN|PRI)", s, libc::POLLIN | libc::POLLPRI, 5000);
    recvmsg_l("recv(s,OOB)", s, 10, libc::MSG_OOB);
    let mut all = Vec::new();
    while all.len() < 10 {
        let mut b = [0u8; 64];
        // SAFETY: a buffer of its length.
        let k = unsafe { libc::recv(s, b.as_mut_ptr().cast(), b.len(), 0) };
        if k <= 0 {
            break;
        }
        all.extend_from_slice(&b[..k as usize]);
    }
    log(format!(
        "then read [{}]",
        String::from_utf8_lossy(&all).escape_debug()
    ));
    recvmsg_l("recv(s,OOB) again", s, 10, libc::MSG_OOB);
    close(c);
    // SAFETY: the FILE from fdopen (closes s).
    log(format!("fclose = {}", unsafe { libc::fclose(f) }));
}

/// `send(MSG_ZEROCOPY)` with `SO_ZEROCOPY` on: the completion arrives on the error queue
/// (`POLLERR`, then `recvmsg(MSG_ERRQUEUE)`: origin zerocopy, the range of call ids, copied as
/// on loopback), and a second read of the queue finds it empty. A program waits for it before
/// it reuses its buffer (before: it never came).
fn msg_zerocopy_completion() {
    let (c, s) = pair();
    let one: c_int = 1;
    // SAFETY: a valid option value of its length.
    r("setsockopt(SO_ZEROCOPY)", unsafe {
        libc::setsockopt(
            c,
            libc::SOL_SOCKET,
            libc::SO_ZEROCOPY,
            (&one as *const c_int).cast(),
            4,
        )
    } as isize);
    let big = vec![b'z'; 20_000];
    for _ in 0..2 {
        // SAFETY: a buffer of its length.
        r("send(MSG_ZEROCOPY)", unsafe {
            libc::send(c, big.as_ptr().cast(), big.len(), libc::MSG_ZEROCOPY)
        });
    }
    let got = read_n(s, 2 * big.len());
    log(format!("peer got {} bytes", got.len()));
    pl("poll(c, 0) for the error queue", c, 0, 2000);
    for _ in 0..2 {
        let mut cb = [0u64; 16];
        let mut b = [0u8; 16];
        let mut v = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
        // SAFETY: plain old data.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut v;
        m.msg_iovlen = 1;
        m.msg_control = cb.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&cb) as _;
        // SAFETY: the msghdr describes our buffers.
        let k = r("recvmsg(c, MSG_ERRQUEUE)", unsafe {
            libc::recvmsg(c, &mut m, libc::MSG_ERRQUEUE)
        });
        if k >= 0 {
            // SAFETY: the kernel (or the library) filled the control buffer.
            let h = unsafe { libc::CMSG_FIRSTHDR(&m) };
            if h.is_null() {
                log("no control message");
            } else {
                // SAFETY: a control message of the buffer, its data a sock_extended_err.
                let ee: libc::sock_extended_err =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(h).cast()) };
                // SAFETY: as above.
                let (lvl, ty) = unsafe { ((*h).cmsg_level, (*h).cmsg_type) };
                log(format!(
                    "cmsg level {lvl} type {ty}: errno {} origin {} code {} ids {}..={} flags {:#x}",
                    ee.ee_errno, ee.ee_origin, ee.ee_code, ee.ee_info, ee.ee_data, m.msg_flags
                ));
            }
        }
    }
    close(c);
    close(s);
}

/// `popen` of a shell command that serves the connection with a program without the library
/// (`env -u LD_PRELOAD wc -c`, the socket as its stdin and stdout), and the parent closes its
/// copy as soon as `popen` returned: the shell's copy keeps the connection, as on TCP. glibc
/// spawns the shell with its internal `posix_spawn`, which the interposition does not see
/// (before: the parent's close closed the connection before the shell adopted it, and `wc`
/// read `ECONNRESET`).
fn popen_handler_parent_closes_at_once() {
    let (c, s) = pair();
    // dash redirects single-digit descriptors only: the connection at a free one below 10.
    // SAFETY: plain fcntl/dup2 on our own numbers.
    let n = (3..10)
        .rev()
        .find(|&n| unsafe { libc::fcntl(n, libc::F_GETFD) } == -1)
        .expect("a free descriptor below 10");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::dup2(c, n) }, n);
    close(c);
    let cmd = std::ffi::CString::new(format!("env -u LD_PRELOAD wc -c <&{n} >&{n}")).unwrap();
    // SAFETY: valid strings; the FILE is closed below with pclose.
    let f = unsafe { libc::popen(cmd.as_ptr(), c"r".as_ptr()) };
    log(format!("popen ok = {}", !f.is_null()));
    close(n);
    let data = vec![b'x'; 100_000];
    write_all(s, &data);
    // SAFETY: plain shutdown of our socket.
    r(
        "shutdown(s, WR)",
        unsafe { libc::shutdown(s, libc::SHUT_WR) } as isize,
    );
    let got = read_n(s, 100);
    log(format!(
        "the handler counted {:?}",
        String::from_utf8_lossy(&got)
    ));
    // SAFETY: the FILE from popen.
    let st = unsafe { libc::pclose(f) };
    log(format!("pclose = {st}"));
    close(s);
}

/// One `fgets` of up to 63 bytes from `f` (an open `FILE`): the line, or `(null)`.
fn fgets_line(f: *mut libc::FILE) -> String {
    let mut line = [0u8; 64];
    // SAFETY: a buffer of its length; the caller's FILE is open.
    let p = unsafe { libc::fgets(line.as_mut_ptr().cast(), line.len() as c_int, f) };
    if p.is_null() {
        return String::from("(null)");
    }
    // SAFETY: fgets NUL-terminates.
    unsafe { std::ffi::CStr::from_ptr(line.as_ptr().cast()) }
        .to_string_lossy()
        .into_owned()
}

/// A server that serves its accepted socket through stdio (`fdopen`, `fgets`, `fputs`): libc's
/// internal reads and writes never reach the interposition, so the connection must be plain
/// TCP by then. The client, another thread, writes a request and blocks reading the reply.
fn fdopen_stdio_server() {
    let (c, s) = pair();
    let h = std::thread::spawn(move || {
        write_all(c, b"GET one\n");
        let a = read_n(c, 9);
        write_all(c, b"GET two\n");
        let b = read_n(c, 9);
        let e = read_n(c, 100);
        close(c);
        (a, b, e)
    });
    // SAFETY: a valid mode string; the FILE is closed below.
    let f = unsafe { libc::fdopen(s, c"r+".as_ptr()) };
    log(format!("fdopen(s) ok = {}", !f.is_null()));
    for _ in 0..2 {
        log(format!("fgets = {:?}", fgets_line(f)));
        // SAFETY: valid strings; the FILE is open.
        unsafe {
            libc::fputs(c"reply ok\n".as_ptr(), f);
            libc::fflush(f);
        }
    }
    // SAFETY: the FILE from fdopen (closes s).
    log(format!("fclose = {}", unsafe { libc::fclose(f) }));
    let (a, b, e) = h.join().unwrap();
    log(format!(
        "client got [{}] [{}] then {} bytes (EOF)",
        String::from_utf8_lossy(&a).trim_end(),
        String::from_utf8_lossy(&b).trim_end(),
        e.len()
    ));
}

/// A socket read through stdio (`fdopen`) after its peer wrote two lines and closed, none of
/// them read yet: stdio reads the plain socket, where TCP keeps both lines and then EOF. Over
/// SMC-D the lines sit in our ring and their writer is gone: they go on in a loopback
/// connection of their own (before: the connection was reset, `fgets` said NULL with both
/// lines lost; red team rt8 `fdopen_peer_closed`).
fn fdopen_after_the_peer_closed_with_bytes_unread() {
    let (c, s) = pair();
    let h = std::thread::spawn(move || {
        write_all(c, b"one\ntwo\n");
        close(c);
    });
    h.join().unwrap();
    // SAFETY: a valid mode string; the FILE is closed below.
    let f = unsafe { libc::fdopen(s, c"r".as_ptr()) };
    log(format!("fdopen(s) ok = {}", !f.is_null()));
    for _ in 0..3 {
        log(format!("fgets = {:?}", fgets_line(f)));
    }
    // SAFETY: the FILE from fdopen (closes s).
    log(format!("fclose = {}", unsafe { libc::fclose(f) }));
}

extern "C" {
    fn dprintf(fd: c_int, fmt: *const libc::c_char, ...) -> c_int;
    /// What a C program built with `_FORTIFY_SOURCE` calls for `dprintf`.
    fn __dprintf_chk(fd: c_int, flag: c_int, fmt: *const libc::c_char, ...) -> c_int;
}

/// `dprintf` on a connection: glibc formats into a `FILE` on the fd and writes through its
/// internal `write` (here a short line with `%d %s %m %#x`, a 100 KiB `%s` that takes several
/// writes, the fortified form, an empty output), then, non-blocking with nobody reading, a
/// 32 MiB `%s`: the flush fails with `EAGAIN` and `dprintf` with -1. The connection serves
/// both ways afterwards.
fn dprintf_on_socket() {
    let (c, s) = pair();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !all.ends_with(b"END\n") {
            // SAFETY: valid buffer.
            let k = unsafe { libc::read(s, buf.as_mut_ptr().cast(), buf.len()) };
            if k <= 0 {
                break;
            }
            all.extend_from_slice(&buf[..k as usize]);
        }
        all
    });
    let long = std::ffi::CString::new(vec![b'x'; 100 * 1024]).unwrap();
    set_errno(libc::ENOENT);
    // SAFETY: NUL-terminated formats whose conversions match the arguments.
    unsafe {
        let n = dprintf(
            c,
            c"n=%d s=%s m=%m hex=%#x\n".as_ptr(),
            42 as c_int,
            c"word".as_ptr(),
            255 as libc::c_uint,
        );
        r("dprintf(c, short line)", n as isize);
        let n = dprintf(c, c"[%s]\n".as_ptr(), long.as_ptr());
        r("dprintf(c, 100 KiB %s)", n as isize);
        let n = __dprintf_chk(
            c,
            1,
            c"%05d|%-6s|%c\n".as_ptr(),
            7 as c_int,
            c"chk".as_ptr(),
            b'!' as c_int,
        );
        r("__dprintf_chk(c, ...)", n as isize);
        let n = dprintf(c, c"%s".as_ptr(), c"".as_ptr());
        r("dprintf(c, empty output)", n as isize);
        let n = dprintf(c, c"END\n".as_ptr());
        r("dprintf(c, END)", n as isize);
    }
    let all = reader.join().unwrap();
    let first = all.split(|&b| b == b'\n').next().unwrap_or_default();
    log(format!(
        "s read {} bytes, digest {}, first line {:?}",
        all.len(),
        digest(&all),
        String::from_utf8_lossy(first)
    ));
    write_all(s, b"thanks\n");
    rd("read(c)", c, 100);
    // Non-blocking, nobody reading: more than the send buffer and the peer's receive buffer.
    set_nonblock(c, true);
    let huge = std::ffi::CString::new(vec![b'y'; 32 << 20]).unwrap();
    // SAFETY: a NUL-terminated format whose conversion matches the argument.
    let n = unsafe { dprintf(c, c"%s".as_ptr(), huge.as_ptr()) };
    r(
        "dprintf(c, 32 MiB %s) non-blocking, nobody reading",
        n as isize,
    );
    close(c);
    close(s);
}

// ── POSIX aio ───────────────────────────────────────────────────────────────────────────────
// glibc's aio threads read and write through its internal `pread`/`read`/`write`, which never
// reach an interposition: the connection must be plain TCP by the time they run.

extern "C" {
    fn aio_read64(cb: *mut libc::aiocb) -> c_int;
    fn aio_write64(cb: *mut libc::aiocb) -> c_int;
    fn lio_listio64(
        mode: c_int,
        list: *const *mut libc::aiocb,
        n: c_int,
        sev: *mut libc::sigevent,
    ) -> c_int;
}

/// A control block for `op` on `fd` over `buf` (no notification), alive for the rest of the
/// process: glibc writes its result into it even if the scenario gave up waiting.
fn aiocb_for(fd: c_int, op: c_int, buf: &'static mut [u8]) -> *mut libc::aiocb {
    // SAFETY: an all-zero aiocb is a valid value (glibc's own initialiser is zeroes).
    let mut cb: libc::aiocb = unsafe { std::mem::zeroed() };
    cb.aio_fildes = fd;
    cb.aio_lio_opcode = op;
    cb.aio_buf = buf.as_mut_ptr().cast();
    cb.aio_nbytes = buf.len();
    cb.aio_sigevent.sigev_notify = libc::SIGEV_NONE;
    Box::leak(Box::new(cb))
}

fn aio_buf(b: &[u8]) -> &'static mut [u8] {
    Box::leak(b.to_vec().into_boxed_slice())
}

fn aio_err_name(e: c_int) -> String {
    if e == 0 {
        String::from("0")
    } else {
        ename(e)
    }
}

/// Waits (`aio_suspend`, bounded) for `cb` to complete; logs its error and return value, and
/// the bytes it read.
fn aio_wait(what: &str, cb: *mut libc::aiocb) {
    let list = [cb as *const libc::aiocb];
    let t = libc::timespec {
        tv_sec: 5,
        tv_nsec: 0,
    };
    let start = Instant::now();
    // SAFETY: a live control block (leaked), a list of one, a valid timeout.
    while unsafe { libc::aio_error(cb) } == libc::EINPROGRESS
        && start.elapsed() < Duration::from_secs(8)
    {
        // SAFETY: as above.
        unsafe { libc::aio_suspend(list.as_ptr(), 1, &t) };
    }
    // SAFETY: as above.
    let e = unsafe { libc::aio_error(cb) };
    if e == libc::EINPROGRESS {
        log(format!("{what}: still in progress after 8 s"));
        return;
    }
    // SAFETY: as above; completed, so its result is final.
    let n = unsafe { libc::aio_return(cb) };
    // SAFETY: a live control block.
    let (op, buf) = unsafe { ((*cb).aio_lio_opcode, (*cb).aio_buf) };
    let got = if op == libc::LIO_READ && n > 0 {
        // SAFETY: the read's buffer, of which the first n bytes were filled.
        let b = unsafe { std::slice::from_raw_parts(buf as *const u8, n as usize) };
        format!(" [{}]", String::from_utf8_lossy(b))
    } else {
        String::new()
    };
    log(format!(
        "{what}: aio_error = {}, aio_return = {n}{got}",
        aio_err_name(e)
    ));
}

/// The client writes with `aio_write` (then 100 KiB with `aio_write64`) while the server is
/// already blocked in a read waiting for exactly those bytes: the order in which a switch to
/// TCP must not deadlock. The connection then serves both ways with plain calls.
fn aio_write_to_blocked_reader() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let big: Vec<u8> = (0..100 * 1024).map(|i| (i % 251) as u8).collect();
    let want = big.len() + 9;
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let got = read_n(s, want);
        write_all(s, b"back");
        got
    });
    wait_blocked(&T);
    let a = aiocb_for(c, libc::LIO_WRITE, aio_buf(b"aio write"));
    // SAFETY: a live control block over a live buffer.
    r("aio_write(c)", unsafe { libc::aio_write(a) } as isize);
    aio_wait("aio_write(c)", a);
    let b = aiocb_for(c, libc::LIO_WRITE, aio_buf(&big));
    // SAFETY: as above (aiocb64 is aiocb on LP64).
    r("aio_write64(c, 100 KiB)", unsafe { aio_write64(b) }
        as isize);
    aio_wait("aio_write64(c, 100 KiB)", b);
    let got = h.join().unwrap();
    log(format!(
        "s read {} bytes, first [{}], rest digest {} (sent {})",
        got.len(),
        String::from_utf8_lossy(&got[..got.len().min(9)]),
        digest(got.get(9..).unwrap_or_default()),
        digest(&big)
    ));
    rd("read(c)", c, 100);
    close(c);
    rd("read(s) after the peer closed", s, 100);
    close(s);
}

/// The client starts an `aio_read` before anything was sent to it (the server blocks reading
/// a request), then sends the request with a plain `write`; the server answers, and the read
/// completes with the answer.
fn aio_read_before_peer_writes() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let req = read_n(s, 4);
        // One write: the read gets all of it (two might come as one read or two).
        write_all(s, &[&b"reply to "[..], &req].concat());
        let rest = read_n(s, 100);
        close(s);
        (req, rest)
    });
    wait_blocked(&T);
    let a = aiocb_for(c, libc::LIO_READ, aio_buf(&[0u8; 64]));
    // SAFETY: a live control block over a live buffer.
    r("aio_read(c)", unsafe { libc::aio_read(a) } as isize);
    // SAFETY: as above.
    let e = unsafe { libc::aio_error(a) };
    log(format!(
        "aio_error before the request = {}",
        aio_err_name(e)
    ));
    write_all(c, b"req!");
    aio_wait("aio_read(c)", a);
    let b = aiocb_for(c, libc::LIO_READ, aio_buf(&[0u8; 64]));
    // SAFETY: as above (aiocb64 is aiocb on LP64).
    r("aio_read64(c)", unsafe { aio_read64(b) } as isize);
    r("write(c, bye)", wr(c, b"bye"));
    // SAFETY: plain shutdown of our socket.
    r(
        "shutdown(c, WR)",
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    aio_wait("aio_read64(c) at the peer's EOF", b);
    let (req, rest) = h.join().unwrap();
    log(format!(
        "s read [{}] then [{}] then EOF",
        String::from_utf8_lossy(&req),
        String::from_utf8_lossy(&rest)
    ));
    close(c);
}

/// One `lio_listio` (no wait) over two connections and a pipe: a write then a read on the
/// first (its server answers what it read), a `LIO_NOP`, a write on the second, a write into
/// the pipe; then `lio_listio64` with `LIO_WAIT` on the second connection.
fn lio_listio_mixed() {
    let (c, s) = pair_settled();
    let (c2, s2) = pair_settled();
    let (rp, wp) = pipe();
    static TA: AtomicI32 = AtomicI32::new(0);
    static TB: AtomicI32 = AtomicI32::new(0);
    let ha = std::thread::spawn(move || {
        TA.store(gettid(), Ordering::Release);
        let got = read_n(s, 6);
        write_all(s, b"pong!");
        got
    });
    let hb = std::thread::spawn(move || {
        TB.store(gettid(), Ordering::Release);
        read_n(s2, 8)
    });
    wait_blocked(&TA);
    wait_blocked(&TB);
    let w = aiocb_for(c, libc::LIO_WRITE, aio_buf(b"ping!!"));
    let nop = aiocb_for(c, libc::LIO_NOP, aio_buf(&[0u8; 1]));
    let rdb = aiocb_for(c, libc::LIO_READ, aio_buf(&[0u8; 5]));
    let w2 = aiocb_for(c2, libc::LIO_WRITE, aio_buf(b"two2"));
    let wpipe = aiocb_for(wp, libc::LIO_WRITE, aio_buf(b"pipe"));
    let list = [w, nop, rdb, w2, wpipe];
    r(
        "lio_listio(LIO_NOWAIT, 5)",
        // SAFETY: live control blocks; no list notification.
        unsafe { libc::lio_listio(libc::LIO_NOWAIT, list.as_ptr(), 5, std::ptr::null_mut()) }
            as isize,
    );
    aio_wait("write(c)", w);
    aio_wait("read(c)", rdb);
    aio_wait("write(c2)", w2);
    aio_wait("write(pipe)", wpipe);
    rd("read(pipe)", rp, 100);
    let more = aiocb_for(c2, libc::LIO_WRITE, aio_buf(b"more"));
    let list2 = [more];
    r(
        "lio_listio64(LIO_WAIT, 1)",
        // SAFETY: as above.
        unsafe { lio_listio64(libc::LIO_WAIT, list2.as_ptr(), 1, std::ptr::null_mut()) } as isize,
    );
    aio_wait("write(c2) more", more);
    let a = ha.join().unwrap();
    let b = hb.join().unwrap();
    log(format!(
        "s read [{}], s2 read [{}]",
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b)
    ));
    for fd in [c, s, c2, s2, rp, wp] {
        close(fd);
    }
}

/// A server reads two connections with `aio_read` and waits with `aio_suspend` on both: a
/// timeout while no client has written, then the second client's request completes only the
/// second read, then the first; `aio_cancel` finds nothing left to cancel.
fn aio_suspend_two_server_ends() {
    let (c, s) = pair_settled();
    let (c2, s2) = pair_settled();
    static TA: AtomicI32 = AtomicI32::new(0);
    static TB: AtomicI32 = AtomicI32::new(0);
    // The clients wait for a go byte (blocked in a read), then write their request.
    let ha = std::thread::spawn(move || {
        TA.store(gettid(), Ordering::Release);
        let go = read_n(c, 1);
        write_all(c, b"first");
        go
    });
    let hb = std::thread::spawn(move || {
        TB.store(gettid(), Ordering::Release);
        let go = read_n(c2, 1);
        write_all(c2, b"second");
        go
    });
    wait_blocked(&TA);
    wait_blocked(&TB);
    let a = aiocb_for(s, libc::LIO_READ, aio_buf(&[0u8; 16]));
    let b = aiocb_for(s2, libc::LIO_READ, aio_buf(&[0u8; 16]));
    // SAFETY: live control blocks over live buffers.
    r("aio_read(s)", unsafe { libc::aio_read(a) } as isize);
    // SAFETY: as above.
    r("aio_read(s2)", unsafe { libc::aio_read(b) } as isize);
    let list = [a as *const libc::aiocb, b as *const libc::aiocb];
    let short = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    // SAFETY: live control blocks, a valid timeout.
    r(
        "aio_suspend(both, 100 ms)",
        unsafe { libc::aio_suspend(list.as_ptr(), 2, &short) } as isize,
    );
    // The second client goes: its request completes the second read only.
    write_all(s2, b"g");
    aio_wait("aio_read(s2)", b);
    // SAFETY: as above.
    let e = unsafe { libc::aio_error(a) };
    log(format!("aio_error(s) meanwhile = {}", aio_err_name(e)));
    write_all(s, b"g");
    aio_wait("aio_read(s)", a);
    // SAFETY: nothing in flight on s (a plain call with no control block).
    let k = unsafe { libc::aio_cancel(s, std::ptr::null_mut()) };
    log(format!(
        "aio_cancel(s, NULL) = {}",
        if k == libc::AIO_ALLDONE {
            "AIO_ALLDONE".to_string()
        } else {
            k.to_string()
        }
    ));
    let ga = ha.join().unwrap();
    let gb = hb.join().unwrap();
    log(format!("clients got go bytes {} {}", ga.len(), gb.len()));
    write_all(c, b"x");
    rd("read(s) after aio", s, 100);
    for fd in [c, s, c2, s2] {
        close(fd);
    }
}

/// `aio_write` is the client's first call on a new connection (its handshake may be under
/// way) while the server blocks reading; then both ways with plain calls.
fn aio_write_first_call() {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let got = read_n(s, 10);
        write_all(s, b"answer");
        got
    });
    wait_blocked(&T);
    let a = aiocb_for(c, libc::LIO_WRITE, aio_buf(b"first call"));
    // SAFETY: a live control block over a live buffer.
    r("aio_write(c)", unsafe { libc::aio_write(a) } as isize);
    aio_wait("aio_write(c)", a);
    let got = h.join().unwrap();
    log(format!("s read [{}]", String::from_utf8_lossy(&got)));
    rd("read(c)", c, 100);
    close(c);
    rd("read(s) after the peer closed", s, 100);
    close(s);
}

/// The client sends its request and half-closes, then blocks reading the reply; the server
/// reads the request and the EOF with `aio_read`, then answers with `aio_write`.
fn aio_read_after_peer_shut_wr() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        write_all(c, b"request");
        // SAFETY: plain shutdown of our socket.
        unsafe { libc::shutdown(c, libc::SHUT_WR) };
        T.store(gettid(), Ordering::Release);
        let got = read_n(c, 100);
        close(c);
        got
    });
    wait_blocked(&T);
    let a = aiocb_for(s, libc::LIO_READ, aio_buf(&[0u8; 64]));
    // SAFETY: a live control block over a live buffer.
    r("aio_read(s)", unsafe { libc::aio_read(a) } as isize);
    aio_wait("aio_read(s)", a);
    let b = aiocb_for(s, libc::LIO_READ, aio_buf(&[0u8; 64]));
    // SAFETY: as above.
    r("aio_read(s) again", unsafe { libc::aio_read(b) } as isize);
    aio_wait("aio_read(s) again", b);
    let w = aiocb_for(s, libc::LIO_WRITE, aio_buf(b"response"));
    // SAFETY: as above.
    r("aio_write(s)", unsafe { libc::aio_write(w) } as isize);
    aio_wait("aio_write(s)", w);
    close(s);
    let got = h.join().unwrap();
    log(format!(
        "c read [{}] then EOF",
        String::from_utf8_lossy(&got)
    ));
}

/// The server is an event loop (non-blocking socket, `epoll_wait` for input, read until
/// `EAGAIN`) already asleep when the client's `aio_write` comes; it echoes what it read. How
/// often the loop wakes is not logged (a wakeup that finds nothing is allowed), only what it
/// read.
fn aio_write_to_epoll_server() {
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        set_nonblock(s, true);
        let ep = ep_create();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: valid event.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s, &mut ev) };
        T.store(gettid(), Ordering::Release);
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        let start = Instant::now();
        while got.len() < 12 && start.elapsed() < Duration::from_secs(10) {
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }];
            // SAFETY: one entry.
            unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 1, 1000) };
            loop {
                // SAFETY: valid buffer.
                let k = unsafe { libc::read(s, buf.as_mut_ptr().cast(), buf.len()) };
                if k <= 0 {
                    break;
                }
                got.extend_from_slice(&buf[..k as usize]);
            }
        }
        close(ep);
        set_nonblock(s, false);
        write_all(s, &got);
        got
    });
    wait_blocked(&T);
    let a = aiocb_for(c, libc::LIO_WRITE, aio_buf(b"event loop!\n"));
    // SAFETY: a live control block over a live buffer.
    r("aio_write(c)", unsafe { libc::aio_write(a) } as isize);
    aio_wait("aio_write(c)", a);
    let got = h.join().unwrap();
    log(format!(
        "s read [{}]",
        String::from_utf8_lossy(&got).trim_end()
    ));
    rd("read(c) the echo", c, 100);
    close(c);
    close(s);
}

// ── signals ─────────────────────────────────────────────────────────────────────────────────

fn blocked_recv_with_signal(sigs: &[c_int]) {
    let (c, s) = pair();
    static T: AtomicI32 = AtomicI32::new(0);
    static PT: std::sync::OnceLock<libc::pthread_t> = std::sync::OnceLock::new();
    let h = std::thread::spawn(move || {
        // SAFETY: plain call.
        let _ = PT.set(unsafe { libc::pthread_self() });
        T.store(gettid(), Ordering::Release);
        recv_l("recv(s) blocking", s, 10, 0)
    });
    for &sig in sigs {
        wait_blocked(&T);
        // SAFETY: the thread is alive until joined.
        unsafe { libc::pthread_kill(*PT.get().unwrap(), sig) };
    }
    // Interrupted or still waiting: either way data ends it.
    wait_blocked_or_done(&T, &h);
    write_all(c, b"data");
    let k = h.join().unwrap();
    log(format!(
        "recv returned {}",
        if k < 0 { "error" } else { "data" }
    ));
    log(format!(
        "handled USR1 x{} USR2 x{}",
        SIGUSR1S.load(Ordering::SeqCst),
        SIGUSR2S.load(Ordering::SeqCst)
    ));
    close(c);
    close(s);
}

fn wait_blocked_or_done<T>(tid: &AtomicI32, h: &std::thread::JoinHandle<T>) {
    let t = Instant::now();
    while !h.is_finished() && t.elapsed() < Duration::from_secs(5) {
        let id = tid.load(Ordering::Acquire);
        let st = std::fs::read_to_string(format!("/proc/self/task/{id}/stat")).unwrap_or_default();
        if st.rsplit_once(") ").is_some_and(|r| r.1.starts_with('S')) {
            std::thread::sleep(Duration::from_millis(2));
            let st =
                std::fs::read_to_string(format!("/proc/self/task/{id}/stat")).unwrap_or_default();
            if h.is_finished() || st.rsplit_once(") ").is_some_and(|r| r.1.starts_with('S')) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn eintr_without_restart() {
    handle(libc::SIGUSR1, false);
    blocked_recv_with_signal(&[libc::SIGUSR1]);
}

fn sa_restart_restarts() {
    handle(libc::SIGUSR1, true);
    blocked_recv_with_signal(&[libc::SIGUSR1]);
}

fn restart_per_handler() {
    // SIGUSR2 without SA_RESTART exists in the process, but the signal that arrives (USR1) has
    // SA_RESTART: the kernel restarts the recv.
    handle(libc::SIGUSR1, true);
    handle(libc::SIGUSR2, false);
    blocked_recv_with_signal(&[libc::SIGUSR1]);
}

extern "C" {
    /// glibc's System V `signal` (what a `-std=c99` program's `signal` is): one-shot handler,
    /// no SA_RESTART.
    fn __sysv_signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t;
}

fn sysv_signal_interrupts() {
    // A handler installed with the System V `signal` has no SA_RESTART: the blocked recv ends
    // with EINTR.
    // SAFETY: an async-signal-safe handler.
    unsafe { __sysv_signal(libc::SIGUSR1, on_signal as *const () as usize) };
    blocked_recv_with_signal(&[libc::SIGUSR1]);
}

fn sysv_signal_handler_restored() {
    // The old handler `__sysv_signal` returns is the program's (never ours), and putting it
    // back with `signal` runs it once per signal.
    handle(libc::SIGUSR1, true);
    // SAFETY: async-signal-safe handlers; raise delivers synchronously.
    unsafe {
        let old = __sysv_signal(libc::SIGUSR1, libc::SIG_IGN);
        log(format!(
            "old is a handler = {}",
            old != libc::SIG_DFL && old != libc::SIG_IGN && old != libc::SIG_ERR
        ));
        libc::signal(libc::SIGUSR1, old);
        libc::raise(libc::SIGUSR1);
    }
    log(format!("handled USR1 x{}", SIGUSR1S.load(Ordering::SeqCst)));
}

// ── buffering ───────────────────────────────────────────────────────────────────────────────

fn write_before_read_both() {
    write_before_read(512 << 10);
}

fn write_before_read_3mb() {
    write_before_read(3 << 20);
}

fn write_before_read(n: usize) {
    // Both ends write N bytes before reading anything (a request/response pair written whole):
    // a deadlock when the connection holds less than N in each direction.
    let (c, s) = pair();
    #[allow(non_snake_case)]
    let N = n;
    let a: Vec<u8> = (0..N).map(|i| (i * 11) as u8).collect();
    let b: Vec<u8> = (0..N).map(|i| (i * 13) as u8).collect();
    let (da, db) = (digest(&a), digest(&b));
    let t = std::thread::spawn(move || {
        write_all(s, &b);
        read_n(s, N)
    });
    write_all(c, &a);
    let gc = read_n(c, N);
    let gs = t.join().unwrap();
    log(format!("c got [{}] want [{db}]", digest(&gc)));
    log(format!("s got [{}] want [{da}]", digest(&gs)));
    close(c);
    close(s);
}

fn fork_child_closes_all_then_connects() {
    // A child that closes every descriptor it inherited (close_range, as a program about to
    // exec does) while it holds the last reference of its parent's connection, then makes
    // connections of its own: the descriptors it gets must be its own sockets only.
    let (c, s) = pair();
    write_all(c, b"abc");
    rd("read(s)", s, 10);
    let (forked_r, forked_w) = pipe();
    let (closed_r, closed_w) = pipe();
    let closer = std::thread::spawn(move || {
        read_n(forked_r, 1);
        close(c);
        close(s);
        write_all(closed_w, b"g");
    });
    in_child(move || {
        write_all(forked_w, b"f");
        read_n(closed_r, 1);
        let keep = CHILD_PIPE.load(Ordering::Relaxed) as libc::c_uint;
        // SAFETY: integer arguments only; the trace pipe stays open.
        let r1 = unsafe { libc::close_range(3, keep - 1, 0) };
        // SAFETY: as above.
        let r2 = unsafe { libc::close_range(keep + 1, u32::MAX, 0) };
        r("close_range(3..) around the trace pipe", (r1 | r2) as isize);
        for _ in 0..3 {
            let (c2, s2) = pair();
            write_all(c2, b"ping");
            rd("child: read(s2)", s2, 10);
            write_all(s2, b"pong");
            rd("child: read(c2)", c2, 10);
            r("child: close(c2)", close(c2) as isize);
            r("child: close(s2)", close(s2) as isize);
        }
    });
    closer.join().unwrap();
    close(forked_r);
    close(forked_w);
    close(closed_r);
    close(closed_w);
}

// ── siglongjmp out of a blocking call ───────────────────────────────────────────────────────

// `sigsetjmp` cannot be called from Rust (it returns twice): this assembly frame calls it and
// then `f(arg)`; it returns 0 when `f` returned, 1 when a signal handler `siglongjmp`'d to
// `env` meanwhile (the frames of `f` are left without returning, as in a C program).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl smc_conform_escapable",
    ".type smc_conform_escapable,@function",
    "smc_conform_escapable:",
    "push rbx",
    "push r12",
    "push r13",
    "mov rbx, rdi",
    "mov r12, rsi",
    "mov r13, rdx",
    "mov rdi, rbx",
    "mov esi, 1",
    "call __sigsetjmp@PLT",
    "test eax, eax",
    "jnz 2f",
    "mov rdi, r13",
    "call r12",
    "xor eax, eax",
    "2:",
    "pop r13",
    "pop r12",
    "pop rbx",
    "ret",
    ".size smc_conform_escapable, .-smc_conform_escapable",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn smc_conform_escapable(
        env: *mut libc::c_void,
        f: extern "C" fn(*mut libc::c_void),
        arg: *mut libc::c_void,
    ) -> c_int;
    fn siglongjmp(env: *mut libc::c_void, val: c_int) -> !;
}

/// The `sigjmp_buf` of the scenario's jump (glibc's is 200 bytes on x86_64).
struct JmpBuf(std::cell::UnsafeCell<[u64; 64]>);
// SAFETY: written by sigsetjmp in one thread, read by siglongjmp in a handler of that thread.
unsafe impl Sync for JmpBuf {}
static JMP: JmpBuf = JmpBuf(std::cell::UnsafeCell::new([0; 64]));

extern "C" fn jump_out(_: c_int) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `JMP` was filled by sigsetjmp in a frame of this thread that is still live
    // (`smc_conform_escapable`, which runs the call the signal interrupts).
    unsafe {
        siglongjmp(JMP.0.get().cast(), 1)
    }
}

/// A blocking `recv` of 16 bytes on the fd `arg`; no destructor in its frame (it may be left
/// by a jump).
extern "C" fn recv16(arg: *mut libc::c_void) {
    let mut b = [0u8; 16];
    // SAFETY: valid buffer.
    unsafe { libc::recv(arg as usize as c_int, b.as_mut_ptr().cast(), 16, 0) };
}

/// Runs `recv16(fd)`; whether a signal handler left it by `siglongjmp` ([`jump_out`]).
fn recv_or_jump(fd: c_int) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `JMP` is ours; `recv16` holds nothing that needs dropping.
    return unsafe { smc_conform_escapable(JMP.0.get().cast(), recv16, fd as usize as *mut _) }
        == 1;
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = fd;
        false
    }
}

/// `sig` runs `h` with `flags`.
fn on(sig: c_int, h: extern "C" fn(c_int), flags: c_int) {
    // SAFETY: a valid sigaction.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = h as *const () as usize;
        a.sa_flags = flags;
        libc::sigemptyset(&mut a.sa_mask);
        assert_eq!(libc::sigaction(sig, &a, std::ptr::null_mut()), 0);
    }
}

/// A thread blocked in `recv` on `s` leaves it by `siglongjmp` from a SIGALRM handler, then
/// runs `after` (its own calls on the connection).
fn jump_out_of_recv(s: c_int, after: impl FnOnce() + Send + 'static) {
    use std::os::unix::thread::JoinHandleExt;
    on(libc::SIGALRM, jump_out, 0);
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        T.store(gettid(), Ordering::Release);
        let jumped = recv_or_jump(s);
        log(format!("recv left by siglongjmp: {jumped}"));
        after();
    });
    wait_blocked(&T);
    // SAFETY: a live thread of ours.
    unsafe { libc::pthread_kill(h.as_pthread_t(), libc::SIGALRM) };
    h.join().unwrap();
}

fn longjmp_recv_then_close() {
    // `alarm` + `siglongjmp` around a blocking recv, then the close of the timed-out
    // connection by the same thread: the peer reads EOF.
    let (c, s) = pair_settled();
    jump_out_of_recv(s, move || {
        r("close(s) after the jump", close(s) as isize);
    });
    if pl("poll(c,IN) after the close", c, libc::POLLIN, 5000) != 0 {
        rd("read(c)", c, 16);
    }
    close(c);
}

fn longjmp_recv_then_pingpong() {
    // After the jump the same thread goes on with the connection: 20 request/response rounds,
    // each with a blocking recv that sleeps (the peer answers after 10 ms), then its close.
    let (c, s) = pair_settled();
    let server = std::thread::spawn(move || {
        let mut n = 0;
        loop {
            let b = read_n(c, 1);
            if b.is_empty() {
                break;
            }
            // Later than any spin: the reader sleeps for each answer.
            std::thread::sleep(Duration::from_millis(10));
            write_all(c, &b);
            n += 1;
        }
        close(c);
        n
    });
    jump_out_of_recv(s, move || {
        let t = Instant::now();
        let mut ok = 0;
        for i in 0..20u8 {
            write_all(s, &[b'a' + i]);
            let mut y = [0u8; 1];
            // SAFETY: valid buffer.
            let k = unsafe { libc::recv(s, y.as_mut_ptr().cast(), 1, 0) };
            ok += (k == 1 && y[0] == b'a' + i) as u32;
        }
        // 20 rounds take 200 ms; with waits that only the 500 ms safety net ends, 10 s.
        log(format!(
            "20 rounds: {ok} answered right, within 4 s: {}",
            t.elapsed() < Duration::from_secs(4)
        ));
        r("close(s)", close(s) as isize);
    });
    let n = server.join().unwrap();
    log(format!("server: {n} rounds answered, then EOF"));
}

fn longjmp_recv_then_thread_ends() {
    // The thread that left the recv by the jump ends without another call; then another
    // thread closes the connection: the peer reads EOF.
    let (c, s) = pair_settled();
    jump_out_of_recv(s, || {});
    r("close(s) after the thread ended", close(s) as isize);
    if pl("poll(c,IN) after the close", c, libc::POLLIN, 5000) != 0 {
        rd("read(c)", c, 16);
    }
    close(c);
}

static NESTED_FD: AtomicI32 = AtomicI32::new(-1);
static NESTED_IN: AtomicBool = AtomicBool::new(false);
static NESTED_GOT: AtomicI32 = AtomicI32::new(-2);

/// A handler that makes a blocking recv of its own (on `NESTED_FD`) and returns.
extern "C" fn recv_in_handler(_: c_int) {
    NESTED_IN.store(true, Ordering::SeqCst);
    let mut b = [0u8; 16];
    // SAFETY: valid buffer.
    let k = unsafe {
        libc::recv(
            NESTED_FD.load(Ordering::SeqCst),
            b.as_mut_ptr().cast(),
            16,
            0,
        )
    };
    NESTED_GOT.store(k as i32, Ordering::SeqCst);
}

/// A thread blocked in recv on one connection is interrupted by a handler (`SA_RESTART`; on an
/// alternate signal stack inside the thread's own stack, above its blocked frames, when
/// `altstack`) that blocks in a recv on another connection. The interrupted call is not taken
/// for one left by a jump (`util::unwound`): it returns with its data, and the close after it
/// ends the connection.
fn handler_recv_inside_recv(altstack: bool) {
    use std::os::unix::thread::JoinHandleExt;
    let (c1, s1) = pair_settled();
    let (c2, s2) = pair_settled();
    NESTED_FD.store(s2, Ordering::SeqCst);
    let flags = libc::SA_RESTART | if altstack { libc::SA_ONSTACK } else { 0 };
    on(libc::SIGUSR1, recv_in_handler, flags);
    static T: AtomicI32 = AtomicI32::new(0);
    let h = std::thread::spawn(move || {
        // The alternate stack is a local of this frame: above the frames of the recv below.
        let mut stack = [0u8; 256 * 1024];
        let mut old: libc::stack_t = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: 0,
            ss_size: 0,
        };
        if altstack {
            let ss = libc::stack_t {
                ss_sp: stack.as_mut_ptr().cast(),
                ss_flags: 0,
                ss_size: stack.len(),
            };
            // SAFETY: valid stack_t pointers; the stack outlives its use (reset below).
            assert_eq!(unsafe { libc::sigaltstack(&ss, &mut old) }, 0);
        }
        T.store(gettid(), Ordering::Release);
        let mut b = [0u8; 16];
        // SAFETY: valid buffer.
        let k = unsafe { libc::recv(s1, b.as_mut_ptr().cast(), 16, 0) };
        if altstack {
            // SAFETY: the stack_t the thread had.
            unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) };
        }
        std::hint::black_box(&mut stack);
        (k, digest(&b[..k.max(0) as usize]))
    });
    wait_blocked(&T);
    // SAFETY: a live thread of ours.
    unsafe { libc::pthread_kill(h.as_pthread_t(), libc::SIGUSR1) };
    let t = Instant::now();
    while !NESTED_IN.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_blocked(&T);
    // (No close of s1 now: a TCP call interrupted by a handler holds its file only again when
    // it restarts, so the close would end the connection at once; the library's call keeps it
    // across the handler, a difference of its own.)
    write_all(c1, b"first");
    write_all(c2, b"second");
    let (k, d) = h.join().unwrap();
    log(format!(
        "handler's recv(s2) = {}",
        NESTED_GOT.load(Ordering::SeqCst)
    ));
    log(format!("interrupted recv(s1) = {k} [{d}]"));
    r("close(s1)", close(s1) as isize);
    if pl("poll(c1,IN) after the close", c1, libc::POLLIN, 5000) != 0 {
        rd("read(c1)", c1, 16);
    }
    close(c1);
    close(c2);
    close(s2);
}

fn signal_handler_recv_inside_recv() {
    handler_recv_inside_recv(false);
}

fn signal_handler_recv_inside_recv_altstack() {
    handler_recv_inside_recv(true);
}

/// Logged `recv(fd, buf, 0, flags)`.
fn recv0(what: &str, fd: c_int, flags: c_int) -> isize {
    let mut b = [0u8; 1];
    // SAFETY: a zero-length read into a live buffer.
    r(what, unsafe {
        libc::recv(fd, b.as_mut_ptr().cast(), 0, flags)
    })
}

/// A zero-length `recv` is a read for `tcp_recvmsg`: `EAGAIN` on an empty socket when it may
/// not wait, 0 with bytes queued (none consumed) or at the end; a blocking one waits once
/// (data, timeout) and says 0. `read`/`readv` of nothing say 0 at once (`sock_read_iter`).
fn zero_len_recv() {
    let (c, s) = pair();
    recv0("recv(s,0,DONTWAIT) empty", s, libc::MSG_DONTWAIT);
    recv0(
        "recv(s,0,PEEK|DONTWAIT) empty",
        s,
        libc::MSG_PEEK | libc::MSG_DONTWAIT,
    );
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    // SAFETY: a msghdr without iovecs.
    r("recvmsg(s,iovlen 0,DONTWAIT) empty", unsafe {
        libc::recvmsg(s, &mut m, libc::MSG_DONTWAIT)
    });
    rd("read(s,0) blocking empty", s, 0);
    let mut b = [0u8; 1];
    let v = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 0,
    };
    // SAFETY: one zero-length iovec.
    r("readv(s,[0]) blocking empty", unsafe {
        libc::readv(s, &v, 1)
    });
    set_nonblock(s, true);
    recv0("recv(s,0) O_NONBLOCK empty", s, 0);
    rd("read(s,0) O_NONBLOCK empty", s, 0);
    set_nonblock(s, false);
    let t = tv(100);
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t);
    recv0("recv(s,0) blocking empty, SO_RCVTIMEO", s, 0);
    let t = tv(0);
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t);
    let h = when_blocked(move || write_all(c, b"late"));
    recv0("recv(s,0) blocking empty until data", s, 0);
    h.join().unwrap();
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv0("recv(s,0,DONTWAIT) data", s, libc::MSG_DONTWAIT);
    recv0("recv(s,0) data", s, 0);
    recv_l("recv(s,100)", s, 100, 0);
    r("shutdown(c,WR)", libc_shutdown(c, libc::SHUT_WR));
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv0("recv(s,0,DONTWAIT) at EOF", s, libc::MSG_DONTWAIT);
    recv0("recv(s,0) at EOF", s, 0);
    close(c);
    close(s);
}

fn libc_shutdown(fd: c_int, how: c_int) -> isize {
    // SAFETY: integer arguments only.
    unsafe { libc::shutdown(fd, how) as isize }
}

/// `MSG_PEEK|MSG_WAITALL` (or a peek below `SO_RCVLOWAT`) with fewer bytes than asked: at the
/// timeout or a signal TCP's peek returns what it copied before its wait.
fn peek_waitall_partial() {
    handle(libc::SIGUSR1, false);
    let (c, s) = pair();
    let t = tv(100);
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t);
    recv_l(
        "recv(s,10,PEEK|WAITALL) empty, SO_RCVTIMEO",
        s,
        10,
        libc::MSG_PEEK | libc::MSG_WAITALL,
    );
    write_all(c, b"abc");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recv_l(
        "recv(s,10,PEEK|WAITALL) 3 there, SO_RCVTIMEO",
        s,
        10,
        libc::MSG_PEEK | libc::MSG_WAITALL,
    );
    let v: c_int = 5;
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v);
    recv_l(
        "recv(s,10,PEEK) 3 there, RCVLOWAT 5, SO_RCVTIMEO",
        s,
        10,
        libc::MSG_PEEK,
    );
    let v: c_int = 1;
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v);
    let t = tv(0);
    setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &t);
    // SAFETY: plain call.
    let me = unsafe { libc::pthread_self() };
    let h = when_blocked(move || {
        // SAFETY: the main thread is alive (it joins this one).
        unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
    });
    recv_l(
        "recv(s,10,PEEK|WAITALL) 3 there, signal",
        s,
        10,
        libc::MSG_PEEK | libc::MSG_WAITALL,
    );
    h.join().unwrap();
    r("shutdown(c,WR)", libc_shutdown(c, libc::SHUT_WR));
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    recv_l(
        "recv(s,10,PEEK|WAITALL) 3 there and EOF",
        s,
        10,
        libc::MSG_PEEK | libc::MSG_WAITALL,
    );
    recv_l("recv(s,100)", s, 100, 0);
    close(c);
    close(s);
}

/// More than `UIO_MAXIOV` iovecs: `EMSGSIZE` for the msghdr calls (`__copy_msghdr`, the
/// length taken as the `size_t` it is), `EINVAL` for `readv`/`writev`.
fn msg_iovlen_over_max() {
    let (c, s) = pair();
    let mut b = [0u8; 4];
    let z: Vec<libc::iovec> = (0..1025)
        .map(|_| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: 0,
        })
        .collect();
    for (what, len) in [("1025", 1025usize), ("2^32+1", (1usize << 32) + 1)] {
        // SAFETY: plain old data.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = z.as_ptr() as *mut libc::iovec;
        m.msg_iovlen = len as _;
        // SAFETY: the msghdr names `z`; the kernel refuses the length before reading it.
        r(&format!("recvmsg(s) iovlen {what}"), unsafe {
            libc::recvmsg(s, &mut m, libc::MSG_DONTWAIT)
        });
        // SAFETY: as above.
        r(&format!("sendmsg(c) iovlen {what}"), unsafe {
            libc::sendmsg(c, &m, 0)
        });
        // SAFETY: plain old data.
        let mut mm: libc::mmsghdr = unsafe { std::mem::zeroed() };
        mm.msg_hdr = m;
        // SAFETY: one mmsghdr as above.
        r(&format!("sendmmsg(c) iovlen {what}"), unsafe {
            libc::sendmmsg(c, &mut mm, 1, 0) as isize
        });
        // SAFETY: as above.
        r(&format!("recvmmsg(s) iovlen {what}"), unsafe {
            libc::recvmmsg(s, &mut mm, 1, libc::MSG_DONTWAIT, std::ptr::null_mut()) as isize
        });
    }
    // SAFETY: 1025 iovecs in `z`.
    r("readv(s) 1025", unsafe { libc::readv(s, z.as_ptr(), 1025) });
    // SAFETY: as above.
    r("writev(c) 1025", unsafe {
        libc::writev(c, z.as_ptr(), 1025)
    });
    write_all(c, b"still there");
    rd("read(s)", s, 100);
    close(c);
    close(s);
}

/// `sendfile` and `splice` with the socket as source or with arguments TCP refuses: the
/// refusal comes before any byte moves (`EINVAL`, `ESPIPE`, `EBADF`), and
/// `SPLICE_F_NONBLOCK` is for the pipe only: an empty blocking socket waits for data.
fn sendfile_splice_socket_edges() {
    let (c, s) = pair();
    let tmp = c"/tmp";
    // SAFETY: a valid path.
    let f = unsafe { libc::open(tmp.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
    assert!(f >= 0, "O_TMPFILE");
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let (pr, pw) = pipe();
    let null = std::ptr::null_mut::<libc::loff_t>();
    let mut off: libc::off_t = 0;
    let mut lo: libc::loff_t = 0;
    // SAFETY: each call below: descriptors and valid offset pointers or NULL.
    unsafe {
        r(
            "sendfile(file <- s, NULL)",
            libc::sendfile(f, s, std::ptr::null_mut(), 100),
        );
        r(
            "sendfile(file <- s, &off)",
            libc::sendfile(f, s, &mut off, 100),
        );
        r(
            "sendfile(-1 <- s, NULL)",
            libc::sendfile(-1, s, std::ptr::null_mut(), 100),
        );
        r(
            "sendfile(c <- s, NULL)",
            libc::sendfile(c, s, std::ptr::null_mut(), 100),
        );
        r(
            "sendfile(pipe read end <- s)",
            libc::sendfile(pr, s, std::ptr::null_mut(), 100),
        );
        r(
            "splice(s -> pipe, off_in)",
            libc::splice(s, &mut lo, pw, null, 100, 0),
        );
        r(
            "splice(s -> pipe, off_out)",
            libc::splice(s, null, pw, &mut lo, 100, 0),
        );
        r("splice(s -> c)", libc::splice(s, null, c, null, 100, 0));
        r("splice(s -> file)", libc::splice(s, null, f, null, 100, 0));
        r(
            "splice(s -> pipe read end)",
            libc::splice(s, null, pr, null, 100, 0),
        );
        r(
            "splice(s -> pipe, len 0)",
            libc::splice(s, null, pw, null, 0, 0),
        );
        r(
            "splice(s -> pipe, flags 0x100)",
            libc::splice(s, null, pw, null, 100, 0x100),
        );
    }
    rd("read(s): nothing was taken", s, 100);
    write_all(f, b"filedata");
    write_all(pw, b"pipedata");
    // SAFETY: each call below: as above.
    unsafe {
        lo = 0;
        r(
            "splice(file -> c, off_in)",
            libc::splice(f, &mut lo, c, null, 100, 0),
        );
        r(
            "splice(pipe -> c, off_out)",
            libc::splice(pr, null, c, &mut lo, 100, 0),
        );
        r(
            "splice(pipe -> c, off_in)",
            libc::splice(pr, &mut lo, c, null, 100, 0),
        );
        r("splice(pipe -> c)", libc::splice(pr, null, c, null, 100, 0));
    }
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    write_all(c, b"abcdef");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    // SAFETY: socket -> pipe, NULL offset.
    r("sendfile(pipe <- s, NULL, 3)", unsafe {
        libc::sendfile(pw, s, std::ptr::null_mut(), 3)
    });
    rd("read(pipe)", pr, 100);
    // SAFETY: socket -> pipe.
    r("splice(s -> pipe, NONBLOCK)", unsafe {
        libc::splice(s, null, pw, null, 100, libc::SPLICE_F_NONBLOCK)
    });
    rd("read(pipe)", pr, 100);
    let h = when_blocked(move || write_all(c, b"late"));
    // SAFETY: socket -> pipe.
    r(
        "splice(s -> pipe, NONBLOCK) blocking socket, empty until data",
        unsafe { libc::splice(s, null, pw, null, 100, libc::SPLICE_F_NONBLOCK) },
    );
    h.join().unwrap();
    rd("read(pipe)", pr, 100);
    close(f);
    close(pr);
    close(pw);
    close(c);
    close(s);
}

/// Logged read result with the bytes' digest.
fn got(what: &str, k: isize, b: &[u8]) {
    if k > 0 {
        log(format!("{what} = {k} [{}]", digest(&b[..k as usize])));
    } else {
        r(what, k);
    }
}

/// Calls that reach a socket without libc's `read`/`write`/`recv`/`send` wrappers:
/// `preadv2`/`pwritev2` at offset -1 (`readv`/`writev`; `RWF_NOWAIT` does not wait; other
/// offsets `ESPIPE`/`EINVAL`, unknown flags `EOPNOTSUPP`), and the data system calls made
/// through `syscall(2)`.
fn preadv2_and_raw_syscalls() {
    let (c, s) = pair();
    let mut b = [0u8; 100];
    let v = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: b.len(),
    };
    let v0 = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 0,
    };
    let w = libc::iovec {
        iov_base: b"pwv".as_ptr() as *mut libc::c_void,
        iov_len: 3,
    };
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    // SAFETY: each call below: one iovec over `b` (writable) or a static (readable).
    unsafe {
        r("preadv2(s, off 0)", libc::preadv2(s, &v, 1, 0, 0));
        r("preadv2(s, off -2)", libc::preadv2(s, &v, 1, -2, 0));
        r(
            "preadv2(s, off -1, flags 0x1000)",
            libc::preadv2(s, &v, 1, -1, 0x1000),
        );
        r(
            "preadv2(s, off -1, nothing)",
            libc::preadv2(s, &v0, 1, -1, 0),
        );
        let k = libc::preadv2(s, &v, 1, -1, libc::RWF_HIPRI);
        got("preadv2(s, off -1, HIPRI)", k, &b);
        r(
            "preadv2(s, off -1, NOWAIT) empty",
            libc::preadv2(s, &v, 1, -1, libc::RWF_NOWAIT),
        );
        r("pwritev2(c, off 0)", libc::pwritev2(c, &w, 1, 0, 0));
        r(
            "pwritev2(c, off -1, flags 0x1000)",
            libc::pwritev2(c, &w, 1, -1, 0x1000),
        );
        r(
            "pwritev2(c, off -1, DSYNC)",
            libc::pwritev2(c, &w, 1, -1, libc::RWF_DSYNC),
        );
        r(
            "pwritev2(c, off -1, NOWAIT)",
            libc::pwritev2(c, &w, 1, -1, libc::RWF_NOWAIT),
        );
    }
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    rd("read(s)", s, 100);
    let h = when_blocked(move || write_all(c, b"late"));
    // SAFETY: one iovec over `b`.
    let k = unsafe { libc::preadv2(s, &v, 1, -1, 0) };
    got("preadv2(s, off -1) blocking, empty until data", k, &b);
    h.join().unwrap();
    let sys = |n: libc::c_long, a: [libc::c_long; 6]| -> isize {
        // SAFETY: the arguments each call below gives the system call: descriptors, buffers
        // of their lengths, NULL addresses.
        unsafe { libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]) as isize }
    };
    let (cl, sl) = (c as libc::c_long, s as libc::c_long);
    let bp = b.as_mut_ptr() as libc::c_long;
    r(
        "syscall(SYS_write, c)",
        sys(libc::SYS_write, [cl, b"sys".as_ptr() as _, 3, 0, 0, 0]),
    );
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let k = sys(libc::SYS_read, [sl, bp, 100, 0, 0, 0]);
    got("syscall(SYS_read, s)", k, &b);
    r("syscall(SYS_read, s, DONTWAIT via O_NONBLOCK) empty", {
        set_nonblock(s, true);
        let k = sys(libc::SYS_read, [sl, bp, 100, 0, 0, 0]);
        let e = errno();
        set_nonblock(s, false);
        set_errno(e);
        k
    });
    let wv = &w as *const libc::iovec as libc::c_long;
    let rv = &v as *const libc::iovec as libc::c_long;
    r(
        "syscall(SYS_writev, c)",
        sys(libc::SYS_writev, [cl, wv, 1, 0, 0, 0]),
    );
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let k = sys(libc::SYS_readv, [sl, rv, 1, 0, 0, 0]);
    got("syscall(SYS_readv, s)", k, &b);
    r(
        "syscall(SYS_sendto, c)",
        sys(libc::SYS_sendto, [cl, b"sendto".as_ptr() as _, 6, 0, 0, 0]),
    );
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let k = sys(libc::SYS_recvfrom, [sl, bp, 100, libc::MSG_PEEK as _, 0, 0]);
    got("syscall(SYS_recvfrom, s, PEEK)", k, &b);
    let k = sys(libc::SYS_recvfrom, [sl, bp, 100, 0, 0, 0]);
    got("syscall(SYS_recvfrom, s)", k, &b);
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &w as *const libc::iovec as *mut libc::iovec;
    m.msg_iovlen = 1;
    let mp = &mut m as *mut libc::msghdr as libc::c_long;
    r(
        "syscall(SYS_sendmsg, c)",
        sys(libc::SYS_sendmsg, [cl, mp, 0, 0, 0, 0]),
    );
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    // SAFETY: plain old data.
    let mut mr: libc::msghdr = unsafe { std::mem::zeroed() };
    mr.msg_iov = &v as *const libc::iovec as *mut libc::iovec;
    mr.msg_iovlen = 1;
    let mrp = &mut mr as *mut libc::msghdr as libc::c_long;
    let k = sys(libc::SYS_recvmsg, [sl, mrp, 0, 0, 0, 0]);
    got("syscall(SYS_recvmsg, s)", k, &b);
    let h = when_blocked(move || write_all(c, b"later"));
    let k = sys(libc::SYS_read, [sl, bp, 100, 0, 0, 0]);
    got("syscall(SYS_read, s) blocking, empty until data", k, &b);
    h.join().unwrap();
    close(c);
    close(s);
}

/// Logged `recvmsg` of up to `n` bytes with a control buffer of `ctl` bytes (`None`: NULL):
/// result, `msg_controllen`, `msg_flags` and the first control message as far as it came.
fn recvmsg_ctl(what: &str, fd: c_int, n: usize, flags: c_int, ctl: Option<usize>) -> isize {
    let mut b = vec![0u8; n.max(1)];
    let mut cb = [0x55u8; 64];
    let mut v = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: n,
    };
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut v;
    m.msg_iovlen = 1;
    if let Some(l) = ctl {
        m.msg_control = cb.as_mut_ptr().cast();
        m.msg_controllen = l.min(cb.len()) as _;
    }
    m.msg_flags = 0x5a5a;
    // SAFETY: a msghdr over live buffers of the lengths it gives.
    let k = unsafe { libc::recvmsg(fd, &mut m, flags) };
    let e = errno();
    if k < 0 {
        set_errno(e);
        return r(what, k);
    }
    let mut line = format!(
        "{what} = {k} [{}] controllen {} flags {:#x}",
        digest(&b[..k as usize]),
        m.msg_controllen,
        m.msg_flags
    );
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    if m.msg_controllen as usize >= hdr {
        // SAFETY: at least a header was written into `cb`.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(cb.as_ptr().cast()) };
        line += &format!(
            " cmsg len {} level {} type {} data {:02x?}",
            h.cmsg_len,
            h.cmsg_level,
            h.cmsg_type,
            &cb[hdr..(h.cmsg_len as usize).min(cb.len())]
        );
    }
    log(line);
    k
}

/// `TCP_INQ` on (gRPC sets it): each successful `recvmsg`/`recvmmsg` carries `TCP_CM_INQ`,
/// the bytes still queued (plus one once the FIN came), cut to a short control buffer as
/// `put_cmsg` cuts (`MSG_CTRUNC`); set before the connection (the client) or after it (the
/// server), and off again.
fn tcp_inq_cmsg() {
    let (l, port) = listener();
    let h = std::thread::spawn(move || accept_fd(l));
    let c = tcp_socket();
    let on: c_int = 1;
    let off: c_int = 0;
    r(
        "TCP_INQ 1 on the client before connect",
        setsockopt_raw(c, libc::IPPROTO_TCP, libc::TCP_INQ, &on) as isize,
    );
    r("connect", connect_to(c, port) as isize);
    let s = h.join().unwrap();
    close(l);
    write_all(s, b"hello");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    recvmsg_ctl("recvmsg(c,2)", c, 2, 0, Some(64));
    r(
        "TCP_INQ 1 on the server",
        setsockopt_raw(s, libc::IPPROTO_TCP, libc::TCP_INQ, &on) as isize,
    );
    let two: c_int = 2;
    r(
        "TCP_INQ 2",
        setsockopt_raw(s, libc::IPPROTO_TCP, libc::TCP_INQ, &two) as isize,
    );
    recvmsg_ctl(
        "recvmsg(s) empty, DONTWAIT",
        s,
        4,
        libc::MSG_DONTWAIT,
        Some(64),
    );
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    recvmsg_ctl("recvmsg(s,4)", s, 4, 0, Some(64));
    recvmsg_ctl("recvmsg(s,2,PEEK)", s, 2, libc::MSG_PEEK, Some(64));
    recvmsg_ctl("recvmsg(s,1) no control buffer", s, 1, 0, None);
    for l in [10, 16, 18, 20] {
        recvmsg_ctl(&format!("recvmsg(s,1) control {l}"), s, 1, 0, Some(l));
    }
    r("shutdown(c,WR)", libc_shutdown(c, libc::SHUT_WR));
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    recvmsg_ctl("recvmsg(s,1) after FIN", s, 1, 0, Some(64));
    recvmsg_ctl("recvmsg(s,100) at EOF", s, 100, 0, Some(64));
    recvmsg_ctl("recvmsg(s,0) at EOF", s, 0, 0, Some(64));
    r(
        "TCP_INQ 0 on the server",
        setsockopt_raw(s, libc::IPPROTO_TCP, libc::TCP_INQ, &off) as isize,
    );
    recvmsg_ctl("recvmsg(s) off", s, 100, 0, Some(64));
    write_all(s, b"abc");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    let mut b = [0u8; 8];
    let mut cb = [0u8; 64];
    let mut v = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 2,
    };
    // SAFETY: plain old data.
    let mut mm: libc::mmsghdr = unsafe { std::mem::zeroed() };
    mm.msg_hdr.msg_iov = &mut v;
    mm.msg_hdr.msg_iovlen = 1;
    mm.msg_hdr.msg_control = cb.as_mut_ptr().cast();
    mm.msg_hdr.msg_controllen = cb.len() as _;
    // SAFETY: one mmsghdr over live buffers.
    let k = unsafe { libc::recvmmsg(c, &mut mm, 1, 0, std::ptr::null_mut()) };
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    log(format!(
        "recvmmsg(c) = {k}, len {}, controllen {}, inq {:?}",
        mm.msg_len,
        mm.msg_hdr.msg_controllen,
        &cb[hdr..hdr + 4]
    ));
    close(c);
    close(s);
}

// ── the stream's state as TCP shows it (rt9 `states`, `rst`, `tcpinfo`, `peekoff`) ─────────

/// TCP states by `tcpi_state` (`include/net/tcp_states.h`).
fn tcp_state_name(st: u8) -> String {
    smc_stats::tcp_state_name(st).map_or_else(|| format!("state{st}"), str::to_string)
}

/// `TCP_INFO` of `fd` (the whole struct as the kernel fills it, zeros past what it wrote).
fn tcp_info_raw(fd: c_int) -> Option<[u8; 256]> {
    let mut b = [0u8; 256];
    let mut l = b.len() as libc::socklen_t;
    // SAFETY: valid out buffer and length.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            b.as_mut_ptr().cast(),
            &mut l,
        )
    };
    (rc == 0).then_some(b)
}

/// Logs `tcpi_state` of `fd` once it left the states a FIN or its ACK is still on the way in
/// (FIN_WAIT1, LAST_ACK, CLOSING: the peer's kernel may delay the ACK of a FIN by its
/// delayed-ACK time): waits for that, up to 5 s.
fn tcp_state(what: &str, fd: c_int) {
    let t = Instant::now();
    loop {
        let Some(b) = tcp_info_raw(fd) else {
            r(&format!("{what} TCP_INFO"), -1);
            return;
        };
        if !matches!(b[0], 4 | 9 | 11) || t.elapsed() > Duration::from_secs(5) {
            log(format!("{what} tcpi_state = {}", tcp_state_name(b[0])));
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn getpeername_l(what: &str, fd: c_int) {
    // SAFETY: plain old data.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut l = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid out buffers.
    let rc = unsafe { libc::getpeername(fd, (&mut a as *mut libc::sockaddr_in).cast(), &mut l) };
    if rc == 0 {
        log(format!(
            "{what} = 0, port is the peer's: {}",
            a.sin_port != 0
        ));
    } else {
        r(what, -1);
    }
}

/// Both ends shut writing in turn, then a connection whose ends shut reading only: the state
/// at each step (FIN_WAIT2 / CLOSE_WAIT, then CLOSE both: TIME_WAIT's full socket and LAST_ACK
/// acknowledged), and in CLOSE `getpeername` and `shutdown` say `ENOTCONN`.
fn tcp_state_orderly_close() {
    let (c, s) = pair_settled();
    tcp_state("fresh c", c);
    tcp_state("fresh s", s);
    r("shutdown(c,WR)", libc_shutdown(c, libc::SHUT_WR));
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    rd("read(s) EOF", s, 10);
    tcp_state("after c SHUT_WR: c", c);
    tcp_state("after c SHUT_WR: s", s);
    getpeername_l("getpeername(s) in CLOSE_WAIT", s);
    write_all(s, b"late");
    assert_eq!(read_n(c, 4), b"late");
    r("shutdown(s,WR)", libc_shutdown(s, libc::SHUT_WR));
    pl("poll(c,IN|RDHUP)", c, libc::POLLIN | libc::POLLRDHUP, 5000);
    rd("read(c) EOF", c, 10);
    tcp_state("after both SHUT_WR: c", c);
    tcp_state("after both SHUT_WR: s", s);
    getpeername_l("getpeername(c)", c);
    getpeername_l("getpeername(s)", s);
    r("shutdown(c,RD) in CLOSE", libc_shutdown(c, libc::SHUT_RD));
    r(
        "shutdown(s,RDWR) in CLOSE",
        libc_shutdown(s, libc::SHUT_RDWR),
    );
    // SAFETY: valid buffer.
    let k = unsafe { libc::send(s, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    r("send(s) in CLOSE", k);
    close(c);
    close(s);
    let (c, s) = pair_settled();
    r("shutdown(s,RD)", libc_shutdown(s, libc::SHUT_RD));
    r("shutdown(c,RD)", libc_shutdown(c, libc::SHUT_RD));
    tcp_state("after both SHUT_RD: s", s);
    tcp_state("after both SHUT_RD: c", c);
    getpeername_l("getpeername(c) after SHUT_RD", c);
    close(c);
    close(s);
}

/// A reset either way: the peer's close with `SO_LINGER {1, 0}`, its close with our bytes
/// unread, our write after its orderly close: CLOSE, `getpeername` and `shutdown` `ENOTCONN`
/// (`getsockname` still the local address).
fn tcp_state_after_reset() {
    let (c, s) = pair_settled();
    linger0(c);
    close(c);
    pl(
        "poll(s,IN) after the peer's linger-0 close",
        s,
        libc::POLLIN,
        5000,
    );
    tcp_state("after the reset: s", s);
    getpeername_l("getpeername(s)", s);
    // SAFETY: plain old data.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut l = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid out buffers.
    let rc = unsafe { libc::getsockname(s, (&mut a as *mut libc::sockaddr_in).cast(), &mut l) };
    r("getsockname(s)", rc as isize);
    rd("read(s)", s, 10);
    r("shutdown(s,WR)", libc_shutdown(s, libc::SHUT_WR));
    close(s);
    let (c, s) = pair_settled();
    write_all(s, b"unread");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    close(c);
    pl(
        "poll(s,IN) after the peer closed with bytes unread",
        s,
        libc::POLLIN,
        5000,
    );
    tcp_state("after the abort: s", s);
    getpeername_l("getpeername(s)", s);
    r("shutdown(s,RD)", libc_shutdown(s, libc::SHUT_RD));
    close(s);
    let (c, s) = pair_settled();
    close(c);
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    tcp_state("after the peer's close: s", s);
    getpeername_l("getpeername(s) in CLOSE_WAIT", s);
    // SAFETY: valid buffer.
    let k = unsafe { libc::send(s, b"x".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    r("send(s) after the peer's close", k);
    // The peer's kernel answers with a reset: both directions shut (POLLHUP).
    pl("poll(s,0) for the reset", s, 0, 5000);
    tcp_state("after the reset it drew: s", s);
    getpeername_l("getpeername(s)", s);
    r("shutdown(s,WR)", libc_shutdown(s, libc::SHUT_WR));
    close(s);
}

/// `TCP_INFO`'s byte counts while established: sent, acknowledged (the peer's reply
/// acknowledges all before it, and a client's SYN counts), received.
fn tcp_info_byte_counts() {
    let (c, s) = pair();
    let big = vec![7u8; 100_000];
    let h = std::thread::spawn(move || write_all(c, &big));
    assert_eq!(read_n(s, 100_000).len(), 100_000);
    h.join().unwrap();
    write_all(s, &[9u8; 5000]);
    assert_eq!(read_n(c, 5000).len(), 5000);
    let bytes = |what: &str, fd: c_int| {
        let Some(b) = tcp_info_raw(fd) else {
            r(&format!("{what} TCP_INFO"), -1);
            return;
        };
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        log(format!(
            "{what}: state {} bytes_acked {} bytes_received {} bytes_sent {}",
            tcp_state_name(b[0]),
            u64_at(120),
            u64_at(128),
            u64_at(200)
        ));
    };
    bytes("c after its 100000 and the reply", c);
    write_all(c, b"k");
    assert_eq!(read_n(s, 1), b"k");
    bytes("s after its 5000 and the reply", s);
    close(c);
    close(s);
}

fn peek_l(what: &str, fd: c_int, n: usize, flags: c_int) {
    recv_l(what, fd, n, libc::MSG_PEEK | flags);
}

fn peek_off_l(what: &str, fd: c_int) {
    let (rc, v) = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF);
    if rc != 0 {
        r(what, -1);
    } else {
        log(format!("{what} = {v}"));
    }
}

/// `SO_PEEK_OFF` (TCP since Linux 6.9): successive peeks go on where the last one stopped, a
/// read moves the offset back by what it took; past the bytes there a peek waits (`EAGAIN`
/// without waiting) or, after the FIN, says 0; negative turns it off. Set after the
/// connection, and on a client before it connects.
fn so_peek_off() {
    let (c, s) = pair_settled();
    peek_off_l("SO_PEEK_OFF(s) at first", s);
    let zero: c_int = 0;
    r(
        "SO_PEEK_OFF(s) 0",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &zero) as isize,
    );
    write_all(c, b"0123456789");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    inq("FIONREAD(s)", s);
    peek_l("peek(s,3)", s, 3, 0);
    peek_l("peek(s,3) again", s, 3, 0);
    peek_off_l("SO_PEEK_OFF(s)", s);
    recv_l("recv(s,2)", s, 2, 0);
    peek_off_l("SO_PEEK_OFF(s) after the read", s);
    peek_l("peek(s,3)", s, 3, 0);
    peek_l("peek(s,10,DONTWAIT)", s, 10, libc::MSG_DONTWAIT);
    peek_l(
        "peek(s,10,DONTWAIT) past the bytes",
        s,
        10,
        libc::MSG_DONTWAIT,
    );
    peek_l(
        "peek(s,10,DONTWAIT|TRUNC) past the bytes",
        s,
        10,
        libc::MSG_DONTWAIT | libc::MSG_TRUNC,
    );
    inq("FIONREAD(s)", s);
    recv_l("recv(s,100)", s, 100, 0);
    peek_off_l("SO_PEEK_OFF(s) after reading all", s);
    write_all(c, b"abcdef");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    peek_l("peek(s,2,TRUNC)", s, 2, libc::MSG_TRUNC);
    peek_off_l("SO_PEEK_OFF(s) after a TRUNC peek", s);
    let off: c_int = -1;
    r(
        "SO_PEEK_OFF(s) -1",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &off) as isize,
    );
    peek_l("peek(s,2) off", s, 2, 0);
    peek_l("peek(s,2) off again", s, 2, 0);
    recv_l("recv(s,1) off", s, 1, 0);
    peek_off_l("SO_PEEK_OFF(s) off", s);
    let four: c_int = 4;
    r(
        "SO_PEEK_OFF(s) 4",
        setsockopt_raw(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &four) as isize,
    );
    peek_l("peek(s,10) from 4", s, 10, 0);
    r("shutdown(c,WR)", libc_shutdown(c, libc::SHUT_WR));
    pl("poll(s,IN|RDHUP)", s, libc::POLLIN | libc::POLLRDHUP, 5000);
    peek_l("peek(s,10) past the bytes at EOF", s, 10, 0);
    recv_l("recv(s,100)", s, 100, 0);
    peek_off_l("SO_PEEK_OFF(s) at the end", s);
    recv_l("recv(s,100) EOF", s, 100, 0);
    close(c);
    close(s);
    // Set on the client before it connects.
    let (l, port) = listener();
    let h = std::thread::spawn(move || accept_fd(l));
    let c = tcp_socket();
    r(
        "SO_PEEK_OFF(c) 0 before connect",
        setsockopt_raw(c, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &zero) as isize,
    );
    r("connect", connect_to(c, port) as isize);
    let s = h.join().unwrap();
    close(l);
    write_all(s, b"xyzw");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    peek_off_l("SO_PEEK_OFF(c) connected", c);
    peek_l("peek(c,2)", c, 2, 0);
    peek_l("peek(c,2) again", c, 2, 0);
    recv_l("recv(c,10)", c, 10, 0);
    write_all(c, b"pong");
    assert_eq!(read_n(s, 4), b"pong");
    close(c);
    close(s);
}

/// One thread holds both ends of a connection (a program that talks to itself) and hands them
/// to stdio: the first `fdopen` switches the connection to TCP, and nobody else could answer
/// for the peer's end but this thread, which is inside that call. Bytes written before and
/// left unread in each direction come first, in order.
fn fdopen_both_ends_one_thread() {
    let (c, s) = pair_settled();
    write_all(c, b"unread to s, ");
    write_all(s, b"unread to c, ");
    // SAFETY: valid mode strings; the FILEs are closed below.
    let fc = unsafe { libc::fdopen(c, c"r+".as_ptr()) };
    log(format!("fdopen(c) ok = {}", !fc.is_null()));
    // SAFETY: as above.
    let fs = unsafe { libc::fdopen(s, c"r+".as_ptr()) };
    log(format!("fdopen(s) ok = {}", !fs.is_null()));
    let line = |f: *mut libc::FILE| {
        let mut b = [0u8; 128];
        // SAFETY: a buffer of its length; the FILE is open.
        let p = unsafe { libc::fgets(b.as_mut_ptr().cast(), b.len() as c_int, f) };
        if p.is_null() {
            String::from("(null)")
        } else {
            // SAFETY: fgets NUL-terminates.
            unsafe { std::ffi::CStr::from_ptr(b.as_ptr().cast()) }
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: valid strings; the FILEs are open.
    unsafe {
        libc::fputs(c"then stdio to s\n".as_ptr(), fc);
        libc::fflush(fc);
    }
    log(format!("fgets(s) = {:?}", line(fs)));
    // SAFETY: as above.
    unsafe {
        libc::fputs(c"then stdio to c\n".as_ptr(), fs);
        libc::fflush(fs);
    }
    log(format!("fgets(c) = {:?}", line(fc)));
    // SAFETY: the FILEs from fdopen (they close c and s).
    let (a, b) = unsafe { (libc::fclose(fc), libc::fclose(fs)) };
    log(format!("fclose = {a} {b}"));
}

/// One thread holds both ends and starts an `aio_write` on one: the switch to TCP it needs is
/// answered for the other end by the same call (nobody else could); then a plain `read` of the
/// other end gets the ring's unread bytes, then the aio's.
fn aio_write_both_ends_one_thread() {
    let (c, s) = pair_settled();
    write_all(c, b"ring bytes, ");
    let a = aiocb_for(c, libc::LIO_WRITE, aio_buf(b"aio bytes"));
    // SAFETY: a live control block over a live buffer.
    r("aio_write(c)", unsafe { libc::aio_write(a) } as isize);
    aio_wait("aio_write(c)", a);
    log(format!(
        "read(s) = [{}]",
        String::from_utf8_lossy(&read_n(s, 21))
    ));
    write_all(s, b"answer");
    rd("read(c)", c, 100);
    close(c);
    rd("read(s) after the peer closed", s, 100);
    close(s);
}

/// The thread's signal mask: whether `sig` is blocked, as a log line.
fn log_blocked(what: &str, sig: c_int) {
    // SAFETY: a zeroed sigset_t is valid output space; the call only fills it.
    let blocked = unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut cur);
        libc::sigismember(&cur, sig) == 1
    };
    log(format!("{what}: blocked {blocked}"));
}

/// The connection still carries bytes both ways after the call under test.
fn echo_after(c: c_int, s: c_int) {
    write_all(c, b"after");
    log(format!(
        "s read {:?}",
        String::from_utf8_lossy(&read_n(s, 5))
    ));
    write_all(s, b"back");
    log(format!(
        "c read {:?}",
        String::from_utf8_lossy(&read_n(c, 4))
    ));
}

/// `sigsuspend` with a signal pending that its mask lets through: the handler runs, the call
/// says `EINTR` at once, the thread's mask is back as before (the signal blocked again); a
/// signal the mask keeps blocked stays pending.
fn sigsuspend_with_a_connection() {
    let (c, s) = pair();
    handle(libc::SIGUSR1, true);
    handle(libc::SIGUSR2, true);
    // SAFETY: sets of our own; raise delivers to this thread (pending while blocked).
    unsafe {
        let mut blk: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut blk);
        libc::sigaddset(&mut blk, libc::SIGUSR1);
        libc::sigaddset(&mut blk, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &blk, std::ptr::null_mut());
        libc::raise(libc::SIGUSR2);
        libc::raise(libc::SIGUSR1);
        let mut during: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut during);
        libc::sigaddset(&mut during, libc::SIGUSR2);
        r(
            "sigsuspend(all but USR2)",
            libc::sigsuspend(&during) as isize,
        );
    }
    log(format!(
        "handled USR1 x{} USR2 x{}",
        SIGUSR1S.load(Ordering::SeqCst),
        SIGUSR2S.load(Ordering::SeqCst)
    ));
    log_blocked("after sigsuspend, USR1", libc::SIGUSR1);
    // SAFETY: a set of our own; unblocking delivers the pending USR2.
    unsafe {
        let mut blk: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut blk);
        libc::sigaddset(&mut blk, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &blk, std::ptr::null_mut());
    }
    log(format!(
        "after unblocking: USR2 x{}",
        SIGUSR2S.load(Ordering::SeqCst)
    ));
    echo_after(c, s);
    close(c);
    close(s);
}

/// `pause` in a thread until a signal comes: `EINTR` after the handler ran, whatever
/// `SA_RESTART` says.
fn pause_with_a_connection() {
    let (c, s) = pair();
    handle(libc::SIGUSR1, true);
    static T: AtomicI32 = AtomicI32::new(0);
    static PT: std::sync::OnceLock<libc::pthread_t> = std::sync::OnceLock::new();
    let h = std::thread::spawn(|| {
        // SAFETY: plain calls.
        let _ = PT.set(unsafe { libc::pthread_self() });
        T.store(gettid(), Ordering::Release);
        // SAFETY: plain call.
        let r = unsafe { libc::pause() };
        (r, errno())
    });
    wait_blocked(&T);
    // SAFETY: the thread is alive until joined (it waits for this signal).
    unsafe { libc::pthread_kill(*PT.get().unwrap(), libc::SIGUSR1) };
    let (rc, e) = h.join().unwrap();
    log(format!("pause = {rc} {}", ename(e)));
    log(format!("handled USR1 x{}", SIGUSR1S.load(Ordering::SeqCst)));
    echo_after(c, s);
    close(c);
    close(s);
}

/// A forked child that exits with `code` once a byte comes on the pipe returned (read end,
/// write end).
fn child_exiting_when_told(code: c_int) -> (libc::pid_t, [c_int; 2]) {
    let mut p = [0; 2];
    // SAFETY: valid array of two.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only async-signal-safe calls, then `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut b = [0u8; 1];
        // SAFETY: valid buffer; then exit without running the parent's handlers.
        unsafe {
            libc::read(p[0], b.as_mut_ptr().cast(), 1);
            libc::_exit(code)
        }
    }
    (pid, p)
}

/// A child that exits 7 once told to (a pipe): `waitid` with `WNOHANG` before (no child
/// ready: 0 and `si_pid` 0), then `WEXITED | WNOWAIT` (leaves it waitable), then `WEXITED`
/// (reaps it), then `ECHILD`.
fn waitid_with_a_connection() {
    let (c, s) = pair();
    let (pid, p) = child_exiting_when_told(7);
    let show = |what: &str, opts: c_int| {
        // SAFETY: a zeroed siginfo_t is valid output space.
        let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid output record.
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut si, opts) };
        let e = errno();
        // SAFETY: the kernel filled it (or it is zeroed).
        let (spid, status) = unsafe { (si.si_pid(), si.si_status()) };
        log(format!(
            "{what} = {rc} {} child {} code {} status {}",
            if rc < 0 { ename(e) } else { String::new() },
            spid == pid,
            si.si_code,
            status
        ));
    };
    show(
        "waitid(WEXITED|WNOHANG) before",
        libc::WEXITED | libc::WNOHANG,
    );
    write_all(p[1], b"x");
    show("waitid(WEXITED|WNOWAIT)", libc::WEXITED | libc::WNOWAIT);
    show("waitid(WEXITED)", libc::WEXITED);
    show("waitid(WEXITED) again", libc::WEXITED);
    close(p[0]);
    close(p[1]);
    echo_after(c, s);
    close(c);
    close(s);
}

/// `waitpid(pid, WNOHANG)` before the child is done (0), then in a loop until it is (its
/// pid, exit status 3).
fn waitpid_nohang_with_a_connection() {
    let (c, s) = pair();
    let (pid, p) = child_exiting_when_told(3);
    let mut st = 0;
    // SAFETY: valid status pointer.
    r(
        "waitpid(WNOHANG) before",
        unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } as isize,
    );
    write_all(p[1], b"x");
    let got = loop {
        // SAFETY: valid status pointer.
        let w = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
        if w != 0 {
            break w;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    log(format!(
        "waitpid(WNOHANG) loop: the child {} exit {}",
        got == pid,
        libc::WEXITSTATUS(st)
    ));
    close(p[0]);
    close(p[1]);
    echo_after(c, s);
    close(c);
    close(s);
}

/// nginx's master's shape: a signal blocked and handled, a child started, `sigsuspend` with
/// an empty mask until the child's signal runs the handler, then `waitpid(WNOHANG)` reaps it.
/// The child signals this very thread (`tgkill`): a process-directed signal such as
/// `SIGCHLD` may be taken by another thread of the harness, whose mask lets it through.
fn signal_from_child_sigsuspend_with_a_connection() {
    let (c, s) = pair();
    handle(libc::SIGUSR1, true);
    // SAFETY: a set of our own.
    unsafe {
        let mut blk: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut blk);
        libc::sigaddset(&mut blk, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &blk, std::ptr::null_mut());
    }
    // SAFETY: plain calls.
    let (ppid, tid) = (unsafe { libc::getpid() }, gettid());
    // SAFETY: the child makes one system call, then exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system call; exit without running the parent's handlers.
        unsafe {
            libc::syscall(libc::SYS_tgkill, ppid, tid, libc::SIGUSR1);
            libc::_exit(5)
        };
    }
    let mut rounds = 0;
    while SIGUSR1S.load(Ordering::SeqCst) == 0 && rounds < 1000 {
        rounds += 1;
        // SAFETY: an empty set of our own.
        let rc = unsafe {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigsuspend(&none)
        };
        if rounds == 1 {
            r("sigsuspend(none)", rc as isize);
        }
    }
    log(format!("handled USR1 x{}", SIGUSR1S.load(Ordering::SeqCst)));
    log_blocked("after sigsuspend, USR1", libc::SIGUSR1);
    let mut st = 0;
    // SAFETY: valid status pointer.
    let w = unsafe { libc::waitpid(pid, &mut st, 0) };
    log(format!(
        "waitpid: the child {} exit {}",
        w == pid,
        libc::WEXITSTATUS(st)
    ));
    echo_after(c, s);
    close(c);
    close(s);
}

/// The connection a handler closes ([`close_from_a_handler_during_a_blocking_call`]), and
/// what it does: 0 `close`, else `dup2` of that descriptor over it.
static CLOSE_FD: AtomicI32 = AtomicI32::new(-1);
static CLOSE_HOW: AtomicI32 = AtomicI32::new(0);

/// `SIGALRM` runs [`close_on_alarm`] (`SA_RESTART`); returns a descriptor of /dev/null for its
/// `dup2` flavour.
fn close_on_alarm_installed() -> c_int {
    // SAFETY: a valid sigaction with an async-signal-safe handler.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = close_on_alarm as *const () as usize;
        a.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut a.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGALRM, &a, std::ptr::null_mut()), 0);
    }
    // SAFETY: a C string path.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) }
}

/// `SIGALRM` aimed at the calling thread in 50 ms (a process-directed one may go to another
/// thread); the caller joins the timer before it ends.
fn alarm_this_thread_in_50ms() -> std::thread::JoinHandle<()> {
    // SAFETY: plain call.
    let me = unsafe { libc::pthread_self() } as usize;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: the caller joins this thread before it ends.
        unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGALRM) };
    })
}

extern "C" fn close_on_alarm(_: c_int) {
    // SAFETY: `close` and `dup2` are async-signal-safe; errno is the interrupted code's.
    unsafe {
        let e = *libc::__errno_location();
        let (fd, how) = (
            CLOSE_FD.load(Ordering::SeqCst),
            CLOSE_HOW.load(Ordering::SeqCst),
        );
        if how == 0 {
            libc::close(fd);
        } else {
            libc::dup2(how, fd);
        }
        *libc::__errno_location() = e;
    }
}

/// An old-style timeout: a blocking `recv`, `read` or `send` whose connection the thread's own
/// `SIGALRM` handler (`SA_RESTART`) closes, or makes name /dev/null with `dup2`. The kernel
/// restarts the call by looking the number up again: `EBADF` (closed), `ENOTSOCK` (`recv` on
/// /dev/null), 0 (`read` of /dev/null); a `send` that had sent a part returns it, the next
/// one fails. The peer reads EOF. Before, our call went on waiting on the connection (for the
/// peer's next byte or room, for ever when the peer waits too: red team `sigsafe_inflight.c
/// recv close 1`, the read returned only when the peer closed 3 s later, TCP `EBADF` at once).
fn close_from_a_handler_during_a_blocking_call() {
    let null = close_on_alarm_installed();
    let chunk = vec![7u8; 1 << 20];
    for (how, op) in [
        (0, "recv"),
        (0, "read"),
        (0, "send"),
        (null, "recv"),
        (null, "read"),
        (null, "send"),
    ] {
        let (c, s) = pair();
        CLOSE_FD.store(c, Ordering::SeqCst);
        CLOSE_HOW.store(how, Ordering::SeqCst);
        let what = if how == 0 { "close" } else { "dup2 /dev/null" };
        let timer = alarm_this_thread_in_50ms();
        let mut b = [0u8; 100];
        match op {
            // SAFETY: valid buffer.
            "recv" => r(&format!("recv(c) while the handler does {what}"), unsafe {
                libc::recv(c, b.as_mut_ptr().cast(), b.len(), 0)
            }),
            // SAFETY: valid buffer.
            "read" => r(&format!("read(c) while the handler does {what}"), unsafe {
                libc::read(c, b.as_mut_ptr().cast(), b.len())
            }),
            _ => {
                // The peer reads nothing: the sends fill the connection and block.
                let ended = loop {
                    // SAFETY: valid buffer.
                    let w = unsafe {
                        libc::send(c, chunk.as_ptr().cast(), chunk.len(), libc::MSG_NOSIGNAL)
                    };
                    if w < 0 {
                        break ename(errno());
                    }
                };
                log(format!(
                    "send(c) while the handler does {what}: ended with {ended}"
                ));
                0
            }
        };
        timer.join().unwrap();
        if op != "send" {
            rd("read(s)", s, 100);
        }
        if how != 0 {
            close(c);
        }
        close(s);
    }
    close(null);
    // SAFETY: back to the default action.
    unsafe { libc::signal(libc::SIGALRM, libc::SIG_DFL) };
}

/// [`close_from_a_handler_during_a_blocking_call`] where the client's handshake gave up first
/// (a CLC timeout of 1 ms; the server accepts only after the call): the blocking `recv` or
/// `read` waits to skip the server's late CLC message when its `SA_RESTART` handler closes the
/// number or makes it name /dev/null. TCP restarts the call by looking the number up again:
/// `EBADF`, `ENOTSOCK` (`recv` on /dev/null), 0 (`read` of it); the server reads EOF. Before,
/// the wait slept in a `recv` on the library's private duplicate of the socket, which the
/// kernel restarted there, for ever (the server accepts only after the call).
fn handler_closes_recv_after_clc_timeout() {
    with_clc_timeout_1ms();
    let null = close_on_alarm_installed();
    for (how, op) in [(0, "recv"), (0, "read"), (null, "recv"), (null, "read")] {
        let (l, c, _) = handshake_window_client();
        CLOSE_FD.store(c, Ordering::SeqCst);
        CLOSE_HOW.store(how, Ordering::SeqCst);
        let what = if how == 0 { "close" } else { "dup2 /dev/null" };
        let timer = alarm_this_thread_in_50ms();
        let mut b = [0u8; 100];
        if op == "recv" {
            // SAFETY: valid buffer.
            r(&format!("recv(c) while the handler does {what}"), unsafe {
                libc::recv(c, b.as_mut_ptr().cast(), b.len(), 0)
            });
        } else {
            // SAFETY: valid buffer.
            r(&format!("read(c) while the handler does {what}"), unsafe {
                libc::read(c, b.as_mut_ptr().cast(), b.len())
            });
        }
        timer.join().unwrap();
        let s = accept_fd(l);
        log(format!("accept ok = {}", s >= 0));
        rd("read(s)", s, 100);
        if how != 0 {
            close(c);
        }
        close(s);
        close(l);
    }
    close(null);
    // SAFETY: back to the default action.
    unsafe { libc::signal(libc::SIGALRM, libc::SIG_DFL) };
}

/// The connection a handler shuts ([`shutdown_from_a_handler_during_send`]).
static SHUT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn shut_on_alarm(_: c_int) {
    // SAFETY: `shutdown` is async-signal-safe; errno is the interrupted code's.
    unsafe {
        let e = *libc::__errno_location();
        libc::shutdown(SHUT_FD.load(Ordering::SeqCst), libc::SHUT_RDWR);
        *libc::__errno_location() = e;
    }
}

/// A send cut short by a timer whose handler calls `shutdown(SHUT_RDWR)` on that very
/// connection (an old-style timeout): over TCP the handler runs when the send's system call is
/// over and the send ends with `EPIPE`. Five rounds of 256 MiB, the signal after 2 ms, the
/// peer read by a thread. Before, the handler could run inside our send's copy into the ring,
/// under the ring's lock, and its `shutdown` waited for that lock for ever (red team rt13
/// `rt13_sigclose.c shutdown`: hung 3 of 3 runs).
fn shutdown_from_a_handler_during_send() {
    // SAFETY: a valid sigaction with an async-signal-safe handler.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = shut_on_alarm as *const () as usize;
        a.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut a.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGALRM, &a, std::ptr::null_mut()), 0);
    }
    let chunk = vec![7u8; 1 << 20];
    for round in 0..5 {
        let (c, s) = pair();
        SHUT_FD.store(c, Ordering::SeqCst);
        let reader = std::thread::spawn(move || {
            let mut b = vec![0u8; 1 << 16];
            // SAFETY: valid buffer.
            while unsafe { libc::read(s, b.as_mut_ptr().cast(), b.len()) } > 0 {}
            s
        });
        // The signal, aimed at this thread (a process-directed timer's may go to the
        // harness's watchdog thread).
        // SAFETY: plain call.
        let me = unsafe { libc::pthread_self() } as usize;
        let timer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            // SAFETY: the sending thread waits for this one before it ends.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGALRM) };
        });
        let mut sent = 0usize;
        let ended = loop {
            if sent >= 256 << 20 {
                break "all sent".to_string();
            }
            // SAFETY: valid buffer.
            let w =
                unsafe { libc::send(c, chunk.as_ptr().cast(), chunk.len(), libc::MSG_NOSIGNAL) };
            if w < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                break ename(e);
            }
            sent += w as usize;
        };
        timer.join().unwrap();
        log(format!("round {round}: send ended with {ended}"));
        let s = reader.join().unwrap();
        close(c);
        close(s);
    }
}

/// A blocking connect to a listener of this one-thread process, then a non-blocking write
/// before the program accepts (CPython's `test_ssl` `test_subclass`: the ClientHello of a
/// non-blocking TLS handshake, which must then say "want read"), and the same with
/// `send(MSG_DONTWAIT)` on a blocking socket. TCP takes the bytes (the connection is
/// established in the listener's queue), the read says `EAGAIN`, the server reads them once
/// it accepts. Before, both writes said `EAGAIN`: the client's handshake waited for the
/// Accept of a server that only this thread could make, after the call.
fn nonblocking_write_before_own_listener_accepts() {
    let (l, port) = listener();
    for dontwait in [false, true] {
        let c = tcp_socket();
        r("connect(own listener)", connect_to(c, port) as isize);
        let what = if dontwait {
            "send(c, MSG_DONTWAIT) before the accept"
        } else {
            set_nonblock(c, true);
            "write(c) non-blocking before the accept"
        };
        let k = if dontwait {
            // SAFETY: valid buffer.
            unsafe { libc::send(c, b"hello".as_ptr().cast(), 5, libc::MSG_DONTWAIT) }
        } else {
            wr(c, b"hello")
        };
        r(what, k);
        let mut b = [0u8; 16];
        // SAFETY: valid buffer.
        let k = unsafe { libc::recv(c, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        r("recv(c, MSG_DONTWAIT)", k);
        let s = accept_fd(l);
        log(format!("accept ok = {}", s >= 0));
        rd("read(s)", s, 16);
        r("write(s)", wr(s, b"back"));
        pl("poll(c,IN)", c, libc::POLLIN, 5000);
        rd("read(c)", c, 16);
        close(c);
        close(s);
    }
    close(l);
}

/// A client that fills the ring with non-blocking writes (`EAGAIN`) and closes before its
/// server read the Confirm (CPython's `test_socket` `testSendmsgDontWait` with small rings: the
/// accepted socket is still in its handshake when the client is done): a plain close, one
/// with `SO_LINGER {1, 0}`, one after an urgent byte. The close rang a doorbell for the
/// client's own `WAIT_SPACE` bit; through the `sk_msg` shortcut it reached the server's socket
/// ahead of the Confirm, which the server then read as a byte that is no CLC message: out of
/// sync, reset (`recv` said `ECONNRESET`; TCP reads the bytes). Small rings (16 KiB), so that
/// the writes fill one.
fn close_with_ring_full_before_server_confirms() {
    reexec_with("SMC_DMB_SIZE", "16384");
    let (l, port) = listener();
    for how in ["close", "close with SO_LINGER{1,0}", "MSG_OOB, then close"] {
        log(format!("-- {how}"));
        let c = tcp_socket();
        r("connect(own listener)", connect_to(c, port) as isize);
        // The server sends its Accept; the client's Confirm comes only at its next call.
        let s = accept_fd(l);
        log(format!("accept ok = {}", s >= 0));
        let chunk = [b'a'; 512];
        let ended = loop {
            // SAFETY: valid buffer.
            let k =
                unsafe { libc::send(c, chunk.as_ptr().cast(), chunk.len(), libc::MSG_DONTWAIT) };
            if k < 0 {
                break ename(errno());
            }
        };
        log(format!("send(c, MSG_DONTWAIT) until it fails: {ended}"));
        match how {
            "close with SO_LINGER{1,0}" => linger0(c),
            "MSG_OOB, then close" => {
                // SAFETY: valid buffer.
                let k = unsafe {
                    libc::send(
                        c,
                        b"!".as_ptr().cast(),
                        1,
                        libc::MSG_OOB | libc::MSG_DONTWAIT,
                    )
                };
                r("send(c, MSG_OOB|MSG_DONTWAIT)", k);
            }
            _ => {}
        }
        close(c);
        set_nonblock(s, true);
        pl("poll(s,IN)", s, libc::POLLIN, 5000);
        rd("read(s)", s, 512);
        close(s);
    }
    close(l);
}

// Java's close of a socket another thread reads (`NioSocketImpl`, `NativeThread.signal`): a
// `dup2` over the number of a socketpair end whose peer is closed, then a signal without
// `SA_RESTART` to the reader. TCP: the read ends with `EINTR` (the kernel's wakeup for the
// signal), the next read of the number reads the socketpair's EOF, and the peer sees the close
// when the interrupted call let go of the socket. Before: the library's poll woke for the
// signal, found the number's new file ready (1, not `EINTR`) and slept on for ever.

fn dup2_dead_socketpair_over_recv_then_signal() {
    close_over_recv_then_signal_as(true);
}

fn close_over_recv_then_signal() {
    close_over_recv_then_signal_as(false);
}

fn close_over_recv_then_signal_as(dup: bool) {
    handle(libc::SIGUSR2, false);
    let (c, s) = pair_settled();
    static T: AtomicI32 = AtomicI32::new(0);
    static PT: std::sync::OnceLock<libc::pthread_t> = std::sync::OnceLock::new();
    let h = std::thread::spawn(move || {
        // SAFETY: plain call.
        let _ = PT.set(unsafe { libc::pthread_self() });
        T.store(gettid(), Ordering::Release);
        recv_l("recv(s) blocking", s, 10, 0);
        recv_l("recv(s) again", s, 10, 0);
    });
    wait_blocked(&T);
    let mut sp = [-1; 2];
    if dup {
        // SAFETY: plain calls on our own descriptors.
        unsafe {
            assert_eq!(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sp.as_mut_ptr()),
                0
            );
            libc::close(sp[1]);
            let d = libc::dup2(sp[0], s);
            log(format!(
                "dup2(dead socketpair end, s) lands on s: {}",
                d == s
            ));
        }
    } else {
        r("close(s) while recv blocks", close(s) as isize);
    }
    // SAFETY: the thread is alive until joined.
    unsafe { libc::pthread_kill(*PT.get().unwrap(), libc::SIGUSR2) };
    h.join().unwrap();
    log(format!("handled USR2 x{}", SIGUSR2S.load(Ordering::SeqCst)));
    pl("poll(c,IN) after the call returned", c, libc::POLLIN, 5000);
    rd("read(c)", c, 10);
    if dup {
        close(s);
        close(sp[0]);
    }
    close(c);
}

/// Three threads blocked in `recv` of one connection (the first sleeps in the library's poll,
/// the others on its futex), the last two signalled (no `SA_RESTART`): each ends with `EINTR`
/// as over TCP, the first gets the data written next. Before: a signalled thread asleep on the
/// futex slept on.
fn signal_two_of_three_blocked_readers() {
    handle(libc::SIGUSR2, false);
    let (c, s) = pair_settled();
    static T: [AtomicI32; 3] = [AtomicI32::new(0), AtomicI32::new(0), AtomicI32::new(0)];
    static PT: [std::sync::OnceLock<libc::pthread_t>; 3] = [
        std::sync::OnceLock::new(),
        std::sync::OnceLock::new(),
        std::sync::OnceLock::new(),
    ];
    let hs: Vec<_> = (0..3)
        .map(|i| {
            let h = std::thread::spawn(move || {
                // SAFETY: plain call.
                let _ = PT[i].set(unsafe { libc::pthread_self() });
                T[i].store(gettid(), Ordering::Release);
                let mut b = [0u8; 10];
                // SAFETY: valid buffer.
                let k = unsafe { libc::recv(s, b.as_mut_ptr().cast(), b.len(), 0) };
                if k < 0 {
                    ename(errno())
                } else {
                    digest(&b[..k as usize])
                }
            });
            wait_blocked(&T[i]);
            h
        })
        .collect();
    // The last two to block first: they sleep on the futex (the first one polls).
    let mut hs: Vec<_> = hs.into_iter().map(Some).collect();
    for i in [2, 1] {
        // SAFETY: the thread is alive until joined.
        unsafe { libc::pthread_kill(*PT[i].get().unwrap(), libc::SIGUSR2) };
        let h = hs[i].take().unwrap();
        log(format!("signalled reader {i}: {}", h.join().unwrap()));
    }
    write_all(c, b"data");
    let first = hs[0].take().unwrap();
    log(format!("first reader: {}", first.join().unwrap()));
    log(format!("handled USR2 x{}", SIGUSR2S.load(Ordering::SeqCst)));
    close(c);
    close(s);
}

// ── red-team round 29 ───────────────────────────────────────────────────────────────────────

/// A `writev` of nothing (two empty vectors, or none) after our own `SHUT_WR`: 0, no `EPIPE`,
/// no `SIGPIPE` (`vfs_writev` returns before the socket); `write` and `sendmsg` of nothing do
/// reach it.
fn writev_nothing_after_shutdown() {
    let (c, s) = pair();
    // SAFETY: plain shutdown of our socket.
    r(
        "shutdown(c,WR)",
        unsafe { libc::shutdown(c, libc::SHUT_WR) } as isize,
    );
    let z = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    // SAFETY: two empty iovecs.
    r("writev(c, 2 empty)", unsafe {
        libc::writev(c, z.as_ptr(), 2)
    });
    // SAFETY: no iovec.
    r("writev(c, 0)", unsafe { libc::writev(c, z.as_ptr(), 0) });
    r("write(c,0)", wr(c, b""));
    rd("read(s) EOF", s, 10);
    close(c);
    close(s);
}

fn epoll_ctl_r(what: &str, ep: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) {
    // SAFETY: `ev` is null, a small bad pointer or a live epoll_event (the kernel judges).
    r(what, unsafe { libc::epoll_ctl(ep, op, fd, ev) } as isize);
}

/// `epoll_ctl` without an event (ADD, MOD: `EFAULT`), `EPOLLEXCLUSIVE` with bits it does not
/// take (`EINVAL`), `epoll_wait` into no array while an event is ready (`EFAULT`).
fn epoll_argument_checks() {
    let (c, s) = pair();
    // SAFETY: plain epoll calls on our descriptors.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let null = std::ptr::null_mut();
    epoll_ctl_r("ADD(c, NULL)", ep, libc::EPOLL_CTL_ADD, c, null);
    for (name, extra) in [
        ("ONESHOT", libc::EPOLLONESHOT),
        ("RDHUP", libc::EPOLLRDHUP),
        ("PRI", libc::EPOLLPRI),
    ] {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLEXCLUSIVE | extra) as u32,
            u64: 7,
        };
        epoll_ctl_r(
            &format!("ADD(c, EXCLUSIVE|{name})"),
            ep,
            libc::EPOLL_CTL_ADD,
            c,
            &mut ev,
        );
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 7,
    };
    epoll_ctl_r("ADD(c, IN)", ep, libc::EPOLL_CTL_ADD, c, &mut ev);
    epoll_ctl_r("MOD(c, NULL)", ep, libc::EPOLL_CTL_MOD, c, null);
    write_all(s, b"x");
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: 4 entries.
    let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, 5000) };
    log(format!(
        "epoll_wait = {n} data {} {}",
        { evs[0].u64 },
        mask_names(evs[0].events)
    ));
    // SAFETY: a null array: the kernel's EFAULT (an event is ready).
    r(
        "epoll_wait(NULL)",
        unsafe { libc::epoll_wait(ep, null, 4, 0) } as isize,
    );
    close(ep);
    close(c);
    close(s);
}

/// Timeouts the kernel refuses (`EINVAL`), more `poll` entries than `RLIMIT_NOFILE`
/// (`EINVAL`), and what `select` leaves of a timeout when it returns at once: never more than
/// it was given.
fn select_and_poll_argument_checks() {
    let (c, s) = pair();
    write_all(c, b"x");
    pl("poll(s,IN)", s, libc::POLLIN, 5000);
    let sel = |what: &str, sec: i64, usec: i64| {
        // SAFETY: a zeroed fd_set is empty.
        let mut rs: libc::fd_set = unsafe { std::mem::zeroed() };
        // SAFETY: `s` < FD_SETSIZE.
        unsafe { libc::FD_SET(s, &mut rs) };
        let mut tv = libc::timeval {
            tv_sec: sec,
            tv_usec: usec,
        };
        // SAFETY: live set and timeval.
        let n = unsafe {
            libc::select(
                s + 1,
                &mut rs,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        r(what, n as isize);
        tv
    };
    sel("select(tv -1,0)", -1, 0);
    sel("select(tv 0,-5)", 0, -5);
    let tv = sel("select(tv 0,500)", 0, 500);
    log(format!(
        "left of 500 us: at most 500: {}",
        tv.tv_sec == 0 && (0..=500).contains(&tv.tv_usec)
    ));
    let ts_call = |what: &str, sec: i64, nsec: i64| {
        let ts = libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        };
        let mut pf = libc::pollfd {
            fd: s,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd and timespec.
        r(
            &format!("ppoll({what})"),
            unsafe { libc::ppoll(&mut pf, 1, &ts, std::ptr::null()) } as isize,
        );
        // SAFETY: a zeroed fd_set is empty.
        let mut rs: libc::fd_set = unsafe { std::mem::zeroed() };
        // SAFETY: `s` < FD_SETSIZE.
        unsafe { libc::FD_SET(s, &mut rs) };
        // SAFETY: live set and timespec.
        r(&format!("pselect({what})"), unsafe {
            libc::pselect(
                s + 1,
                &mut rs,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &ts,
                std::ptr::null(),
            )
        } as isize);
    };
    ts_call("ts -1,0", -1, 0);
    ts_call("ts 0,2e9", 0, 2_000_000_000);
    ts_call("ts 0,-1", 0, -1);
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    let n = (rl.rlim_cur as usize + 1).min(1 << 20);
    let mut many = vec![
        libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0
        };
        n
    ];
    many[0] = libc::pollfd {
        fd: s,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `n` live pollfds.
    r("poll(RLIMIT_NOFILE + 1 entries)", unsafe {
        libc::poll(many.as_mut_ptr(), n as libc::nfds_t, 0)
    } as isize);
    close(c);
    close(s);
}

/// `select` with sets larger than `FD_SETSIZE` (libevent's way past 1024 descriptors): our
/// socket at 1500 is seen ready and reported, a closed number in the set is `EBADF`.
fn select_above_fd_setsize() {
    let (c, s) = pair();
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill and set.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        rl.rlim_cur = rl.rlim_cur.max(2048).min(rl.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
    }
    // SAFETY: plain dup2 onto a free number.
    let hi = unsafe { libc::dup2(s, 1500) };
    r("dup2(s, 1500)", hi as isize);
    write_all(c, b"x");
    pl("poll(1500,IN)", hi, libc::POLLIN, 5000);
    const W: usize = 64;
    let sel = |what: &str, bits: &[usize], nfds: c_int| {
        let mut set = vec![0u64; 2048 / W];
        for &b in bits {
            set[b / W] |= 1 << (b % W);
        }
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 300_000,
        };
        // SAFETY: a set of 2048 bits, more than `nfds`.
        let n = unsafe {
            libc::select(
                nfds,
                set.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        r(what, n as isize);
        let on: Vec<usize> = (0..2048)
            .filter(|&b| set[b / W] >> (b % W) & 1 != 0)
            .collect();
        log(format!("{what}: set after {on:?}"));
    };
    sel("select(1500)", &[1500], 1501);
    sel("select(1500, 1300 closed)", &[1300, 1500], 1501);
    close(hi);
    close(c);
    close(s);
}

/// Pointers in the first page (a program's NULL-plus-offset bug): the kernel's `EFAULT`, not a
/// fault inside the library.
fn low_pointers_are_efault() {
    let (c, s) = pair();
    write_all(s, b"xyz");
    pl("poll(c,IN)", c, libc::POLLIN, 5000);
    let bad = 24usize;
    // SAFETY: every call below gets a pointer the kernel refuses; nothing is dereferenced by a
    // correct implementation.
    unsafe {
        r("recvmsg(c, bad msghdr)", libc::recvmsg(c, bad as *mut _, 0));
        r(
            "sendmsg(c, bad msghdr)",
            libc::sendmsg(c, bad as *const _, 0),
        );
        r("readv(c, bad iov)", libc::readv(c, bad as *const _, 1));
        r("writev(c, bad iov)", libc::writev(c, bad as *const _, 1));
        r(
            "ioctl(c, FIONREAD, bad)",
            libc::ioctl(c, libc::FIONREAD, bad) as isize,
        );
        r(
            "poll(bad, 1)",
            libc::poll(bad as *mut libc::pollfd, 1, 0) as isize,
        );
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c, &mut ev);
        r(
            "epoll_wait(bad)",
            libc::epoll_wait(ep, bad as *mut _, 4, 0) as isize,
        );
        r(
            "epoll_ctl(MOD, bad)",
            libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, c, bad as *mut _) as isize,
        );
        close(ep);
    }
    rd("read(c)", c, 10);
    close(c);
    close(s);
}
