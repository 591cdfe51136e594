//! Hostile bytes into the statistics file parser and the fold into an aggregate.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_common_fuzz::check_procstats(data));
