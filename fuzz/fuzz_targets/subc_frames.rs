#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| broca_crash_tests::fuzz::subc_frames(data));
