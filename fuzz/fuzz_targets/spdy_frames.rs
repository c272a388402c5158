//! Fuzz the SPDY/3.1 frame decoder of `kubelet-server` (frames, header blocks, the zlib
//! context): whatever a client sends, decoding ends in frames or an error, never a panic or an
//! unbounded allocation. Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run spdy_frames`. The
//! seeds in `corpus/spdy_frames` also run, with fixed mutations, in `cargo test -p
//! kubelet-server --test spdy_no_panic`.
#![no_main]

use kubelet_server::spdy::{FrameReader, parse_header_block};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::new();
    let mut buf = bytes::BytesMut::from(data);
    while let Ok(Some(_)) = reader.decode(&mut buf) {}
    let _ = parse_header_block(data);
});
