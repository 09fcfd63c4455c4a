//! Parity throughput of every kernel this CPU runs, in cache and streaming.
//!
//! ```text
//! cargo run --release -p cairn-md --example pq_bench [-- DATA_BLOCKS [SECONDS]]
//! ```
//!
//! GB/s counts the data bytes consumed (10^9 bytes per second) per second of this
//! thread's CPU time, as ISA-L's and the kernel's raid6 benchmarks count bytes: a 6+2
//! stripe of 64 KiB chunks is 384 KiB of data.
//! "in-cache" repeats one stripe of 64 KiB chunks (working set in L2); "streaming"
//! walks 64 MiB per block, far past the last-level cache.

use std::hint::black_box;
use std::time::Duration;

use cairn_md::parity::{Impl, Parity};

fn fill(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// CPU time this thread has used. The benchmark divides by it rather than by wall
/// time, so that other processes competing for the CPU do not count against a kernel
/// (caches shared with them still do).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(
        u64::try_from(ts.tv_sec).expect("non-negative"),
        u32::try_from(ts.tv_nsec).expect("below 10^9"),
    )
}

/// Runs `f` (which consumes `bytes` of data per call) for at least `min` of CPU time,
/// returns GB/s.
fn rate(bytes: usize, min: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm up: page in, fill caches
    let start = thread_cpu_time();
    let mut calls = 0u32;
    while thread_cpu_time() - start < min || calls < 3 {
        f();
        calls += 1;
    }
    let secs = (thread_cpu_time() - start).as_secs_f64();
    f64::from(calls) * bytes as f64 / secs / 1e9
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ndata: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(6);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0.5);
    let min = Duration::from_secs_f64(secs);
    let kernels = Impl::available();
    println!(
        "cpu kernels: {}   (best: {})",
        kernels
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        Impl::best().name()
    );
    println!("{ndata} data blocks + P + Q; GB/s of data consumed\n");
    println!(
        "{:<12} {:<22} {:>10} {:>10}",
        "kernel", "operation", "in-cache", "streaming"
    );

    let small = 64usize << 10;
    let big = 64usize << 20;
    let data_small: Vec<Vec<u8>> = (0..ndata).map(|i| fill(small, i as u64 + 1)).collect();
    let data_big: Vec<Vec<u8>> = (0..ndata).map(|i| fill(big, i as u64 + 100)).collect();
    let (mut ps, mut qs) = (vec![0u8; small], vec![0u8; small]);
    let (mut pb, mut qb) = (vec![0u8; big], vec![0u8; big]);

    for imp in kernels {
        let e = Parity::with_impl(imp).expect("listed as available");
        let rs: Vec<&[u8]> = data_small.iter().map(Vec::as_slice).collect();
        let rb: Vec<&[u8]> = data_big.iter().map(Vec::as_slice).collect();

        let pq_c = rate(small * ndata, min, || {
            e.gen_pq(black_box(&rs), &mut ps, &mut qs)
        });
        let pq_s = rate(big * ndata, min, || {
            e.gen_pq(black_box(&rb), &mut pb, &mut qb)
        });
        println!(
            "{:<12} {:<22} {:>10.2} {:>10.2}",
            imp.name(),
            "gen_pq (RAID6 P+Q)",
            pq_c,
            pq_s
        );

        let p_c = rate(small * ndata, min, || e.gen_p(black_box(&rs), &mut ps));
        let p_s = rate(big * ndata, min, || e.gen_p(black_box(&rb), &mut pb));
        println!(
            "{:<12} {:<22} {:>10.2} {:>10.2}",
            "", "gen_p (RAID5 XOR)", p_c, p_s
        );

        let mut dst = vec![0u8; small];
        let m_c = rate(small, min, || {
            e.mul_xor_into(&mut dst, black_box(&data_small[0]), 0x8e)
        });
        let mut dstb = vec![0u8; big];
        let m_s = rate(big, min, || {
            e.mul_xor_into(&mut dstb, black_box(&data_big[0]), 0x8e)
        });
        println!(
            "{:<12} {:<22} {:>10.2} {:>10.2}",
            "", "mul_xor_into (c·src)", m_c, m_s
        );

        // Two data blocks lost: the full RAID6 double-failure path, in cache.
        let mut stripe: Vec<Vec<u8>> = data_small.clone();
        stripe.push(ps.clone());
        stripe.push(qs.clone());
        {
            let refs: Vec<&[u8]> = data_small.iter().map(Vec::as_slice).collect();
            let (p, q) = stripe.split_at_mut(ndata).1.split_at_mut(1);
            e.gen_pq(&refs, &mut p[0], &mut q[0]);
        }
        let r_c = rate(small * ndata, min, || {
            let mut refs: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
            e.recover_pq(&mut refs, &[0, ndata / 2])
                .expect("two data blocks");
        });
        assert_eq!(stripe[0], data_small[0], "recovery gave wrong data");
        println!(
            "{:<12} {:<22} {:>10.2} {:>10}",
            "", "recover 2 data", r_c, "-"
        );
    }
}
