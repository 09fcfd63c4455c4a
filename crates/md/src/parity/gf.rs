//! GF(2^8) with md's polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator g = {02}
//! (`lib/raid6/mktables.c`). All tables are built at compile time.

/// The reducing polynomial, with the x^8 bit.
pub const POLY: u16 = 0x11d;

/// Multiplies by g = {02}: shift left; if bit 8 was set, XOR with 0x1d.
pub const fn mul2(a: u8) -> u8 {
    let x = (a as u16) << 1;
    let x = if x & 0x100 != 0 { x ^ POLY } else { x };
    x.to_le_bytes()[0]
}

/// Carry-less multiplication reduced by [`POLY`] (no tables; usable in `const`).
pub const fn mul(a: u8, b: u8) -> u8 {
    let mut acc = 0u8;
    let mut a = a;
    let mut b = b;
    while b != 0 {
        if b & 1 != 0 {
            acc ^= a;
        }
        a = mul2(a);
        b >>= 1;
    }
    acc
}

const fn build_exp() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut x = 1u8;
    let mut i = 0;
    while i < 255 {
        t[i] = x;
        x = mul2(x);
        i += 1;
    }
    // g^255 = g^0: lets exp(i) index 0..=255 without a modulo.
    t[255] = 1;
    t
}

const fn build_log() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[EXP[i] as usize] = i.to_le_bytes()[0];
        i += 1;
    }
    t
}

/// `EXP[i]` = g^i for i in 0..=255 (`EXP[255]` = 1).
pub const EXP: [u8; 256] = build_exp();
/// `LOG[x]` = the i with g^i = x, for x ≠ 0 (`LOG[0]` is 0 and meaningless).
pub const LOG: [u8; 256] = build_log();

/// g^e.
pub const fn exp(e: u8) -> u8 {
    EXP[e as usize]
}

/// The multiplicative inverse; `inv(0)` is 0 (md's `raid6_gfinv[0]` too).
pub const fn inv(a: u8) -> u8 {
    if a == 0 {
        return 0;
    }
    let l = LOG[a as usize] as usize;
    EXP[(255 - l) % 255]
}

/// Products of `c` with every low nibble and every high nibble: `c·x` is
/// `lo[x & 15] ^ hi[x >> 4]`. The PSHUFB multiply looks these up 16 or 32 lanes at a time.
pub const fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    let mut i = 0u8;
    while i < 16 {
        lo[i as usize] = mul(c, i);
        hi[i as usize] = mul(c, i << 4);
        i += 1;
    }
    (lo, hi)
}

/// The 8×8 bit matrix of "multiply by `c`" in the layout `GF2P8AFFINEQB` wants: output
/// bit i is the parity of (row byte 7-i AND input), and column j of the map is c·2^j.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut j = 0;
        while j < 8 {
            if (mul(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
            j += 1;
        }
        m |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_bitwise_multiply() {
        assert_eq!(
            &EXP[..10],
            &[1, 2, 4, 8, 0x10, 0x20, 0x40, 0x80, 0x1d, 0x3a]
        );
        assert_eq!(inv(2), 0x8e);
        for a in 0..=255u8 {
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 2), mul2(a));
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "{a}");
                assert_eq!(exp(LOG[usize::from(a)]), a);
            }
            let (lo, hi) = nibble_tables(a);
            for x in 0..=255u8 {
                assert_eq!(lo[usize::from(x & 15)] ^ hi[usize::from(x >> 4)], mul(a, x));
                assert_eq!(mul(a, x), mul(x, a));
            }
        }
    }
}
