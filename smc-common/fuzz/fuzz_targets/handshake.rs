//! Arbitrary input sequences into the client and server state machines.
#![no_main]
libfuzzer_sys::fuzz_target!(|case: smc_common_fuzz::HandshakeCase| {
    smc_common_fuzz::check_handshake(&case)
});
