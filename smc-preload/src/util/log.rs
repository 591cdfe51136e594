//! `SMC_DEBUG=1`: one line per decision on stderr.

use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(255);

pub fn enabled() -> bool {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != 255 {
        return l > 0;
    }
    let on = crate::util::config::config().debug;
    LEVEL.store(on as u8, Ordering::Relaxed);
    on
}

/// Write one line to fd 2 with the real `write` (never through our own interposition).
pub fn emit(args: std::fmt::Arguments<'_>) {
    let s = format!("smc-preload[{}]: {}\n", crate::pid(), args);
    let e0 = crate::real::errno();
    // SAFETY: valid buffer.
    unsafe { crate::real::write(2, s.as_ptr() as *const libc::c_void, s.len()) };
    crate::real::set_errno(e0);
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::log::enabled() {
            $crate::log::emit(format_args!($($t)*));
        }
    };
}
