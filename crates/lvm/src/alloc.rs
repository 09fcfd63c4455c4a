//! Extent allocation, with lvm's accounting: a PV's free extents are `pe_count` minus the
//! extents LV segments use; only `ALLOCATABLE` PVs give space.
//!
//! ```text
//!   linear   1. extend: the free run right after the LV's last extent (merged segment)
//!            2. the first free run, in PV order, that holds everything
//!            3. otherwise free runs in PV order, each used up, until done
//!   striped  k runs on k distinct PVs, each n/k extents (per round: each PV offers its
//!            largest run; with more candidates than k the largest win, else PV order);
//!            a round that cannot give n/k on each makes a shorter segment and repeats
//! ```

use cairn_block::{Error, ErrorKind, Result};

use crate::meta::VolumeGroup;

/// Free runs `(first pe, count)` per PV key, in the VG's PV order.
#[derive(Debug, Clone)]
pub struct FreeMap {
    pub pvs: Vec<(String, Vec<(u64, u64)>)>,
}

/// One allocated run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub pv: String,
    pub pe: u64,
    pub count: u64,
}

impl FreeMap {
    pub fn of(vg: &VolumeGroup) -> Result<FreeMap> {
        let used = vg.used_extents()?;
        let mut pvs = Vec::new();
        for p in &vg.pvs {
            let mut runs = Vec::new();
            if p.allocatable() {
                let mut at = 0u64;
                for (first, count, _) in &used[&p.key] {
                    if *first > at {
                        runs.push((at, first - at));
                    }
                    at = at.max(first + count);
                }
                if p.pe_count > at {
                    runs.push((at, p.pe_count - at));
                }
            }
            pvs.push((p.key.clone(), runs));
        }
        Ok(FreeMap { pvs })
    }

    pub fn free(&self) -> u64 {
        self.pvs.iter().flat_map(|(_, r)| r).map(|r| r.1).sum()
    }

    pub fn free_on(&self, key: &str) -> u64 {
        self.pvs
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, r)| r)
            .map(|r| r.1)
            .sum()
    }

    fn take(&mut self, key: &str, pe: u64, count: u64) {
        for (k, runs) in &mut self.pvs {
            if k != key {
                continue;
            }
            let mut out = Vec::new();
            for &(s, n) in runs.iter() {
                let e = s + n;
                if pe + count <= s || pe >= e {
                    out.push((s, n));
                    continue;
                }
                if pe > s {
                    out.push((s, pe - s));
                }
                if pe + count < e {
                    out.push((pe + count, e - pe - count));
                }
            }
            *runs = out;
        }
    }

    /// Allocates `n` extents for a linear mapping; `after` is `(pv, pe)` just past the
    /// LV's current last extent when extending.
    pub fn linear(&mut self, n: u64, after: Option<(&str, u64)>) -> Result<Vec<Run>> {
        if n > self.free() {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "insufficient free space: {n} extents needed, but only {} available",
                    self.free()
                ),
            ));
        }
        let mut out = Vec::new();
        let mut left = n;
        if let Some((pv, pe)) = after {
            let hit = self
                .pvs
                .iter()
                .filter(|(k, _)| k == pv)
                .flat_map(|(_, r)| r)
                .find(|r| r.0 == pe)
                .copied();
            if let Some((s, c)) = hit {
                let take = c.min(left);
                out.push(Run {
                    pv: pv.to_string(),
                    pe: s,
                    count: take,
                });
                self.take(pv, s, take);
                left -= take;
            }
        }
        if left > 0 {
            let whole = self
                .pvs
                .iter()
                .flat_map(|(k, r)| r.iter().map(move |r| (k.clone(), *r)))
                .find(|(_, r)| r.1 >= left);
            if let Some((k, (s, _))) = whole {
                out.push(Run {
                    pv: k.clone(),
                    pe: s,
                    count: left,
                });
                self.take(&k, s, left);
                left = 0;
            }
        }
        while left > 0 {
            let (k, (s, c)) = self
                .pvs
                .iter()
                .flat_map(|(k, r)| r.iter().map(move |r| (k.clone(), *r)))
                .next()
                .expect("free() said there is enough");
            let take = c.min(left);
            out.push(Run {
                pv: k.clone(),
                pe: s,
                count: take,
            });
            self.take(&k, s, take);
            left -= take;
        }
        Ok(out)
    }

    /// Allocates `per_stripe` extents on each of `k` distinct PVs; returns rounds, each
    /// `k` runs of equal length.
    pub fn striped(&mut self, per_stripe: u64, k: usize) -> Result<Vec<Vec<Run>>> {
        let allocatable = self.pvs.iter().filter(|(_, r)| !r.is_empty()).count();
        if k > allocatable {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!("{k} stripes need {k} PVs with free space, but the VG has {allocatable}"),
            ));
        }
        let total_free = self.free();
        let mut rounds = Vec::new();
        let mut left = per_stripe;
        while left > 0 {
            let mut cands: Vec<(usize, String, u64, u64)> = self
                .pvs
                .iter()
                .enumerate()
                .filter_map(|(i, (key, runs))| {
                    // The PV's largest run (the first of equal ones).
                    runs.iter()
                        .fold(None, |best: Option<(u64, u64)>, r| match best {
                            Some(b) if b.1 >= r.1 => Some(b),
                            _ => Some(*r),
                        })
                        .map(|(s, c)| (i, key.clone(), s, c))
                })
                .collect();
            if cands.len() < k {
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    format!(
                        "insufficient free space for {k} stripes of {per_stripe} extents: only {} of \
                         them fit on distinct PVs ({total_free} extents free in all)",
                        per_stripe - left
                    ),
                ));
            }
            if cands.len() > k {
                // Largest first; the sort is stable, so PV order breaks ties.
                cands.sort_by_key(|c| std::cmp::Reverse(c.3));
                cands.truncate(k);
                cands.sort_by_key(|c| c.0);
            }
            let len = cands.iter().map(|c| c.3).min().unwrap_or(0).min(left);
            if len == 0 {
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    "insufficient free space for the stripes",
                ));
            }
            let round: Vec<Run> = cands
                .iter()
                .map(|(_, key, s, _)| Run {
                    pv: key.clone(),
                    pe: *s,
                    count: len,
                })
                .collect();
            for r in &round {
                self.take(&r.pv, r.pe, len);
            }
            rounds.push(round);
            left -= len;
        }
        Ok(rounds)
    }

    /// Whether `count` extents from `pe` on `pv` are free.
    pub fn is_free(&self, pv: &str, pe: u64, count: u64) -> bool {
        self.pvs
            .iter()
            .filter(|(k, _)| k == pv)
            .flat_map(|(_, r)| r)
            .any(|&(s, c)| s <= pe && pe + count <= s + c)
    }

    /// Takes `n` extents from PV `key` alone, its lowest free runs first; `None` (and
    /// nothing taken) if it has fewer free.
    pub fn on_pv(&mut self, key: &str, n: u64) -> Option<Vec<Run>> {
        if self.free_on(key) < n {
            return None;
        }
        let runs: Vec<(u64, u64)> = self
            .pvs
            .iter()
            .filter(|(k, _)| k == key)
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let mut out = Vec::new();
        let mut left = n;
        for (s, c) in runs {
            if left == 0 {
                break;
            }
            let take = c.min(left);
            out.push(Run {
                pv: key.to_string(),
                pe: s,
                count: take,
            });
            left -= take;
        }
        for r in &out {
            self.take(key, r.pe, r.count);
        }
        Some(out)
    }

    /// PV keys in VG order.
    pub fn pv_keys(&self) -> Vec<String> {
        self.pvs.iter().map(|(k, _)| k.clone()).collect()
    }

    pub fn take_run(&mut self, pv: &str, pe: u64, count: u64) {
        self.take(pv, pe, count);
    }
}
