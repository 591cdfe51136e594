//! Dispatch on message type: the first byte selects the type and eyecatcher, the second is the
//! header's version/type byte, the rest is the body, framed with a matching length and trailer.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let [sel, flags, body @ ..] = data {
        smc_common_fuzz::check_clc(&smc_common_fuzz::framed(*sel, *flags, body));
    }
});
