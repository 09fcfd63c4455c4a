//! Portable kernels: eight bytes at a time in a `u64` (SWAR), bytes at the tail.
//! These define the results; every SIMD kernel is tested against them.

use super::gf;

const ONES: u64 = 0x0101_0101_0101_0101;

/// Multiplies each of the eight bytes by g: shift each byte left, and XOR 0x1d into
/// the bytes whose top bit was set.
#[inline(always)]
fn mul2_x8(v: u64) -> u64 {
    let top = (v >> 7) & ONES;
    ((v << 1) & (0xfe * ONES)) ^ (top * 0x1d)
}

#[inline(always)]
fn load(s: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(s[i..i + 8].try_into().expect("8 bytes"))
}

#[inline(always)]
fn store(s: &mut [u8], i: usize, v: u64) {
    s[i..i + 8].copy_from_slice(&v.to_ne_bytes());
}

/// P = XOR of `data` from byte `from` on.
pub fn gen_p(data: &[&[u8]], p: &mut [u8], from: usize) {
    let len = p.len();
    let mut i = from;
    while i + 8 <= len {
        let mut acc = 0u64;
        for d in data {
            acc ^= load(d, i);
        }
        store(p, i, acc);
        i += 8;
    }
    for j in i..len {
        p[j] = data.iter().fold(0, |acc, d| acc ^ d[j]);
    }
}

/// P and Q (Horner: start with the highest slot, `q = g·q ^ D` downwards) from byte
/// `from` on. `data` must not be empty.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8], from: usize) {
    let len = p.len();
    let (top, rest) = data.split_last().expect("at least one data block");
    let mut i = from;
    // Four words per step keep four independent dependency chains in flight.
    while i + 32 <= len {
        let mut wp = [
            load(top, i),
            load(top, i + 8),
            load(top, i + 16),
            load(top, i + 24),
        ];
        let mut wq = wp;
        for d in rest.iter().rev() {
            for k in 0..4 {
                let w = load(d, i + 8 * k);
                wp[k] ^= w;
                wq[k] = mul2_x8(wq[k]) ^ w;
            }
        }
        for k in 0..4 {
            store(p, i + 8 * k, wp[k]);
            store(q, i + 8 * k, wq[k]);
        }
        i += 32;
    }
    while i + 8 <= len {
        let mut wp = load(top, i);
        let mut wq = wp;
        for d in rest.iter().rev() {
            let w = load(d, i);
            wp ^= w;
            wq = mul2_x8(wq) ^ w;
        }
        store(p, i, wp);
        store(q, i, wq);
        i += 8;
    }
    for j in i..len {
        let mut bp = top[j];
        let mut bq = bp;
        for d in rest.iter().rev() {
            bp ^= d[j];
            bq = gf::mul2(bq) ^ d[j];
        }
        p[j] = bp;
        q[j] = bq;
    }
}

/// `dst ^= src` from byte `from` on.
pub fn xor_into(dst: &mut [u8], src: &[u8], from: usize) {
    let len = dst.len();
    let mut i = from;
    while i + 8 <= len {
        let v = load(dst, i) ^ load(src, i);
        store(dst, i, v);
        i += 8;
    }
    for j in i..len {
        dst[j] ^= src[j];
    }
}

fn product_table(c: u8) -> [u8; 256] {
    let mut t = [0u8; 256];
    for (x, out) in (0..=255u8).zip(t.iter_mut()) {
        *out = gf::mul(c, x);
    }
    t
}

/// `dst ^= c·src` from byte `from` on.
pub fn mul_xor_into(dst: &mut [u8], src: &[u8], c: u8, from: usize) {
    let t = product_table(c);
    for (d, s) in dst[from..].iter_mut().zip(&src[from..]) {
        *d ^= t[usize::from(*s)];
    }
}

/// `buf = c·buf` from byte `from` on.
pub fn mul_in_place(buf: &mut [u8], c: u8, from: usize) {
    let t = product_table(c);
    for b in &mut buf[from..] {
        *b = t[usize::from(*b)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swar_mul2_is_bytewise_mul2() {
        for a in 0..=255u8 {
            let v = u64::from_ne_bytes([a, a ^ 0x80, 0, 0xff, 1, 0x80, a.wrapping_mul(7), 0x8e]);
            let want: Vec<u8> = v.to_ne_bytes().iter().map(|&b| gf::mul2(b)).collect();
            assert_eq!(mul2_x8(v).to_ne_bytes().to_vec(), want);
        }
    }
}
