//! Untrusted request records of the loopback-ism daemon (`smc_ism::proto::decode_request`):
//! any bytes from any local uid. Never panics; what it accepts is a well-formed record of a
//! known op, and only the socket-taking ops take the caller's fd.
#![no_main]
use smc_ism::proto::{self, Header, Request};

libfuzzer_sys::fuzz_target!(|input: (bool, Vec<u8>)| {
    let (truncated, rec) = input;
    let d = proto::decode_request(&rec, truncated);
    if d.noreply {
        assert_eq!(d.op & proto::NOREPLY_BIT, 0);
        assert!(matches!(
            d.op,
            proto::OP_DETACH | proto::OP_UNREGISTER | proto::OP_RELEASE | proto::OP_CANCEL
        ));
    }
    if let Ok(req) = d.request {
        assert!(!truncated && rec.len() <= proto::MAX_REQUEST);
        let h = Header::decode(&rec).expect("an accepted record has a header");
        assert_eq!(h.magic, proto::MAGIC);
        assert_eq!(h.version, proto::VERSION);
        assert_eq!(h.len as usize, rec.len() - proto::HEADER_LEN);
        assert_eq!(h.seq, d.seq);
        let op = match req {
            Request::QueryGid => proto::OP_QUERY_GID,
            Request::Register { size_code, .. } => {
                assert!(size_code <= smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE);
                proto::OP_REGISTER
            }
            Request::Attach { .. } => proto::OP_ATTACH,
            Request::AttachPeer { .. } => proto::OP_ATTACH_PEER,
            Request::Adopt { which, .. } => {
                assert!(matches!(
                    which,
                    proto::ADOPT_OWN | proto::ADOPT_PEER | proto::ADOPT_STATE
                ));
                proto::OP_ADOPT
            }
            Request::Pair {
                size_code,
                park_ms,
                n_releases,
                ..
            } => {
                assert!(size_code <= smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE);
                assert!(park_ms <= proto::PAIR_PARK_MAX_MS);
                assert!(n_releases as usize <= proto::PAIR_RELEASES_MAX);
                proto::OP_PAIR
            }
            Request::Cancel { .. } => proto::OP_CANCEL,
            Request::LeaveShortcut => proto::OP_LEAVE_SHORTCUT,
            Request::Sweep => proto::OP_SWEEP,
            Request::Detach { .. } => proto::OP_DETACH,
            Request::Unregister { .. } => proto::OP_UNREGISTER,
            Request::Release { .. } => proto::OP_RELEASE,
            Request::Stats => proto::OP_STATS,
            Request::Wait { timeout_ms, .. } => {
                assert!(timeout_ms <= 60_000);
                proto::OP_WAIT
            }
            Request::List { max, .. } => {
                assert!((1..=proto::LIST_PAGE_MAX).contains(&max));
                proto::OP_LIST
            }
        };
        assert_eq!(op, d.op);
        assert_eq!(
            req.takes_socket(),
            matches!(
                op,
                proto::OP_REGISTER
                    | proto::OP_ATTACH
                    | proto::OP_ATTACH_PEER
                    | proto::OP_ADOPT
                    | proto::OP_PAIR
                    | proto::OP_LEAVE_SHORTCUT
            )
        );
    }
});
