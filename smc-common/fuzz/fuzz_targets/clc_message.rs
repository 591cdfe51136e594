//! Dispatch on message type: the first byte selects type, version, SMC types and eyecatcher,
//! the rest is the body, framed with a matching length and trailer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&sel, body)) = data.split_first() {
        smc_common_fuzz::check_clc(&smc_common_fuzz::framed(sel, body));
    }
});
