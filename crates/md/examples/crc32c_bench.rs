//! CRC-32C over 64 MiB, side by side in one run: the `crc32c` crate the partial-parity
//! log now uses, against the hand-written SSE4.2 loop and byte table it replaced (kept
//! here only as the reference for this comparison). Both in 4 KiB pieces (one PPL
//! payload per partial-stripe write) and as one 64 MiB buffer.
//!
//! `cargo run --release -p cairn-md --example crc32c_bench`

use std::hint::black_box;
use std::time::Instant;

fn table(mut crc: u32, data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            #[allow(clippy::cast_possible_truncation)] // i < 256
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0x82f6_3b78 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    for &b in data {
        crc = TABLE[usize::from(crc.to_le_bytes()[0] ^ b)] ^ (crc >> 8);
    }
    crc
}

/// # Safety
/// The CPU must support SSE4.2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        c = _mm_crc32_u64(c, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut c = u32::try_from(c).expect("the instruction leaves 32 bits");
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    c
}

/// The replaced `ppl::crc32c`: SSE4.2 where the CPU has it, else the table.
fn hand_written(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE4.2, checked just above.
        return !unsafe { sse42(!0, data) };
    }
    !table(!0, data)
}

/// GiB/s of `f` over `buf` in `piece`-byte calls, one pass.
fn rate(buf: &[u8], piece: usize, f: &dyn Fn(&[u8]) -> u32) -> f64 {
    let start = Instant::now();
    let mut acc = 0u32;
    for p in buf.chunks(piece) {
        acc = acc.wrapping_add(f(black_box(p)));
    }
    black_box(acc);
    #[allow(clippy::cast_precision_loss)] // a rate for printing
    let bytes = buf.len() as f64;
    bytes / start.elapsed().as_secs_f64() / f64::from(1u32 << 30)
}

fn main() {
    let buf: Vec<u8> = (0..64u32 << 20)
        .map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    assert_eq!(crc32c::crc32c(&buf), hand_written(&buf), "same answers");
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    #[cfg(target_arch = "x86_64")]
    println!("sse4.2: {}", std::arch::is_x86_feature_detected!("sse4.2"));
    // Alternating rounds, best of each: other processes on a busy machine slow single
    // rounds, not the best one.
    let table_rate = rate(&buf[..4 << 20], 4096, &|d| !table(!0, d));
    println!("byte table (the fallback without SSE4.2), 4 MiB once: {table_rate:.2} GiB/s");
    println!(
        "{:>10} {:>14} {:>14} {:>8}",
        "piece", "hand GiB/s", "crate GiB/s", "ratio"
    );
    for piece in [4096, 64 << 20] {
        let (mut old, mut new) = (0f64, 0f64);
        for _ in 0..7 {
            old = old.max(rate(&buf, piece, &hand_written));
            new = new.max(rate(&buf, piece, &crc32c::crc32c));
        }
        println!("{piece:>10} {old:>14.2} {new:>14.2} {:>7.2}x", new / old);
    }
}
