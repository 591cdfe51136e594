//! Arbitrary bytes into the CLC framing and decoder.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_common_fuzz::check_clc(data));
