//! The socket storage map type: aya-ebpf 0.2 has no `BPF_MAP_TYPE_SK_STORAGE` map whose `get`
//! may create the value, so this module declares one with the BTF map layout.
use core::ptr;

use aya_ebpf::{
    bindings::{
        bpf_map_type::BPF_MAP_TYPE_SK_STORAGE, bpf_sock, BPF_F_NO_PREALLOC,
        BPF_SK_STORAGE_GET_F_CREATE,
    },
    helpers::generated::bpf_sk_storage_get,
};

/// Socket storage (the BTF layout of aya-ebpf's `SkStorage`, with a `get` that creates on
/// demand). Not `BPF_F_CLONE`: a socket accepted from a listener that opted in gets storage at
/// ESTABLISHED only when it may become SMC-D (or later from its own setsockopt); cloning it for
/// every accepted socket cost a fallback or policy-kept connection an allocation and an RCU
/// free (the header-option callback flags, inherited by the kernel, carry the opt-in).
#[repr(C)]
pub struct SockStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_SK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}
// SAFETY: placeholder pointers patched by the loader, never dereferenced.
unsafe impl<T> Sync for SockStorage<T> {}

impl<T> SockStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    /// The storage of `sk`, created zeroed when `create`.
    ///
    /// The value is the kernel's memory of the socket, not a part of `self`; a program takes at
    /// most one reference to a socket's value at a time.
    #[expect(
        clippy::mut_from_ref,
        reason = "the value belongs to the socket, not to the map definition"
    )]
    #[inline(always)]
    pub fn get(&self, sk: *mut bpf_sock, create: bool) -> Option<&mut T> {
        if sk.is_null() {
            return None;
        }
        let flags = if create {
            BPF_SK_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        // SAFETY: the map pointer is this definition, which the loader relocates to the map;
        // `sk` is a non-null full socket from the program's context (the verifier checks the
        // type); a null value asks the kernel to zero a created entry.
        let p = unsafe {
            bpf_sk_storage_get(
                ptr::from_ref(self).cast_mut().cast(),
                sk.cast(),
                ptr::null_mut(),
                flags,
            )
        };
        // SAFETY: the helper returns null or the socket's value of `size_of::<T>()` bytes (the
        // map's BTF value type is `T`), aligned by the kernel. It lives as long as the socket,
        // which the kernel holds for the whole program run. The same socket's value may be
        // updated by another CPU meanwhile: the programs only read-modify-write whole fields
        // (flag bits, counters), as their C counterparts would.
        unsafe { p.cast::<T>().as_mut() }
    }
}
