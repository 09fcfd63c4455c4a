//! Parity throughput of every kernel this CPU runs, in cache and streaming.
//!
//! ```text
//! cargo run --release -p cairn-md --example pq_bench [-- DATA_BLOCKS [SECONDS]]
//! pq_bench rate KERNEL|best NDATA CHUNK cache|stream SECONDS   one number: GB/s
//! pq_bench pair NDATA CHUNK cache|stream SECONDS KERNEL...   beside ISA-L, in-process
//! pq_bench verify FILE NDATA LEN                             P/Q against ISA-L's
//! pq_bench kernels [best]                                    kernels this CPU runs
//! ```
//!
//! The first form is an overview of every kernel and operation. `rate` and `verify` are
//! the cairn half of bench/pq/run.sh, which sets them beside ISA-L's `pq_gen` (the
//! `isal_pq` program there): `rate` allocates, fills and walks the stripes exactly as
//! `isal_pq rate` does (see the comment at the top of bench/pq/isal_pq.c), and `verify`
//! reads a stripe `isal_pq dump` wrote (data blocks, P, Q) and checks that every kernel
//! computes the same P and Q byte for byte. `pair` loads ISA-L (`libisal.so.2`) at run
//! time and alternates it with the kernels pass by pass on the very same buffers, so
//! the two sides of each round's ratio are timed moments apart and a noisy machine
//! disturbs it far less than it disturbs separate processes.
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

/// Working set of `rate … stream`: far past the last-level cache.
const STREAM_MIN: usize = 256 << 20;
/// Data consumed per timed pass of `rate … cache`, so the clock is read rarely.
const CACHE_PASS: usize = 4 << 20;

fn usage() -> ! {
    eprintln!(
        "usage: pq_bench [DATA_BLOCKS [SECONDS]]\n\
         \x20      pq_bench rate KERNEL|best NDATA CHUNK cache|stream SECONDS\n\
         \x20      pq_bench pair NDATA CHUNK cache|stream SECONDS KERNEL|best...\n\
         \x20      pq_bench verify FILE NDATA LEN\n\
         \x20      pq_bench kernels [best]"
    );
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(s: Option<String>, what: &str) -> T {
    let s = s.unwrap_or_else(|| usage());
    s.parse().unwrap_or_else(|_| {
        eprintln!("pq_bench: bad {what} '{s}'");
        std::process::exit(2)
    })
}

/// A byte count with an optional K or M suffix, as `isal_pq` takes it.
fn size_arg(s: Option<String>, what: &str) -> usize {
    let s = s.unwrap_or_else(|| usage());
    let (num, shift) = match s.strip_suffix(['K', 'k']) {
        Some(n) => (n, 10),
        None => match s.strip_suffix(['M', 'm']) {
            Some(n) => (n, 20),
            None => (s.as_str(), 0),
        },
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 => n << shift,
        _ => {
            eprintln!("pq_bench: bad {what} '{s}'");
            std::process::exit(2)
        }
    }
}

fn kernel_arg(s: Option<String>) -> Parity {
    let name: String = arg(s, "kernel");
    let imp = if name == "best" {
        Impl::best()
    } else {
        Impl::ALL
            .into_iter()
            .find(|i| i.name() == name)
            .unwrap_or_else(|| {
                eprintln!("pq_bench: unknown kernel '{name}'");
                std::process::exit(2)
            })
    };
    Parity::with_impl(imp).unwrap_or_else(|| {
        eprintln!("pq_bench: this CPU does not run {}", imp.name());
        std::process::exit(2)
    })
}

/// A zeroed buffer of `len` bytes starting on a 64-byte boundary, as `isal_pq` gets
/// from `posix_memalign`: the backing `Vec` and the offset into it.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 64];
    let off = v.as_ptr().align_offset(64);
    (v, off)
}

/// One stripe of the region: data chunks in syndrome-slot order, then P, then Q.
struct Stripe<'a> {
    data: Vec<&'a [u8]>,
    p: &'a mut [u8],
    q: &'a mut [u8],
}

/// Fills data chunk `j` of stripe `s` of `region` from seed `s*256 + j + 1`, as
/// `isal_pq` does, and zeroes P and Q.
fn fill_stripes(region: &mut [u8], ndata: usize, chunk: usize) {
    for (s, stripe) in region.chunks_exact_mut((ndata + 2) * chunk).enumerate() {
        let (data, pq) = stripe.split_at_mut(ndata * chunk);
        for (j, d) in data.chunks_exact_mut(chunk).enumerate() {
            d.copy_from_slice(&fill(chunk, (s * 256 + j + 1) as u64));
        }
        pq.fill(0);
    }
}

/// Splits `region` into stripes of `ndata` data chunks + P + Q.
fn stripes(region: &mut [u8], ndata: usize, chunk: usize) -> Vec<Stripe<'_>> {
    region
        .chunks_exact_mut((ndata + 2) * chunk)
        .map(|stripe| {
            let (data, pq) = stripe.split_at_mut(ndata * chunk);
            let data: &[u8] = data;
            let (p, q) = pq.split_at_mut(chunk);
            Stripe {
                data: data.chunks_exact(chunk).collect(),
                p,
                q,
            }
        })
        .collect()
}

/// The region `rate` and `pair` walk, as `isal_pq rate` lays it out.
struct Region {
    ndata: usize,
    chunk: usize,
    stream: bool,
    /// gen_pq calls per pass: every stripe once, or stripe 0 repeatedly.
    calls: usize,
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl Region {
    fn new(ndata: usize, chunk: usize, mode: &str) -> Region {
        let stream = match mode {
            "stream" => true,
            "cache" => false,
            _ => usage(),
        };
        if !(2..=253).contains(&ndata) || !chunk.is_multiple_of(64) || chunk > 1 << 30 {
            eprintln!("pq_bench: need 2..253 data blocks and a chunk that is a multiple of 64");
            std::process::exit(2);
        }
        let stripe = (ndata + 2) * chunk;
        let count = if stream {
            STREAM_MIN.div_ceil(stripe)
        } else {
            1
        };
        let calls = if stream {
            count
        } else {
            CACHE_PASS.div_ceil(ndata * chunk)
        };
        let (buf, off) = aligned(count * stripe);
        let mut r = Region {
            ndata,
            chunk,
            stream,
            calls,
            buf,
            off,
            len: count * stripe,
        };
        fill_stripes(r.bytes(), ndata, chunk);
        r
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }

    /// Data bytes one pass consumes.
    fn pass_bytes(&self) -> usize {
        self.calls * self.ndata * self.chunk
    }

    /// One pass with a cairn kernel; returns its CPU time (the split is not timed).
    fn cairn_pass(&mut self, e: Parity) -> Duration {
        let (ndata, chunk, stream, calls) = (self.ndata, self.chunk, self.stream, self.calls);
        let mut all = stripes(self.bytes(), ndata, chunk);
        let start = thread_cpu_time();
        for c in 0..calls {
            let s = &mut all[if stream { c } else { 0 }];
            e.gen_pq(black_box(&s.data), s.p, s.q);
        }
        thread_cpu_time() - start
    }

    /// One pass with a cairn kernel, or ISA-L for `None`.
    fn pass(&mut self, e: Option<Parity>, pq_gen: PqGen) -> Duration {
        match e {
            Some(e) => self.cairn_pass(e),
            None => self.isal_pass(pq_gen),
        }
    }

    /// One pass with ISA-L's `pq_gen`; returns its CPU time.
    fn isal_pass(&mut self, pq_gen: PqGen) -> Duration {
        let (ndata, chunk, stream, calls) = (self.ndata, self.chunk, self.stream, self.calls);
        let vects = i32::try_from(ndata + 2).expect("at most 255 blocks");
        let len = i32::try_from(chunk).expect("chunk checked to be at most 1 GiB");
        // pq_gen's array: every stripe's data chunks, P, Q, in order.
        let mut ptrs: Vec<*mut libc::c_void> = self
            .bytes()
            .chunks_exact_mut(chunk)
            .map(|c| c.as_mut_ptr().cast())
            .collect();
        let start = thread_cpu_time();
        for c in 0..calls {
            let s = if stream { c } else { 0 };
            let array = ptrs[s * (ndata + 2)..].as_mut_ptr();
            // SAFETY: `array` holds ndata + 2 pointers to disjoint `chunk`-byte chunks of
            // the region, taken from `&mut self`, which nothing else touches during the
            // pass; `len` is a multiple of 64 and vects ≥ 4, as pq_gen requires (raid.h).
            let rc = unsafe { pq_gen(vects, len, array) };
            assert_eq!(rc, 0, "ISA-L pq_gen refused the stripe");
        }
        thread_cpu_time() - start
    }
}

/// ISA-L's `int pq_gen(int vects, int len, void **array)` (isa-l/raid.h).
type PqGen = unsafe extern "C" fn(i32, i32, *mut *mut libc::c_void) -> i32;

/// ISA-L's `pq_gen`, loaded at run time so that building and testing cairn never
/// needs ISA-L; only `pair` does.
fn load_isal() -> PqGen {
    // SAFETY: a NUL-terminated library name; loading ISA-L runs no initialiser with
    // preconditions.
    let lib = unsafe { libc::dlopen(c"libisal.so.2".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        eprintln!("pq_bench: cannot load libisal.so.2 (Debian: apt-get install libisal2)");
        std::process::exit(1);
    }
    // SAFETY: `lib` is a live handle (never closed); the symbol name is NUL-terminated.
    let sym = unsafe { libc::dlsym(lib, c"pq_gen".as_ptr()) };
    if sym.is_null() {
        eprintln!("pq_bench: libisal.so.2 has no pq_gen");
        std::process::exit(1);
    }
    // SAFETY: ISA-L exports pq_gen with the C signature `PqGen` spells out.
    unsafe { std::mem::transmute::<*mut libc::c_void, PqGen>(sym) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `pair`: ISA-L and the kernels in one process on one region, pass by pass. A round
/// is one pass of ISA-L and of each kernel in a random order, fresh every round (a
/// pass's place in the round, and which pass ran before it, moved its speed by a few
/// per cent when the order was fixed or merely rotated); a kernel's ratio
/// in a round is ISA-L's pass time over its own. A contender named `isal` is ISA-L
/// again: an A/A control, whose ratio shows how finely the method resolves. Prints,
/// per contender: name, median GB/s, median ratio to ISA-L, rounds (tab-separated).
fn cmd_pair(mut args: impl Iterator<Item = String>) {
    /// Rounds at least, however short SECONDS is.
    const MIN_ROUNDS: usize = 9;
    let ndata: usize = arg(args.next(), "NDATA");
    let chunk = size_arg(args.next(), "CHUNK");
    let mode: String = arg(args.next(), "mode");
    let secs: f64 = arg(args.next(), "SECONDS");
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        usage();
    }
    names.insert(0, "isal".to_owned());
    // `None` is ISA-L; contender 0 is the reference.
    let contenders: Vec<Option<Parity>> = names
        .iter()
        .map(|n| (n != "isal").then(|| kernel_arg(Some(n.clone()))))
        .collect();
    let pq_gen = load_isal();
    let mut region = Region::new(ndata, chunk, &mode);
    let bytes = region.pass_bytes() as f64;

    for &e in &contenders {
        region.pass(e, pq_gen); // warm up: page in, fill caches
    }
    let m = contenders.len();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); m];
    let start = thread_cpu_time();
    let mut rounds = 0;
    let mut order: Vec<usize> = (0..m).collect();
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    while rounds < MIN_ROUNDS || (thread_cpu_time() - start).as_secs_f64() < secs {
        // Fisher-Yates with xorshift: a fresh order every round.
        for k in (1..m).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let pick = rng % (k as u64 + 1);
            order.swap(k, usize::try_from(pick).expect("at most k"));
        }
        for &j in &order {
            times[j].push(region.pass(contenders[j], pq_gen).as_secs_f64());
        }
        rounds += 1;
    }
    for (name, ts) in names.iter().zip(&times) {
        let gbs = median(ts.iter().map(|t| bytes / t / 1e9).collect());
        let ratio = median(times[0].iter().zip(ts).map(|(i, t)| i / t).collect());
        println!("{name}\t{gbs:.3}\t{ratio:.3}\t{rounds}");
    }
}

/// `rate`: GB/s of one kernel on the buffers and walk `isal_pq rate` uses.
fn cmd_rate(mut args: impl Iterator<Item = String>) {
    let e = kernel_arg(args.next());
    let ndata: usize = arg(args.next(), "NDATA");
    let chunk = size_arg(args.next(), "CHUNK");
    let mode: String = arg(args.next(), "mode");
    let secs: f64 = arg(args.next(), "SECONDS");
    let mut region = Region::new(ndata, chunk, &mode);
    region.cairn_pass(e); // warm up: page in, fill caches
    let (mut cpu, mut passes) = (Duration::ZERO, 0u32);
    while cpu.as_secs_f64() < secs || passes < 3 {
        cpu += region.cairn_pass(e);
        passes += 1;
    }
    let gbs = f64::from(passes) * region.pass_bytes() as f64 / cpu.as_secs_f64() / 1e9;
    println!("{gbs:.3}");
}

/// `verify`: every kernel's P and Q of the stripe in FILE (ISA-L's dump) against the
/// P and Q stored there. Exits non-zero on the first difference.
fn cmd_verify(mut args: impl Iterator<Item = String>) {
    let file: String = arg(args.next(), "FILE");
    let ndata: usize = arg(args.next(), "NDATA");
    let len = size_arg(args.next(), "LEN");
    let bytes = std::fs::read(&file).unwrap_or_else(|e| {
        eprintln!("pq_bench: cannot read {file}: {e}");
        std::process::exit(1)
    });
    if bytes.len() != (ndata + 2) * len {
        eprintln!(
            "pq_bench: {file} holds {} bytes, expected {} data blocks + P + Q of {len}",
            bytes.len(),
            ndata
        );
        std::process::exit(1);
    }
    let (data, pq) = bytes.split_at(ndata * len);
    let (want_p, want_q) = pq.split_at(len);
    let data: Vec<&[u8]> = data.chunks_exact(len).collect();
    let mut bad = false;
    for imp in Impl::available() {
        let e = Parity::with_impl(imp).expect("listed as available");
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        e.gen_pq(&data, &mut p, &mut q);
        for (name, got, want) in [("P", &p, want_p), ("Q", &q, want_q)] {
            if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
                eprintln!(
                    "pq_bench: {} {name} differs from ISA-L's at byte {at} \
                     ({} data blocks of {len}): {:#04x} != {:#04x}",
                    imp.name(),
                    ndata,
                    got[at],
                    want[at]
                );
                bad = true;
            }
        }
    }
    if bad {
        std::process::exit(1);
    }
    println!(
        "{ndata} data x {len} B: P and Q of {} equal ISA-L's",
        Impl::available()
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    match args.peek().map(String::as_str) {
        Some("rate") => return cmd_rate(args.skip(1)),
        Some("verify") => return cmd_verify(args.skip(1)),
        Some("pair") => return cmd_pair(args.skip(1)),
        Some("kernels") => {
            let kernels = match args.nth(1).as_deref() {
                Some("best") => vec![Impl::best()],
                None => Impl::available(),
                Some(_) => usage(),
            };
            for k in kernels {
                println!("{}", k.name());
            }
            return;
        }
        Some("-h" | "--help") => usage(),
        _ => {}
    }
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
