//! The SPDY frame decoder never panics, whatever a client sends: the `cargo fuzz` target's
//! seeds (`fuzz/corpus/spdy_frames`), each with a fixed set of deterministic mutations (every
//! byte flipped, every prefix, every single-byte deletion), and arbitrary bytes.

use std::path::Path;

use bytes::BytesMut;
use kubelet_server::spdy::{FrameReader, parse_header_block};

fn exercise(data: &[u8]) {
    let mut reader = FrameReader::new();
    let mut buf = BytesMut::from(data);
    let mut frames = 0;
    while let Ok(Some(_)) = reader.decode(&mut buf) {
        frames += 1;
        assert!(frames <= data.len(), "a frame takes at least one byte");
    }
    let _ = parse_header_block(data);
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/spdy_frames");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .collect();
    assert!(out.len() >= 4, "the seed corpus is there");
    out.sort();
    out
}

#[test]
fn the_seeded_corpus_and_its_mutations_never_panic() {
    for seed in seeds() {
        exercise(&seed);
        for i in 0..seed.len() {
            exercise(&seed[..i]);
            let mut flipped = seed.clone();
            flipped[i] ^= 0xff;
            exercise(&flipped);
            let mut cut = seed.clone();
            cut.remove(i);
            exercise(&cut);
            let mut grown = seed.clone();
            grown[i] = grown[i].wrapping_add(1);
            exercise(&grown);
        }
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A fixed pseudo-random sequence (the same every run).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..512 {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        exercise(&data);
        // The same bytes behind a valid control header.
        let mut framed = vec![0x80, 0x03, 0x00, 0x01, 0x00];
        framed.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        framed.extend_from_slice(&data);
        exercise(&framed);
    }
}
