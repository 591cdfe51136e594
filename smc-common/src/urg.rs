//! TCP urgent data (`MSG_OOB`) over a CDC ring, as a program sees it on Linux TCP: the mark,
//! the reader's urgent state, and how reads, `SIOCATMARK`, `FIONREAD` and poll behave around
//! it. Sans-IO: the data path keeps the state in shared memory and calls these functions.
//!
//! # What TCP does (`net/ipv4/tcp.c`, `tcp_input.c`), and so what this does
//!
//! - `send(buf, n, MSG_OOB)`: the `n` bytes go into the stream; the last one is urgent.
//! - The reader keeps one mark (`tp->urg_seq`, the position of the urgent byte) and its state
//!   (`tp->urg_data`): none, valid (the byte not read out of band yet: `EPOLLPRI`) or read.
//!   A newer urgent byte moves the mark; when the older urgent byte is the next byte to read
//!   (and `SO_OOBINLINE` is off), it is dropped (`tcp_check_urg`). Otherwise it stays in the
//!   stream as an ordinary byte.
//! - A read that already copied bytes stops before the mark; a read that starts at the mark
//!   skips the urgent byte (unless `SO_OOBINLINE`); once the read position is past the mark the
//!   state is none (`tcp_recvmsg_locked`).
//! - `recv(MSG_OOB)`: the byte while valid (then read; `MSG_PEEK` leaves it valid), `EINVAL`
//!   otherwise or with `SO_OOBINLINE` (`tcp_recv_urg`).
//! - `SIOCATMARK`: a mark (valid or read) at the read position. `FIONREAD`: the bytes up to the
//!   mark while it is ahead (`tcp_inq`, without `SO_OOBINLINE`). `poll`: `EPOLLPRI` while valid;
//!   at the mark (without `SO_OOBINLINE`) the urgent byte does not count as readable
//!   (`tcp_poll`'s `target++`).
//!
//! # How the mark travels (this implementation's extension of the CDC header)
//!
//! The writer publishes each urgent byte in the otherwise reserved bytes 1..8 of the type
//! word of the reader's DMB ([`UrgWord`], see [`crate::cdc`]) *before* the producer cursor
//! that covers the byte: a reader that accepted a producer cursor and then loads the word
//! knows of every urgent byte under that cursor. The word holds the newest urgent byte only
//! (ring offset), a sequence number, and the ring offset of the urgent byte before it: a
//! reader that did not look between two urgent sends (in TCP it would have seen each
//! segment) still applies TCP's rule for the older byte ([`arrival`]).
//!
//! One exception: an urgent write that draws the reset of a reader that shut both ways writes
//! no bytes (TCP drops the segment) but names its urgent byte past the producer cursor; that
//! reader takes the mark from the word as TCP takes the segment's urgent pointer before it
//! resets (the data path's `urg_take`).
//!
//! Ring offsets fit 24 bits (rings are below 16 MiB); a reader resolves an offset to the
//! first position at or after its consumer cursor with that offset, unique because everything
//! unread lies within one ring length of it.

use core::sync::atomic::Ordering;

use crate::cdc::{CdcHeader, Cursor, Ring, CDC_MSG_TYPE};

/// [`UrgWord::prev`] when the writer sent no urgent byte before.
pub const URG_NO_PREV: u32 = 0xFF_FFFF;

/// The urgent word: bytes 1..8 of the type word of the DMB the writer writes into.
///
/// | byte | field                                                    |
/// |-----:|----------------------------------------------------------|
/// | 0    | the CDC type `0xFE` (unchanged)                          |
/// | 1    | `seq`: 0 none yet, then 1, 2, ... 255, 1, ... per urgent byte |
/// | 2..5 | `mark`: ring offset of the newest urgent byte, 24-bit LE |
/// | 5..8 | `prev`: ring offset of the urgent byte before it, 24-bit LE, or [`URG_NO_PREV`] |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UrgWord {
    /// Sequence number of the newest urgent byte (0: none was sent).
    pub seq: u8,
    /// Its ring offset.
    pub mark: u32,
    /// Ring offset of the urgent byte sent before it ([`URG_NO_PREV`]: none).
    pub prev: u32,
}

/// The urgent word's accessors of the CDC header (bytes 1..8 of its type word, see
/// [`crate::cdc`] *Layout*): beside the urgent word, so that the header module does not depend
/// on this one.
impl CdcHeader {
    /// The urgent word (bytes 1..8 of the type word), `Acquire`: load it after the producer
    /// cursor, and it names every urgent byte under that cursor.
    pub fn load_urg(&self) -> UrgWord {
        UrgWord::from_type_word(self.type_word.load(Ordering::Acquire))
    }

    /// Store the urgent word with the type byte `0xFE` (`Release`; the writer stores it before
    /// the producer cursor that covers its newest urgent byte).
    pub fn store_urg(&self, w: UrgWord) {
        self.type_word.store(w.to_type_word(), Ordering::Release)
    }
}

impl UrgWord {
    /// The type word carrying this urgent word (type byte [`CDC_MSG_TYPE`]).
    pub const fn to_type_word(self) -> u64 {
        let m = self.mark.to_le_bytes();
        let p = self.prev.to_le_bytes();
        u64::from_ne_bytes([CDC_MSG_TYPE, self.seq, m[0], m[1], m[2], p[0], p[1], p[2]])
    }

    /// The urgent word of a type word (whatever the type byte; every bit pattern parses).
    pub const fn from_type_word(w: u64) -> UrgWord {
        let b = w.to_ne_bytes();
        UrgWord {
            seq: b[1],
            mark: u32::from_le_bytes([b[2], b[3], b[4], 0]),
            prev: u32::from_le_bytes([b[5], b[6], b[7], 0]),
        }
    }

    /// The word for the next urgent byte at ring offset `mark`, after `self` (the writer's
    /// last one).
    pub const fn next(self, mark: u32) -> UrgWord {
        UrgWord {
            seq: next_seq(self.seq),
            mark: mark & 0xFF_FFFF,
            prev: if self.seq == 0 {
                URG_NO_PREV
            } else {
                self.mark
            },
        }
    }
}

/// The sequence number after `s` (1..=255, 0 is "none").
pub const fn next_seq(s: u8) -> u8 {
    if s == 255 {
        1
    } else {
        s + 1
    }
}

/// The sequence number before `s` (1..=255).
pub const fn prev_seq(s: u8) -> u8 {
    if s <= 1 {
        255
    } else {
        s - 1
    }
}

/// Urgent bytes sent after `seen` up to and including `seq` (both in 1..=255 or `seen` 0).
const fn seq_dist(seen: u8, seq: u8) -> u32 {
    if seen == 0 {
        seq as u32
    } else if seq >= seen {
        (seq - seen) as u32
    } else {
        (seq as u32 + 255) - seen as u32
    }
}

/// The reader's urgent state (TCP's `urg_data`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UrgState {
    /// No mark (none came, or the read position passed it).
    #[default]
    None,
    /// The urgent byte was not read out of band yet.
    Valid,
    /// It was read out of band; the mark stays until the read position passes it.
    Read,
}

/// The reader's urgent record, one `u64` ([`UrgRx::to_u64`]) in the connection's local state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UrgRx {
    /// Position of the urgent byte (TCP's `urg_seq`); `count` below 2^24.
    pub pos: Cursor,
    /// The urgent byte.
    pub byte: u8,
    /// Its state.
    pub state: UrgState,
    /// Sequence number of the last urgent word taken ([`UrgWord::seq`]).
    pub seen: u8,
}

impl UrgRx {
    /// Packed: count (24 bits), wrap (16), byte (8), state (8), seen (8).
    pub const fn to_u64(self) -> u64 {
        let st = match self.state {
            UrgState::None => 0u64,
            UrgState::Valid => 1,
            UrgState::Read => 2,
        };
        (self.pos.count as u64 & 0xFF_FFFF)
            | (self.pos.wrap as u64) << 24
            | (self.byte as u64) << 40
            | st << 48
            | (self.seen as u64) << 56
    }

    /// Unpacked (an unknown state reads as none).
    pub const fn from_u64(v: u64) -> UrgRx {
        UrgRx {
            pos: Cursor {
                wrap: (v >> 24) as u16,
                count: (v & 0xFF_FFFF) as u32,
            },
            byte: (v >> 40) as u8,
            state: match (v >> 48) as u8 {
                1 => UrgState::Valid,
                2 => UrgState::Read,
                _ => UrgState::None,
            },
            seen: (v >> 56) as u8,
        }
    }

    /// Whether there is a mark (valid or read).
    pub const fn marked(self) -> bool {
        !matches!(self.state, UrgState::None)
    }

    /// `SIOCATMARK`: a mark at the read position `cons`.
    pub fn at_mark(self, cons: Cursor) -> bool {
        self.marked() && self.pos == cons
    }

    /// `EPOLLPRI`: urgent data not read yet.
    pub const fn pending(self) -> bool {
        matches!(self.state, UrgState::Valid)
    }

    /// The record once the read position moved to `cons`: no mark once it is past it.
    pub fn passed(self, ring: Ring, cons: Cursor) -> UrgRx {
        if self.marked() && matches!(ring.diff(self.pos, cons), Ok(d) if d > 0) {
            UrgRx {
                state: UrgState::None,
                ..self
            }
        } else {
            self
        }
    }
}

/// The first position at or after `cons` whose ring offset is `off` (`off < ring.len()`).
fn resolve(ring: Ring, cons: Cursor, off: u32) -> Cursor {
    let here = ring.offset(cons) as u32;
    let d = if off >= here {
        off - here
    } else {
        ring.len() - here + off
    };
    ring.add(cons, d)
}

/// What the urgent word means for the reader at `cons` with `avail` bytes readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Nothing new.
    Nothing,
    /// A newer urgent byte is announced but not yet under the producer cursor the reader holds
    /// (the writer stores the word first): look again with a newer producer cursor.
    NotYet,
    /// A new mark: drop `skip` bytes at the read position (older urgent bytes that TCP drops,
    /// `tcp_check_urg`), then the record is `rx` (its `byte` to be read from the ring at
    /// `rx.pos` by the caller).
    New {
        /// Bytes the read position moves on first.
        skip: u32,
        /// The new record.
        rx: UrgRx,
    },
    /// The word is not one an honest writer writes (an offset outside the ring, or behind the
    /// read position): ignore it (take its sequence number, keep the mark).
    Invalid,
}

/// Takes the writer's urgent word `w` (loaded after the producer cursor that gave `avail`).
/// `inline`: `SO_OOBINLINE` is on (no urgent byte is dropped).
pub fn arrival(
    ring: Ring,
    rx: UrgRx,
    cons: Cursor,
    avail: u32,
    w: UrgWord,
    inline: bool,
) -> Arrival {
    if w.seq == 0 || w.seq == rx.seen {
        return Arrival::Nothing;
    }
    if w.mark >= ring.len() {
        return Arrival::Invalid;
    }
    let avail = avail.min(ring.len());
    let pk = resolve(ring, cons, w.mark);
    let dk = match ring.diff(cons, pk) {
        Ok(d) => d,
        Err(_) => return Arrival::Invalid,
    };
    if dk >= avail {
        return Arrival::NotYet;
    }
    // Urgent bytes the reader never saw between its last one and this one.
    let missed = seq_dist(rx.seen, w.seq).saturating_sub(1);
    let mut skip = 0u32;
    if !inline {
        // tcp_check_urg: the current urgent byte is the next to read and a newer one comes:
        // it is dropped. The same for each urgent byte the reader missed, in turn, as long as
        // each is then the next to read: the missed ones form a run of adjacent bytes from the
        // read position (known when they end right before the newest one's predecessor).
        if rx.at_mark(cons) && avail > 0 {
            skip = 1;
        }
        if missed >= 1 && w.prev < ring.len() {
            let pp = resolve(ring, cons, w.prev);
            if let Ok(dp) = ring.diff(cons, pp) {
                if dp < dk && dp >= skip && dp - skip + 1 == missed {
                    skip = dp + 1;
                }
            }
        }
    }
    Arrival::New {
        skip,
        rx: UrgRx {
            pos: pk,
            byte: 0,
            state: UrgState::Valid,
            seen: w.seq,
        },
    }
}

/// The urgent word of the byte before `w`'s newest one, for a reader whose producer cursor
/// covers that one but not the newest ([`Arrival::NotYet`] after looking again): its mark is
/// `w.prev`, the one before it unknown.
pub fn previous(w: UrgWord) -> Option<UrgWord> {
    if w.seq == 0 || w.prev == URG_NO_PREV {
        return None;
    }
    Some(UrgWord {
        seq: prev_seq(w.seq),
        mark: w.prev,
        prev: URG_NO_PREV,
    })
}

/// How a read at `cons` with `avail` bytes readable goes around the mark: skip `.0` bytes (the
/// urgent byte at the read position, out of band), then at most `.1` bytes (up to the mark).
pub fn read_plan(ring: Ring, rx: UrgRx, cons: Cursor, avail: u32, inline: bool) -> (u32, u32) {
    if !rx.marked() {
        return (0, avail);
    }
    match ring.diff(cons, rx.pos) {
        Ok(0) if !inline && avail > 0 => (1, avail - 1),
        Ok(d) if d > 0 && d < avail => (0, d),
        _ => (0, avail),
    }
}

/// Bytes readable for poll and blocking reads (`tcp_poll`): at the mark, the urgent byte does
/// not count unless inline.
pub fn readable(rx: UrgRx, cons: Cursor, avail: u32, inline: bool) -> u32 {
    if !inline && rx.at_mark(cons) {
        avail.saturating_sub(1)
    } else {
        avail
    }
}

/// `FIONREAD` (`tcp_inq`): the bytes up to a mark ahead of the read position, unless inline.
pub fn inq(ring: Ring, rx: UrgRx, cons: Cursor, avail: u32, inline: bool) -> u32 {
    if inline || !rx.marked() {
        return avail;
    }
    match ring.diff(cons, rx.pos) {
        Ok(d) if d < avail => d,
        _ => avail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc::CdcHeader;

    fn ring() -> Ring {
        Ring::new(100).unwrap()
    }

    fn c(n: u32) -> Cursor {
        ring().add(Cursor::ZERO, n)
    }

    fn valid(pos: u32, seen: u8) -> UrgRx {
        UrgRx {
            pos: c(pos),
            byte: b'x',
            state: UrgState::Valid,
            seen,
        }
    }

    #[test]
    fn word_roundtrip_and_layout() {
        let w = UrgWord {
            seq: 7,
            mark: 0x12_3456,
            prev: URG_NO_PREV,
        };
        let t = w.to_type_word();
        assert_eq!(
            t.to_ne_bytes(),
            [0xFE, 7, 0x56, 0x34, 0x12, 0xFF, 0xFF, 0xFF]
        );
        assert_eq!(UrgWord::from_type_word(t), w);
        // The plain type word the connection starts with: no urgent byte.
        assert_eq!(
            UrgWord::from_type_word(u64::from_ne_bytes([0xFE, 0, 0, 0, 0, 0, 0, 0])).seq,
            0
        );
        let a = UrgWord::default().next(5);
        assert_eq!((a.seq, a.mark, a.prev), (1, 5, URG_NO_PREV));
        let b = a.next(9);
        assert_eq!((b.seq, b.mark, b.prev), (2, 9, 5));
        let z = UrgWord { seq: 255, ..b }.next(1);
        assert_eq!(z.seq, 1);
        assert_eq!(prev_seq(1), 255);
        assert_eq!(seq_dist(255, 2), 2);
        assert_eq!(seq_dist(0, 3), 3);
    }

    #[test]
    fn rx_roundtrip() {
        let r = UrgRx {
            pos: Cursor::new(0xBEEF, 0xAB_CDEF),
            byte: 0x42,
            state: UrgState::Read,
            seen: 200,
        };
        assert_eq!(UrgRx::from_u64(r.to_u64()), r);
        assert_eq!(UrgRx::from_u64(0), UrgRx::default());
        assert_eq!(UrgRx::from_u64(3 << 48).state, UrgState::None);
    }

    #[test]
    fn arrival_simple_and_not_yet() {
        let r = ring();
        let w = UrgWord::default().next(4);
        // "abcdX": X at 4, 5 bytes readable.
        match arrival(r, UrgRx::default(), c(0), 5, w, false) {
            Arrival::New { skip: 0, rx } => {
                assert_eq!(rx.pos, c(4));
                assert!(rx.pending());
            }
            a => panic!("{a:?}"),
        }
        // The producer cursor does not cover it yet.
        assert_eq!(
            arrival(r, UrgRx::default(), c(0), 4, w, false),
            Arrival::NotYet
        );
        // Already taken.
        assert_eq!(arrival(r, valid(4, 1), c(0), 5, w, false), Arrival::Nothing);
        // Across the end of the ring.
        let w = UrgWord::default().next(2);
        match arrival(r, UrgRx::default(), c(195), 10, w, false) {
            Arrival::New { rx, .. } => assert_eq!(rx.pos, c(202)),
            a => panic!("{a:?}"),
        }
    }

    #[test]
    fn arrival_rejects_forged_words() {
        let r = ring();
        let w = UrgWord {
            seq: 1,
            mark: 100,
            prev: URG_NO_PREV,
        };
        assert_eq!(
            arrival(r, UrgRx::default(), c(0), 50, w, false),
            Arrival::Invalid
        );
        // A forged prev outside the ring is ignored (no drop).
        let w = UrgWord {
            seq: 3,
            mark: 1,
            prev: 0xFF_FFF0,
        };
        assert!(matches!(
            arrival(r, UrgRx::default(), c(0), 5, w, false),
            Arrival::New { skip: 0, .. }
        ));
        // Huge avail is clamped to the ring.
        assert!(matches!(
            arrival(
                r,
                UrgRx::default(),
                c(0),
                u32::MAX,
                UrgWord::default().next(99),
                false
            ),
            Arrival::New { skip: 0, .. }
        ));
    }

    #[test]
    fn newer_urgent_drops_the_one_at_the_read_position() {
        let r = ring();
        // x at 0 seen (valid), y at 1 arrives: x is dropped.
        let w = UrgWord::default().next(0).next(1);
        assert!(matches!(
            arrival(r, valid(0, 1), c(0), 2, w, false),
            Arrival::New { skip: 1, .. }
        ));
        // Inline: kept.
        assert!(matches!(
            arrival(r, valid(0, 1), c(0), 2, w, true),
            Arrival::New { skip: 0, .. }
        ));
        // "ab" then "cd" (marks 1 and 3), read position 0: b stays in band.
        let w = UrgWord::default().next(1).next(3);
        assert!(matches!(
            arrival(r, valid(1, 1), c(0), 4, w, false),
            Arrival::New { skip: 0, .. }
        ));
        // Missed both: the same.
        assert!(matches!(
            arrival(r, UrgRx::default(), c(0), 4, w, false),
            Arrival::New { skip: 0, .. }
        ));
        // Missed x (at the read position) and y: x dropped.
        let w = UrgWord::default().next(0).next(1);
        assert!(matches!(
            arrival(r, UrgRx::default(), c(0), 3, w, false),
            Arrival::New { skip: 1, .. }
        ));
        // Missed a, b, c at 0, 1, 2 (d at 3 newest): a, b, c dropped.
        let w = UrgWord::default().next(0).next(1).next(2).next(3);
        match arrival(r, UrgRx::default(), c(0), 4, w, false) {
            Arrival::New { skip: 3, rx } => assert_eq!(rx.pos, c(3)),
            a => panic!("{a:?}"),
        }
        // e at 0 in band, f at 1, h at 3, i at 4: nothing dropped.
        let w = UrgWord::default().next(1).next(3).next(4);
        assert!(matches!(
            arrival(r, UrgRx::default(), c(0), 5, w, false),
            Arrival::New { skip: 0, .. }
        ));
        // The read mark (read out of band) at the read position, then two adjacent ones.
        let mut seen = valid(0, 1);
        seen.state = UrgState::Read;
        let w = UrgWord::default().next(0).next(1).next(2);
        assert!(matches!(
            arrival(r, seen, c(0), 3, w, false),
            Arrival::New { skip: 2, .. }
        ));
        // A mark already passed is not at the read position.
        let w = UrgWord::default().next(0).next(5);
        assert!(matches!(
            arrival(r, UrgRx::default().passed(r, c(1)), c(1), 5, w, false),
            Arrival::New { skip: 0, .. }
        ));
    }

    #[test]
    fn previous_word() {
        let w = UrgWord::default().next(3).next(8);
        assert_eq!(
            previous(w),
            Some(UrgWord {
                seq: 1,
                mark: 3,
                prev: URG_NO_PREV
            })
        );
        assert_eq!(previous(UrgWord::default().next(3)), None);
        assert_eq!(previous(UrgWord::default()), None);
    }

    #[test]
    fn reads_around_the_mark() {
        let r = ring();
        let m = valid(4, 1);
        assert_eq!(read_plan(r, UrgRx::default(), c(0), 7, false), (0, 7));
        assert_eq!(read_plan(r, m, c(0), 7, false), (0, 4));
        assert_eq!(read_plan(r, m, c(4), 3, false), (1, 2));
        assert_eq!(read_plan(r, m, c(4), 3, true), (0, 3));
        assert_eq!(read_plan(r, m, c(4), 0, false), (0, 0));
        // Past the mark (not yet cleared) or beyond what is readable.
        assert_eq!(read_plan(r, m, c(5), 3, false), (0, 3));
        assert_eq!(read_plan(r, m, c(0), 4, false), (0, 4));
        assert_eq!(readable(m, c(4), 3, false), 2);
        assert_eq!(readable(m, c(4), 3, true), 3);
        assert_eq!(readable(m, c(0), 7, false), 7);
        assert_eq!(inq(r, m, c(0), 7, false), 4);
        assert_eq!(inq(r, m, c(4), 3, false), 0);
        assert_eq!(inq(r, m, c(0), 7, true), 7);
        assert!(m.at_mark(c(4)));
        assert!(!m.at_mark(c(3)));
        assert_eq!(m.passed(r, c(4)), m);
        assert_eq!(m.passed(r, c(5)).state, UrgState::None);
        assert!(!m.passed(r, c(5)).at_mark(c(5)));
    }

    #[test]
    fn urgent_word_in_the_type_word() {
        let h = CdcHeader::zeroed();
        h.init();
        assert_eq!(h.load_urg().seq, 0);
        let w = UrgWord::default().next(1234).next(99);
        h.store_urg(w);
        assert_eq!(h.msg_type(), CDC_MSG_TYPE);
        assert_eq!(h.load_urg(), w);
        assert!(h.snapshot().is_ok());
    }
}
