//! Untrusted CDC headers and cursors against the ring arithmetic.
#![no_main]
libfuzzer_sys::fuzz_target!(|case: smc_common_fuzz::CdcCase| smc_common_fuzz::check_cdc(&case));
