//! `cairn bench`: the benchmark matrix people run by hand for days (chunk x cipher x key
//! size x level x stripe cache, dd with growing block sizes, one fsync-bound job against
//! many parallel ones), built in, with a table, JSON, CSV, plots and a recommendation.
//!
//! ```text
//!   BenchArgs ─ plan() ─> [CellSpec]    (level x layout x chunk x cipher x key size x sector size
//!                                        x stripe cache; cipher "none" drops the crypt)
//!   for each cell: cell::build   scratch sparse files in a temp dir (or the given members
//!                                with --destructive) -> [DelayDisk] -> md Array
//!                                -> StripeCache -> LUKS2 (CryptDevice)
//!                  measure::run  in-process: sequential write/read, request-size sweep,
//!                                QD1 write+flush latency, QD1/QD32 4K random IOPS, CPU/GB
//!                  (--nbd: nbd::run, `cairn serve` on a private socket + fio's nbd engine)
//!   report: table on stdout, results.json, --csv, plots (plot.rs), recommend() -> advise
//! ```
//!
//! Every figure states how it was taken ("in-process" or "nbd+fio"); nothing here writes
//! to a device it did not create unless told `--destructive`.

pub mod cell;
pub mod measure;
pub mod nbd;
pub mod plot;
pub mod report;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::error::{CliError, Result};
use crate::global::Global;
use cairn_stack::size::parse_size;

pub const BENCH_LONG: &str = "\
Build candidate stacks (md RAID -> stripe cache -> LUKS2) over a matrix of settings and \
measure each one: sequential write and read throughput, a request-size sweep from 4K up to \
4 full stripes (where writes stop paying read-modify-write: the full-stripe knee), QD1 \
write+flush latency (the single job that waits for each fsync), 4K random IOPS at QD1 and \
QD32 (32 threads), and CPU seconds per GB moved.

Each list option (--level, --layout, --chunk, --cipher, --key-size, --sector-size, \
--stripe-cache) takes comma-separated values; the matrix is every combination. Cells run on sparse scratch \
files in a temporary directory (--dir, --size), which are removed afterwards. Given \
DEVICEs are used as the members instead, and every byte on them is overwritten: that \
needs --destructive.

Measurements run in-process by default (the stack without a client or server). With --nbd \
each cell is served by `cairn serve` on a private unix socket and measured by fio's nbd \
engine, so the server is measured too. The output says which.

Results: a table on stdout, results.json and plots (PNG and SVG) in --out, --csv FILE, and \
a recommendation for --workload: the chunk, stripe cache and LUKS sector size that served \
it best, with the mkfs lines for that stack (as `cairn advise` prints them). Figures taken \
on a busy machine move; compare two runs with --compare A.json B.json.";

pub const BENCH_EXAMPLES: &str = "\
Examples:
  # the default matrix: RAID6 over 4 scratch members, 64K and 512K chunks
  cairn bench --out bench-results
  # RAID5 and RAID6, three chunk sizes, with and without encryption, for a database
  cairn bench --level 5,6 --chunk 64K,256K,1M --cipher none,aes-xts-plain64 --workload db
  # RAID10 near against far and offset copies
  cairn bench --level 10 --layout n2,f2,o2 --cipher none
  # the stripe cache question: 256 against 4096 stripe heads
  cairn bench --level 6 --chunk 512K --stripe-cache 256,4096
  # disks that answer in 2 ms: see the full-stripe knee without slow disks
  cairn bench --level 6 --chunk 64K --member-latency 2ms --cipher none
  # on real disks (overwrites them!)
  cairn bench --destructive /dev/sdb /dev/sdc /dev/sdd /dev/sde
  # before/after
  cairn bench --compare before/results.json after/results.json";

/// `cairn bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Members to build the stacks on instead of scratch files; every byte on them is
    /// overwritten, so this needs --destructive
    #[arg(value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,

    /// Allow writing over the given DEVICEs
    #[arg(long)]
    pub destructive: bool,

    /// RAID levels to try (0, 1, 4, 5, 6, 10; or raid6, ...)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "6",
        value_name = "LEVEL,..."
    )]
    pub level: Vec<String>,

    /// Members per array (scratch files; with DEVICEs their count wins)
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub members: u32,

    /// md layouts to try, in mdadm's words: left-symmetric (ls), right-asymmetric (ra),
    /// ... for RAID5/6; n2, f2, o2 for RAID10. Each level takes the ones that apply to it
    /// [default: each level's own]
    #[arg(long, value_delimiter = ',', value_name = "LAYOUT,...")]
    pub layout: Vec<String>,

    /// Chunk sizes to try
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64K,512K",
        value_name = "SIZE,..."
    )]
    pub chunk: Vec<String>,

    /// Ciphers to try: aes-xts-plain64, or none (no LUKS layer)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "aes-xts-plain64",
        value_name = "CIPHER,..."
    )]
    pub cipher: Vec<String>,

    /// LUKS key sizes in bits (256: AES-128-XTS, 512: AES-256-XTS)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512",
        value_name = "BITS,..."
    )]
    pub key_size: Vec<u32>,

    /// LUKS encryption sector sizes (512 .. 4096)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096",
        value_name = "BYTES,..."
    )]
    pub sector_size: Vec<u32>,

    /// Stripe cache sizes in md's unit (stripe heads; 0: off); RAID4/5/6 only
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256",
        value_name = "N,..."
    )]
    pub stripe_cache: Vec<u32>,

    /// Request sizes of the sweep: FROM..TO, TO a size or Nx-full-stripe
    #[arg(long, default_value = "4K..4x-full-stripe", value_name = "FROM..TO")]
    pub sweep: String,

    /// Usable size of each scratch array (sparse files: only what is written takes space)
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub size: String,

    /// Seconds each measurement runs (the sweep runs half of it per request size)
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub runtime: f64,

    /// What the recommendation optimises: seq (throughput), random (4K IOPS at QD32), db
    /// (QD1 write+flush and 4K random IOPS)
    #[arg(long, default_value = "seq", value_name = "seq|random|db")]
    pub workload: String,

    /// Delay every member operation by this much (e.g. 2ms): models disks or a network
    /// below the stack, so the stack's own costs (read-modify-write) show on any machine
    #[arg(long, value_name = "DURATION")]
    pub member_latency: Option<String>,

    /// Where scratch members go [default: a new directory under $TMPDIR]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Where results.json and the plots go
    #[arg(long, default_value = "cairn-bench", value_name = "DIR")]
    pub out: PathBuf,

    /// Also write the results as CSV, one row per cell
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Measure through the real NBD path: `cairn serve` on a private socket and fio's nbd
    /// engine (needs fio)
    #[arg(long)]
    pub nbd: bool,

    /// Print a before/after table of two results.json files and exit
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    pub compare: Vec<PathBuf>,

    /// No plots (results.json, table and CSV only)
    #[arg(long)]
    pub no_plots: bool,
}

/// What the recommendation optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Seq,
    Random,
    Db,
}

impl Workload {
    fn parse(s: &str) -> Result<Workload> {
        match s.trim().to_ascii_lowercase().as_str() {
            "seq" | "sequential" | "throughput" => Ok(Workload::Seq),
            "random" | "rand" | "iops" => Ok(Workload::Random),
            "db" | "database" | "sync" => Ok(Workload::Db),
            other => Err(CliError::new(format!(
                "--workload {other}: give seq, random or db"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Seq => "seq",
            Workload::Random => "random",
            Workload::Db => "db",
        }
    }
}

/// One cell of the matrix: the settings of one stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellSpec {
    /// "raid6", ...
    pub level: String,
    pub members: u32,
    /// The md layout in mdadm's words ("left-symmetric", "f2"); `None`: the level's
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Bytes; 0 for levels without a chunk.
    pub chunk: u64,
    /// "aes-xts-plain64" or "none".
    pub cipher: String,
    /// Bits; 0 without a cipher.
    pub key_size: u32,
    /// Bytes; 0 without a cipher.
    pub sector_size: u32,
    /// md stripe heads; 0 when off or the level has no parity.
    pub stripe_cache: u32,
}

impl CellSpec {
    /// "raid6 4x64K aes-xts-plain64/512 s4096 sc256": unique within a matrix, used to
    /// name the cell in tables, plots, the recommendation and --compare.
    pub fn label(&self) -> String {
        let mut s = if self.chunk > 0 {
            format!("{} {}x{}", self.level, self.members, short_size(self.chunk))
        } else {
            format!("{} {}-way", self.level, self.members)
        };
        if let Some(l) = &self.layout {
            s += &format!(" {l}");
        }
        if self.cipher == "none" {
            s += " plain";
        } else {
            s += &format!(" {}/{} s{}", self.cipher, self.key_size, self.sector_size);
        }
        if self.stripe_cache > 0 {
            s += &format!(" sc{}", self.stripe_cache);
        }
        s
    }
}

/// The md layout `text` names at `level`: (mdadm's name for it, the superblock word);
/// `None` when the level has no such layout. Only RAID5, RAID6 and RAID10 have a choice.
pub fn layout_word(level: cairn_md::Level, text: &str) -> Option<(String, u32)> {
    use cairn_md::{Level, ParityAlgorithm, Raid10Layout};
    let t = text.trim();
    match level {
        Level::Raid5 => ParityAlgorithm::parse_raid5(t).map(|a| (a.name().to_string(), a.to_raw())),
        Level::Raid6 => ParityAlgorithm::parse(t).map(|a| (a.name().to_string(), a.to_raw())),
        Level::Raid10 => Raid10Layout::parse(&t.to_ascii_lowercase())
            .filter(|l| l.copies() >= 2)
            .map(|l| (l.short_name(), l.to_raw())),
        _ => None,
    }
}

/// "64K", "1M", "512": a size as people write chunk and request sizes.
pub fn short_size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        bytes.to_string()
    }
}

/// The parsed options that every cell shares.
#[derive(Debug, Clone)]
pub struct Plan {
    pub cells: Vec<CellSpec>,
    pub sweep_from: u64,
    /// The sweep's end: bytes, or full stripes when `sweep_stripes` is set.
    pub sweep_to: u64,
    pub sweep_stripes: bool,
    pub size: u64,
    pub runtime: Duration,
    pub workload: Workload,
    pub member_latency: Option<Duration>,
}

fn size_arg(what: &str, text: &str) -> Result<u64> {
    parse_size(text).map_err(|e| CliError::new(format!("{what}: {e}")))
}

/// "2ms", "500us", "1s", "0.5ms".
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n
        .parse()
        .map_err(|_| CliError::new(format!("{text:?} is not a duration; e.g. 2ms, 500us")))?;
    let scale = match unit.trim() {
        "s" => 1.0,
        "ms" | "" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        _ => {
            return Err(CliError::new(format!(
                "{text:?}: unknown unit; use s, ms, us or ns"
            )))
        }
    };
    let secs = n * scale;
    if !secs.is_finite() || !(0.0..=10.0).contains(&secs) {
        return Err(CliError::new(format!(
            "{text:?}: give a duration from 0 to 10 s"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl BenchArgs {
    /// The matrix and shared settings, validated: every error names the option.
    pub fn plan(&self) -> Result<Plan> {
        let mut levels = Vec::new();
        for l in &self.level {
            let level = cairn_md::Level::parse(l.trim().to_ascii_lowercase().as_str())
                .filter(|l| *l != cairn_md::Level::Linear)
                .ok_or_else(|| CliError::new(format!("--level {l}: give 0, 1, 4, 5, 6 or 10")))?;
            levels.push(level);
        }
        let members = if self.devices.is_empty() {
            self.members
        } else {
            u32::try_from(self.devices.len()).unwrap_or(u32::MAX)
        };
        let mut chunks = Vec::new();
        for c in &self.chunk {
            let b = size_arg("--chunk", c)?;
            if b < 4096 || !b.is_power_of_two() || b > (64 << 20) {
                return Err(CliError::new(format!(
                    "--chunk {c}: give a power of two from 4K to 64M"
                )));
            }
            chunks.push(b);
        }
        for c in &self.cipher {
            if c != "none" && c != "aes-xts-plain64" {
                return Err(CliError::new(format!(
                    "--cipher {c}: cairn's LUKS2 encrypts with aes-xts-plain64; give that or none"
                )));
            }
        }
        for k in &self.key_size {
            if !matches!(k, 256 | 512) {
                return Err(CliError::new(format!("--key-size {k}: give 256 or 512")));
            }
        }
        for s in &self.sector_size {
            if !matches!(s, 512 | 1024 | 2048 | 4096) {
                return Err(CliError::new(format!(
                    "--sector-size {s}: give 512, 1024, 2048 or 4096"
                )));
            }
        }
        for s in &self.stripe_cache {
            if *s > 32768 {
                return Err(CliError::new(format!(
                    "--stripe-cache {s}: give 0 (off) to 32768"
                )));
            }
        }
        for l in &self.layout {
            if !levels.iter().any(|level| layout_word(*level, l).is_some()) {
                return Err(CliError::new(format!(
                    "--layout {l}: no level of the matrix has it; RAID5/6 take left-symmetric \
                     (ls), left-asymmetric (la), right-symmetric (rs), right-asymmetric (ra), \
                     parity-first, parity-last; RAID10 nN, fN or oN (e.g. n2, f2, o2)"
                )));
            }
        }
        let mut cells: Vec<CellSpec> = Vec::new();
        for level in &levels {
            let min = match level {
                cairn_md::Level::Raid6 => 4,
                cairn_md::Level::Raid4 | cairn_md::Level::Raid5 => 3,
                _ => 2,
            };
            if members < min {
                return Err(CliError::new(format!(
                    "{} needs at least {min} members; give --members {min} or more",
                    level.name()
                )));
            }
            let parity = level.parity_members() > 0;
            let striped = *level != cairn_md::Level::Raid1;
            let mut layouts: Vec<Option<String>> = self
                .layout
                .iter()
                .filter_map(|l| layout_word(*level, l).map(|(name, _)| Some(name)))
                .collect();
            layouts.dedup();
            if layouts.is_empty() {
                layouts.push(None);
            }
            for layout in &layouts {
                for &chunk in &chunks {
                    for cipher in &self.cipher {
                        let crypt = cipher != "none";
                        for &key_size in &self.key_size {
                            for &sector_size in &self.sector_size {
                                for &sc in &self.stripe_cache {
                                    let cell = CellSpec {
                                        level: level.name().into(),
                                        members,
                                        layout: layout.clone(),
                                        chunk: if striped { chunk } else { 0 },
                                        cipher: cipher.clone(),
                                        key_size: if crypt { key_size } else { 0 },
                                        sector_size: if crypt { sector_size } else { 0 },
                                        stripe_cache: if parity { sc } else { 0 },
                                    };
                                    if !cells.contains(&cell) {
                                        cells.push(cell);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        if cells.is_empty() {
            return Err(CliError::new(
                "the matrix is empty: give at least one value to each list option",
            ));
        }
        if cells.len() > 256 {
            return Err(CliError::new(format!(
                "the matrix has {} cells; give fewer values (at most 256 cells)",
                cells.len()
            )));
        }
        let (from, to) = self.sweep.split_once("..").ok_or_else(|| {
            CliError::new(format!(
                "--sweep {}: give FROM..TO, e.g. 4K..4x-full-stripe or 4K..1M",
                self.sweep
            ))
        })?;
        let sweep_from = size_arg("--sweep", from)?;
        let (sweep_to, sweep_stripes) = match to.trim().strip_suffix("x-full-stripe") {
            Some(n) => (
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| {
                        CliError::new(format!(
                            "--sweep {}: Nx-full-stripe takes N from 1 to 64",
                            self.sweep
                        ))
                    })?,
                true,
            ),
            None => (size_arg("--sweep", to)?, false),
        };
        if sweep_from < 512 || !sweep_from.is_multiple_of(512) {
            return Err(CliError::new(format!(
                "--sweep {}: FROM must be a multiple of 512 bytes",
                self.sweep
            )));
        }
        let size = size_arg("--size", &self.size)?;
        if size < (16 << 20) {
            return Err(CliError::new(format!(
                "--size {}: give at least 16M (LUKS2 alone takes 16 MiB)",
                self.size
            )));
        }
        if !self.runtime.is_finite() || !(0.01..=3600.0).contains(&self.runtime) {
            return Err(CliError::new(format!(
                "--runtime {}: give 0.01 to 3600 seconds",
                self.runtime
            )));
        }
        Ok(Plan {
            cells,
            sweep_from,
            sweep_to,
            sweep_stripes,
            size,
            runtime: Duration::from_secs_f64(self.runtime),
            workload: Workload::parse(&self.workload)?,
            member_latency: self
                .member_latency
                .as_deref()
                .map(parse_duration)
                .transpose()?,
        })
    }
}

impl Plan {
    /// The sweep's request sizes for a stack whose full stripe is `full`: powers of two
    /// from FROM, plus the full stripe and its multiples when they are not powers of two.
    pub fn sweep_sizes(&self, full: u64, block: u64) -> Vec<u64> {
        let to = if self.sweep_stripes {
            full.max(block) * self.sweep_to
        } else {
            self.sweep_to
        };
        let from = self.sweep_from.max(block);
        let mut v = Vec::new();
        let mut s = from;
        while s <= to {
            v.push(s);
            s *= 2;
        }
        if full > 0 {
            let mut f = full;
            while f <= to {
                if f >= from && !v.contains(&f) {
                    v.push(f);
                }
                f += full;
            }
        }
        v.sort_unstable();
        v.retain(|s| s.is_multiple_of(block));
        v
    }
}

/// Progress on stderr: indicatif's bar on a terminal, plain lines otherwise (no escape
/// codes in logs).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
    started: Instant,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Progress {}/{}", self.done, self.total)
    }
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} eta {eta} (done ~{msg})",
            ) {
                b.set_style(style);
            }
            b
        });
        Progress {
            bar,
            total,
            done: 0,
            started: Instant::now(),
        }
    }

    /// One step done; `what` says what comes next.
    pub fn step(&mut self, what: &str) {
        self.done = (self.done + 1).min(self.total);
        let elapsed = self.started.elapsed().as_secs_f64();
        let left = if self.done == 0 {
            0.0
        } else {
            elapsed / self.done as f64 * (self.total - self.done) as f64
        };
        let finish = clock_after(left);
        match &self.bar {
            Some(b) => {
                b.set_message(format!("{finish} UTC; {what}"));
                b.set_position(self.done);
            }
            None => eprintln!(
                "bench: {}/{} done, about {:.0}s left (finish ~{finish} UTC); {what}",
                self.done, self.total, left
            ),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// "14:05:09": the UTC wall clock `secs` from now.
fn clock_after(secs: f64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        + Duration::from_secs_f64(secs.clamp(0.0, 1e9));
    let t = now.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

/// Runs `cairn bench`.
pub fn run(a: &BenchArgs, global: &Global) -> Result<()> {
    if !a.compare.is_empty() {
        return report::compare(&a.compare[0], &a.compare[1], global.json);
    }
    let plan = a.plan()?;
    if !a.devices.is_empty() && !a.destructive {
        return Err(CliError::new(format!(
            "cairn bench creates arrays on {} and overwrites every byte of them; if that \
             is what you want, add --destructive (without DEVICEs it uses scratch files)",
            a.devices
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if a.nbd {
        nbd::check_fio()?;
    }
    std::fs::create_dir_all(&a.out).map_err(|e| {
        CliError::new(format!(
            "cannot create the output directory {}: {e}",
            a.out.display()
        ))
    })?;
    let scratch = cell::Scratch::new(a.dir.as_deref(), &a.devices)?;
    let steps: u64 = plan.cells.iter().map(|c| measure::steps(&plan, c)).sum();
    let mut progress = Progress::new(steps);
    let mut results = Vec::new();
    for (i, spec) in plan.cells.iter().enumerate() {
        progress.step(&format!(
            "cell {}/{}: {}",
            i + 1,
            plan.cells.len(),
            spec.label()
        ));
        let r = if a.nbd {
            nbd::run_cell(&plan, spec, &scratch, &mut progress)
        } else {
            let stack = cell::build(&plan, spec, &scratch, None)?;
            let r = measure::run_cell(&plan, spec, &stack, &mut progress);
            stack.close();
            r
        };
        scratch.clear();
        results.push(r?);
    }
    progress.finish();
    let mode = if a.nbd { "nbd+fio" } else { "in-process" };
    let doc = report::Results::new(&plan, mode, results);
    let json_path = a.out.join("results.json");
    report::write_json(&doc, &json_path)?;
    if let Some(csv) = &a.csv {
        report::write_csv(&doc, csv)?;
    }
    let plots = if a.no_plots {
        Vec::new()
    } else {
        plot::all(&doc, &a.out)?
    };
    if global.json {
        println!("{}", serde_json::to_string(&doc).unwrap_or_default());
    } else {
        print!("{}", report::table(&doc));
        println!();
        print!("{}", report::recommendation_text(&doc));
        println!(
            "\nresults: {} ({mode}; figures from a loaded machine move: compare runs side by side)",
            json_path.display()
        );
        for p in plots {
            println!("plot: {}", p.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `cairn bench`'s options alone, parsed as the command line would.
    #[derive(Debug, Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(extra: &[&str]) -> BenchArgs {
        let mut v = vec!["bench"];
        v.extend_from_slice(extra);
        Bench::try_parse_from(v).expect("parses").args
    }

    #[test]
    fn the_matrix_is_every_combination_that_differs() {
        let p = args(&[
            "--level",
            "5,6",
            "--chunk",
            "64K,512K",
            "--key-size",
            "256,512",
        ])
        .plan()
        .expect("plan");
        assert_eq!(p.cells.len(), 8);
        // Without a cipher, key and sector sizes make no different cells; RAID1 has no
        // chunk and no stripe cache.
        let p = args(&[
            "--level",
            "1,6",
            "--chunk",
            "64K,512K",
            "--cipher",
            "none",
            "--key-size",
            "256,512",
            "--members",
            "4",
        ])
        .plan()
        .expect("plan");
        assert_eq!(p.cells.len(), 3);
        let labels: Vec<String> = p.cells.iter().map(CellSpec::label).collect();
        assert!(
            labels.contains(&"raid6 4x64K plain sc256".to_string()),
            "{labels:?}"
        );
        assert!(
            labels.contains(&"raid1 4-way plain".to_string()),
            "{labels:?}"
        );
    }

    #[test]
    fn layouts_go_to_the_levels_that_have_them() {
        let p = args(&[
            "--level", "5,10,0", "--layout", "ls,ra,f2", "--chunk", "64K", "--cipher", "none",
        ])
        .plan()
        .expect("plan");
        let labels: Vec<String> = p.cells.iter().map(CellSpec::label).collect();
        assert_eq!(
            labels,
            [
                "raid5 4x64K left-symmetric plain sc256",
                "raid5 4x64K right-asymmetric plain sc256",
                "raid10 4x64K f2 plain",
                "raid0 4x64K plain"
            ],
        );
        let e = args(&["--level", "6", "--layout", "n2"])
            .plan()
            .expect_err("n2 on raid6");
        assert!(e.to_string().contains("--layout n2"), "{e}");
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        for (opt, val) in [
            ("--level", "7"),
            ("--chunk", "3K"),
            ("--cipher", "aes-cbc-essiv"),
            ("--key-size", "128"),
            ("--sector-size", "8192"),
            ("--sweep", "4K"),
            ("--size", "1M"),
            ("--workload", "fast"),
            ("--member-latency", "2 parsecs"),
        ] {
            let e = args(&[opt, val]).plan().expect_err(opt).to_string();
            assert!(e.contains(opt) || e.contains(val), "{opt} {val}: {e}");
        }
        let e = args(&["--level", "6", "--members", "3"])
            .plan()
            .expect_err("3 members");
        assert!(e.to_string().contains("at least 4"), "{e}");
    }

    #[test]
    fn the_sweep_reaches_four_full_stripes_and_holds_the_full_stripe() {
        let p = args(&[]).plan().expect("plan");
        // RAID6 4 x 64K: full stripe 128K.
        let s = p.sweep_sizes(128 << 10, 4096);
        assert_eq!(s.first(), Some(&4096));
        assert_eq!(s.last(), Some(&(512 << 10)));
        assert!(s.contains(&(128 << 10)) && s.contains(&(64 << 10)));
        // RAID5 4 x 64K: full stripe 192K, not a power of two, still in the sweep.
        let s = p.sweep_sizes(192 << 10, 4096);
        assert!(
            s.contains(&(192 << 10)) && s.contains(&(768 << 10)),
            "{s:?}"
        );
        let p = args(&["--sweep", "8K..64K"]).plan().expect("plan");
        assert_eq!(
            p.sweep_sizes(128 << 10, 4096),
            vec![8 << 10, 16 << 10, 32 << 10, 64 << 10]
        );
    }

    #[test]
    fn given_members_need_destructive() {
        let a = args(&[
            "/nonexistent/a",
            "/nonexistent/b",
            "/nonexistent/c",
            "/nonexistent/d",
        ]);
        let g = Global {
            verbose: 0,
            json: false,
            max_kdf_time: None,
        };
        let e = run(&a, &g).expect_err("refused").to_string();
        assert!(
            e.contains("--destructive") && e.contains("/nonexistent/a"),
            "{e}"
        );
        assert!(!std::path::Path::new("/nonexistent/a").exists());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("2ms").expect("2ms"),
            Duration::from_millis(2)
        );
        assert_eq!(
            parse_duration("500us").expect("us"),
            Duration::from_micros(500)
        );
        assert!(parse_duration("20s").is_err());
        assert!(parse_duration("-1ms").is_err());
    }
}
