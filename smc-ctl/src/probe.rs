//! What the kernel must offer, probed before anything is loaded (`smc-ctl attach`, `smc-ctl
//! probe`): the eBPF program and map types, the helpers each program calls, cgroup bpf_links.
//! Each probe loads a two-instruction program or creates a one-entry map, as `bpftool feature
//! probe` does: a helper is missing when the verifier says the program type cannot call it
//! (its other complaints, about the probe's uninitialised arguments, mean it is there). The
//! verifier's text is never shown: a missing feature is named with what needs it and the Linux
//! version that brought it.
use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::{bail, Result};
use serde::Serialize;

use crate::sys::bpf_syscall::{bpf, put_u32, put_u64, Attr};

/// The oldest kernel with every feature below (bpf_get_netns_cookie in sock_ops programs).
pub const MIN_KERNEL: &str = "5.15";

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

const PROG_SOCK_OPS: u32 = 13;
const PROG_SK_MSG: u32 = 16;
const PROG_CGROUP_SOCKOPT: u32 = 25;
const ATTACH_SOCK_OPS: u32 = 3;
const ATTACH_SETSOCKOPT: u32 = 22;
const ATTACH_SK_MSG_VERDICT: u32 = 7;

const MAP_SOCKHASH: u32 = 18;
const MAP_RINGBUF: u32 = 27;
const MAP_CGROUP_STORAGE: u32 = 19;

#[derive(Clone, Copy)]
enum Check {
    /// A program type (with its expected attach type).
    Prog(u32, u32),
    /// A helper (by number) callable from a program type.
    Helper(u32, u32, u32),
    /// A map type: type, key size, value size, entries.
    Map(u32, u32, u32, u32),
    /// `BPF_LINK_CREATE` of a sock_ops program on a cgroup.
    CgroupLink,
}

struct Feature {
    name: &'static str,
    used_by: &'static str,
    /// The Linux release that brought it (`<=5.15`: by the minimum, release not pinned down).
    since: &'static str,
    check: Check,
}

const SOCK_OPS: &str = "the sock_ops program (every mode)";
const SOCKOPT: &str = "the setsockopt/getsockopt programs (the library's requests)";
const SK_MSG: &str = "the sk_msg program (shortcut mode, the ism handshake)";

const FEATURES: &[Feature] = &[
    Feature {
        name: "program type sock_ops",
        used_by: SOCK_OPS,
        since: "4.13",
        check: Check::Prog(PROG_SOCK_OPS, ATTACH_SOCK_OPS),
    },
    Feature {
        name: "program type cgroup_sockopt",
        used_by: SOCKOPT,
        since: "5.3",
        check: Check::Prog(PROG_CGROUP_SOCKOPT, ATTACH_SETSOCKOPT),
    },
    Feature {
        name: "program type sk_msg",
        used_by: SK_MSG,
        since: "4.17",
        check: Check::Prog(PROG_SK_MSG, ATTACH_SK_MSG_VERDICT),
    },
    Feature {
        name: "map type sockhash",
        used_by: SK_MSG,
        since: "4.18",
        check: Check::Map(MAP_SOCKHASH, 8, 4, 1),
    },
    Feature {
        name: "map type ringbuf",
        used_by: "the decision log of `smc-ctl trace` (aya-log)",
        since: "5.8",
        check: Check::Map(MAP_RINGBUF, 0, 0, 4096),
    },
    Feature {
        name: "map type cgroup_storage",
        used_by: "attach: the per-cgroup settings (--tcp-records)",
        since: "4.19",
        check: Check::Map(MAP_CGROUP_STORAGE, 16, 4, 0),
    },
    Feature {
        name: "sock_ops: bpf_get_local_storage",
        used_by: "attach: the per-cgroup settings (--tcp-records)",
        since: "4.19",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 81),
    },
    Feature {
        name: "cgroup bpf_link (BPF_LINK_CREATE)",
        used_by: "attach: links pinned per cgroup",
        since: "5.7",
        check: Check::CgroupLink,
    },
    Feature {
        name: "sock_ops: bpf_setsockopt",
        used_by: SOCK_OPS,
        since: "4.13",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 49),
    },
    Feature {
        name: "sock_ops: bpf_sock_ops_cb_flags_set",
        used_by: SOCK_OPS,
        since: "4.16",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 59),
    },
    Feature {
        name: "sock_ops: bpf_sock_hash_update",
        used_by: SOCK_OPS,
        since: "4.18",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 70),
    },
    Feature {
        name: "sock_ops: bpf_get_socket_cookie",
        used_by: SOCK_OPS,
        since: "<=5.15",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 46),
    },
    Feature {
        name: "sock_ops: bpf_sk_storage_get",
        used_by: SOCK_OPS,
        since: "<=5.15",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 107),
    },
    Feature {
        name: "sock_ops: bpf_get_netns_cookie",
        used_by: SOCK_OPS,
        since: "5.15",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 122),
    },
    Feature {
        name: "sock_ops: TCP header options (bpf_load_hdr_opt)",
        used_by: "the SMC option on SYN and SYN-ACK (sock_ops)",
        since: "5.10",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 142),
    },
    Feature {
        name: "sock_ops: TCP header options (bpf_store_hdr_opt)",
        used_by: "the SMC option on SYN and SYN-ACK (sock_ops)",
        since: "5.10",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 143),
    },
    Feature {
        name: "sock_ops: TCP header options (bpf_reserve_hdr_opt)",
        used_by: "the SMC option on SYN and SYN-ACK (sock_ops)",
        since: "5.10",
        check: Check::Helper(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 144),
    },
    Feature {
        name: "cgroup_sockopt: bpf_sk_storage_get",
        used_by: SOCKOPT,
        since: "<=5.15",
        check: Check::Helper(PROG_CGROUP_SOCKOPT, ATTACH_SETSOCKOPT, 107),
    },
    Feature {
        name: "cgroup_sockopt: bpf_get_netns_cookie",
        used_by: SOCKOPT,
        since: "<=5.15",
        check: Check::Helper(PROG_CGROUP_SOCKOPT, ATTACH_SETSOCKOPT, 122),
    },
    Feature {
        name: "sk_msg: bpf_msg_redirect_hash",
        used_by: SK_MSG,
        since: "4.18",
        check: Check::Helper(PROG_SK_MSG, ATTACH_SK_MSG_VERDICT, 71),
    },
    Feature {
        name: "sk_msg: bpf_sk_storage_get",
        used_by: SK_MSG,
        since: "<=5.15",
        check: Check::Helper(PROG_SK_MSG, ATTACH_SK_MSG_VERDICT, 107),
    },
];

/// One probed feature.
#[derive(Debug, Serialize)]
pub struct Probed {
    pub feature: &'static str,
    pub used_by: &'static str,
    pub since: &'static str,
    pub available: bool,
}

/// Why a probe could not tell.
#[derive(Debug)]
enum ProbeError {
    /// The kernel refused to load anything (no CAP_BPF/CAP_SYS_ADMIN).
    NotPermitted,
    Other(std::io::Error),
}

// Instructions: call HELPER; r0 = 1; exit. (`call` with r1 = the context, the other argument
// registers uninitialised: the verifier looks the helper up first.)
fn insn(code: u8, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = code;
    b[4..].copy_from_slice(&imm.to_ne_bytes());
    b
}
const CALL: u8 = 0x85;
const MOV64_IMM: u8 = 0xb7;
const EXIT: u8 = 0x95;

/// Loads a probe program: `Ok(Some(fd))` loaded, `Ok(None)` rejected (with the verifier log).
fn load(
    prog_type: u32,
    attach: u32,
    helper: Option<u32>,
    log: &mut [u8],
) -> Result<Option<OwnedFd>, ProbeError> {
    let mut insns: Vec<u8> = Vec::new();
    if let Some(h) = helper {
        insns.extend(insn(CALL, h as i32));
    }
    insns.extend(insn(MOV64_IMM, 1));
    insns.extend(insn(EXIT, 0));
    let license = c"GPL";
    let mut a = Attr([0; 128]);
    put_u32(&mut a, 0, prog_type);
    put_u32(&mut a, 4, (insns.len() / 8) as u32);
    put_u64(&mut a, 8, insns.as_ptr() as u64);
    put_u64(&mut a, 16, license.as_ptr() as u64);
    put_u32(&mut a, 24, 1);
    put_u32(&mut a, 28, log.len() as u32);
    put_u64(&mut a, 32, log.as_mut_ptr() as u64);
    put_u32(&mut a, 68, attach);
    match bpf(BPF_PROG_LOAD, &mut a) {
        // SAFETY: the kernel returned a new fd that nothing else owns.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(ProbeError::NotPermitted),
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EACCES) =>
        {
            Ok(None)
        }
        Err(e) => Err(ProbeError::Other(e)),
    }
}

fn log_text(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).into_owned()
}

/// Whether `helper` may be called from `prog_type` programs.
fn helper_available(prog_type: u32, attach: u32, helper: u32) -> Result<bool, ProbeError> {
    let mut log = vec![0u8; 64 << 10];
    match load(prog_type, attach, Some(helper), &mut log)? {
        Some(_) => Ok(true),
        None => {
            let text = log_text(&log);
            Ok(!(text.contains("unknown func")
                || text.contains("invalid func")
                || text.contains("cannot use helper")
                || text.contains("program of this type cannot use")))
        }
    }
}

fn prog_available(prog_type: u32, attach: u32) -> Result<bool, ProbeError> {
    let mut log = vec![0u8; 4096];
    Ok(load(prog_type, attach, None, &mut log)?.is_some())
}

fn map_available(ty: u32, key: u32, value: u32, max: u32) -> Result<bool, ProbeError> {
    let mut a = Attr([0; 128]);
    put_u32(&mut a, 0, ty);
    put_u32(&mut a, 4, key);
    put_u32(&mut a, 8, value);
    put_u32(&mut a, 12, max);
    match bpf(BPF_MAP_CREATE, &mut a) {
        Ok(fd) => {
            // SAFETY: the kernel returned a new fd that nothing else owns (closed here).
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(ProbeError::NotPermitted),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(ProbeError::Other(e)),
    }
}

/// `BPF_LINK_CREATE` of a loaded sock_ops program on no cgroup at all (fd -1): a kernel with
/// cgroup links looks the target up and says EBADF; one without says EINVAL.
fn cgroup_link_available() -> Result<bool, ProbeError> {
    let mut log = vec![0u8; 4096];
    let Some(prog) = load(PROG_SOCK_OPS, ATTACH_SOCK_OPS, None, &mut log)? else {
        return Ok(false);
    };
    use std::os::fd::AsRawFd as _;
    let mut a = Attr([0; 128]);
    put_u32(&mut a, 0, prog.as_raw_fd() as u32);
    put_u32(&mut a, 4, u32::MAX);
    put_u32(&mut a, 8, ATTACH_SOCK_OPS);
    match bpf(BPF_LINK_CREATE, &mut a) {
        Ok(fd) => {
            // SAFETY: a new fd (not expected: the target is invalid), closed at once.
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(ProbeError::NotPermitted),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(ProbeError::Other(e)),
    }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Probes every feature. Fails only when the kernel lets nothing be probed.
pub fn probe() -> Result<Vec<Probed>> {
    let mut out = Vec::new();
    let mut missing_prog: Vec<u32> = Vec::new();
    for f in FEATURES {
        let r = match f.check {
            Check::Prog(t, a) => {
                let r = prog_available(t, a);
                if matches!(r, Ok(false)) {
                    missing_prog.push(t);
                }
                r
            }
            // A helper of a missing program type is missing too.
            Check::Helper(t, _, _) if missing_prog.contains(&t) => Ok(false),
            Check::Helper(t, a, h) => helper_available(t, a, h),
            Check::Map(t, k, v, m) => map_available(t, k, v, m),
            Check::CgroupLink => cgroup_link_available(),
        };
        let available = match r {
            Ok(v) => v,
            Err(ProbeError::NotPermitted) => bail!(
                "the kernel does not let smc-ctl load eBPF programs (EPERM): it needs CAP_BPF and \
                 CAP_NET_ADMIN, or CAP_SYS_ADMIN (run it as root, with those capabilities in its \
                 bounding set; in a container: privileged)"
            ),
            Err(ProbeError::Other(e)) => {
                bail!("probing {} of the kernel failed: {e}", f.name)
            }
        };
        out.push(Probed {
            feature: f.name,
            used_by: f.used_by,
            since: f.since,
            available,
        });
    }
    Ok(out)
}

/// The probe as `attach` runs it: a clear error naming what is missing.
pub fn require() -> Result<()> {
    let missing: Vec<Probed> = probe()?.into_iter().filter(|p| !p.available).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = missing
        .iter()
        .map(|p| format!("  - {} (Linux {}), for {}", p.feature, p.since, p.used_by))
        .collect();
    bail!(
        "this kernel ({}) lacks eBPF features smc-rs needs:\n{}\nsmc-rs needs Linux {MIN_KERNEL} or \
         later with CONFIG_BPF_SYSCALL, CONFIG_CGROUP_BPF, CONFIG_BPF_STREAM_PARSER (sockmap) and \
         CONFIG_INET (`smc-ctl probe` lists every feature)",
        kernel_release(),
        lines.join("\n")
    )
}

/// `smc-ctl probe`.
pub fn run(json: bool) -> Result<()> {
    crate::sys::require_root()?;
    let all = probe()?;
    let ok = all.iter().all(|p| p.available);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "kernel": kernel_release(),
                "min_kernel": MIN_KERNEL,
                "supported": ok,
                "features": all,
            }))?
        );
    } else {
        println!(
            "kernel {} (smc-rs needs {MIN_KERNEL} or later)",
            kernel_release()
        );
        for p in &all {
            println!(
                "  {:<52} {:<8} Linux {:<5} {}",
                p.feature,
                if p.available { "ok" } else { "MISSING" },
                p.since,
                p.used_by
            );
        }
    }
    if !ok {
        bail!("this kernel lacks eBPF features smc-rs needs (listed as MISSING)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The helper probe tells a helper a program type may call from one it may not, on the
    /// real kernel (root; skipped otherwise unless `SMC_TESTS_NEED_ROOT` is set).
    #[test]
    fn helper_probe_tells_present_from_absent() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("SMC_TESTS_NEED_ROOT").is_none(),
                "needs root (SMC_TESTS_NEED_ROOT is set)"
            );
            // Straight to stderr, past the test harness's capture (which keeps what
            // `eprintln!` prints of a passing test), so that a passing run shows it.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "helper_probe_tells_present_from_absent: SKIPPED: needs root: the probe loads \
                 eBPF programs (CAP_BPF, CAP_NET_ADMIN) (run the tests as root: cargo xtask test)"
            );
            return;
        }
        let h = |t, a, h| {
            helper_available(t, a, h)
                .map_err(|e| format!("{e:?}"))
                .unwrap()
        };
        assert!(h(PROG_SK_MSG, ATTACH_SK_MSG_VERDICT, 71));
        // bpf_msg_redirect_hash is an sk_msg helper, not a sock_ops one.
        assert!(!h(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 71));
        // bpf_load_hdr_opt is a sock_ops helper, not an sk_msg one; no kernel has helper 9999.
        assert!(h(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 142));
        assert!(!h(PROG_SK_MSG, ATTACH_SK_MSG_VERDICT, 142));
        assert!(!h(PROG_SOCK_OPS, ATTACH_SOCK_OPS, 9999));
        // A program type that does not exist.
        assert!(!prog_available(9999, 0)
            .map_err(|e| format!("{e:?}"))
            .unwrap());
        let all = probe().unwrap();
        let missing: Vec<_> = all.iter().filter(|p| !p.available).collect();
        assert!(
            missing.is_empty(),
            "this kernel ({}) lacks {missing:?}",
            kernel_release()
        );
    }
}
