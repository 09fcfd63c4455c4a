//! LVM2's checksum (`lib/misc/crc.c` `calc_crc`, ondisk-formats.md §4.4): the reflected
//! CRC-32 (polynomial 0xEDB88320) with the register started at 0xf597a6cf and no final
//! XOR. Labels, mda headers and metadata texts all use it.

/// The register's starting value.
pub const INITIAL_CRC: u32 = 0xf597_a6cf;

const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i: u32 = 0;
    while i < 256 {
        let mut c = i;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i as usize] = c;
        i += 1;
    }
    t
};

/// Continues a CRC over `data`, starting from register value `initial`.
pub fn calc_crc(initial: u32, data: &[u8]) -> u32 {
    data.iter().fold(initial, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// The CRC of `data` as LVM computes it.
pub fn crc(data: &[u8]) -> u32 {
    calc_crc(INITIAL_CRC, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_values() {
        assert_eq!(crc(b""), 0xf597_a6cf);
        assert_eq!(crc(b"123456789"), 0x4991_cf02);
        // Continuing over two pieces equals one pass (wrapped metadata texts).
        assert_eq!(calc_crc(crc(b"1234"), b"56789"), 0x4991_cf02);
    }
}
